"""WebShop env speed: search latency over the 1k catalogue and steps/s of a scripted episode mix.

    python benchmarks/webshop_throughput.py [--data-dir DIR] [--episodes 300] [--queries 1000]

Search: every query (goal instructions, product titles, short keyword queries) is timed end to
end (analyzer + BM25 + ranking, the 50 ASINs a results page draws from). Baseline, measured in the
same run: a plain-Python BM25 over the same terms with the same formula (postings in dicts,
scores summed per document) - it shows what the sparse ``bm25s`` index buys. Target: well under
10 ms per search.

Steps/s: a fixed, seeded mix of three episode kinds through ``gymnasium.make`` (wrappers
included): the oracle (search, open the product, choose options, buy: ends with WebShop's
reward), a browser (random admissible clicks: pages, sub-pages, back), and a fumbler (malformed
and unknown actions mixed with valid ones). Baseline, same run: a trivial text env that only
echoes, stepped the same number of times through the same wrappers (the floor any env pays).
spaCy's one-time model load happens before timing starts and is reported apart.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections import defaultdict
from typing import Any


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class PlainBM25:
    """The baseline: Lucene's BM25 (same analyzer, same length code) in plain Python."""

    def __init__(self, doc_ids: list[str], contents: list[str], analyzer: Any) -> None:
        from crl_bench.envs.webshop.search import BM25_B, BM25_K1, lucene_length

        self.doc_ids = doc_ids
        self.analyzer = analyzer
        docs = [analyzer(t) for t in contents]
        n = len(docs)
        avgdl = sum(len(d) for d in docs) / n
        self.postings: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for i, terms in enumerate(docs):
            norm = BM25_K1 * (1 - BM25_B + BM25_B * lucene_length(len(terms)) / avgdl)
            counts: dict[str, int] = defaultdict(int)
            for t in terms:
                counts[t] += 1
            for t, tf in counts.items():
                self.postings[t].append((i, tf / norm))
        self.idf = {t: math.log1p((n - len(p) + 0.5) / (len(p) + 0.5)) for t, p in self.postings.items()}

    def search(self, query: str, k: int = 50) -> list[str]:
        scores: dict[int, float] = defaultdict(float)
        for term in self.analyzer(query):
            idf = self.idf.get(term)
            if idf is None:
                continue
            for doc, x in self.postings[term]:
                scores[doc] += idf - idf / (1 + x)
        best = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        return [self.doc_ids[i] for i, _ in best]


def bench_search(data: Any, n_queries: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    goals = data.goals("synthetic")
    titles = [p["Title"] for p in data.products]
    pool = ([g.instruction_text for g in goals[:500]] + titles
            + [g.query for g in goals[:500]])
    queries = [rng.choice(pool).lower() for _ in range(n_queries)]
    engine = data.search
    for q in queries[:20]:
        engine.search(q)  # warm caches

    ours = []
    for q in queries:
        t0 = time.perf_counter()
        engine.search(q)
        ours.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    plain = PlainBM25(data.doc_ids, data.contents, engine.analyzer)
    plain_build = time.perf_counter() - t0
    baseline = []
    agree = 0
    for q in queries:
        t0 = time.perf_counter()
        res = plain.search(q)
        baseline.append((time.perf_counter() - t0) * 1000)
        agree += res[:10] == engine.search(q)[:10]
    return {"mean_ms": statistics.mean(ours), "p50_ms": percentile(ours, 0.5),
            "p95_ms": percentile(ours, 0.95), "max_ms": max(ours),
            "baseline_mean_ms": statistics.mean(baseline), "baseline_build_s": plain_build,
            "top10_agreement": agree / len(queries)}


def run_mix(env: Any, episodes: int, seed: int) -> tuple[int, float, dict[str, list[float]]]:
    from crl_bench.envs.webshop.oracle import WebShopOracle

    rng = random.Random(seed)
    oracle = WebShopOracle(env)
    task_ids = env.unwrapped.task_ids()
    junk = ["click[", "search[]", "click[nothing here]", "]]][[[", "buy it", "x" * 200]
    steps = 0
    per_kind: dict[str, list[float]] = defaultdict(list)
    t_all = time.perf_counter()
    for ep in range(episodes):
        kind = ("oracle", "browser", "fumbler")[ep % 3]
        _obs, info = env.reset(seed=ep, options={"task_id": rng.choice(task_ids)})
        done = False
        while not done:
            if kind == "oracle":
                action = oracle.act(info)
            elif info["page"] == "search":
                action = f"search[{env.unwrapped.goal.query}]"
            elif kind == "browser":
                pool = [a for a in info["admissible_actions"] if a != "click[buy now]"] or ["click[buy now]"]
                action = rng.choice(pool)
            else:
                action = rng.choice(junk) if rng.random() < 0.5 else rng.choice(info["admissible_actions"])
            t0 = time.perf_counter()
            _obs, _r, terminated, truncated, info = env.step(action)
            per_kind[kind].append(time.perf_counter() - t0)
            steps += 1
            done = terminated or truncated
    return steps, time.perf_counter() - t_all, per_kind


def bench_baseline_env(n_steps: int) -> float:
    """Steps/s of an echo env through the same gymnasium wrappers."""
    import gymnasium

    from crl_bench.text_env import TextEnv

    class EchoEnv(TextEnv):
        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return "start", self.make_info(goal="", admissible_actions=["noop"], success=False,
                                           score=0.0, action_valid=True, task_id="0")

        def step(self, action):
            info = self.make_info(goal="", admissible_actions=["noop"], success=False, score=0.0,
                                  action_valid=True, task_id="0")
            return str(action), 0.0, False, False, info

    env = gymnasium.wrappers.OrderEnforcing(gymnasium.wrappers.PassiveEnvChecker(EchoEnv(max_steps=15)))
    env.reset(seed=0)
    t0 = time.perf_counter()
    for _ in range(n_steps):
        env.step("noop")
    return n_steps / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=None, help="WebShop data folder (default: env vars)")
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import gymnasium

    import crl_bench  # noqa: F401
    from crl_bench.envs.webshop.reward import title_nouns

    t0 = time.perf_counter()
    env = gymnasium.make("crl/WebShop-v0", split="test", data_dir=args.data_dir)
    make_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    title_nouns("warm up the spaCy model")
    spacy_s = time.perf_counter() - t0
    data = env.unwrapped.data
    print(f"env ready in {make_s:.2f} s (index {'loaded from cache' if data.search.loaded_from_cache else 'built'}); "
          f"spaCy model loaded in {spacy_s:.2f} s (once per process)")

    s = bench_search(data, args.queries, args.seed)
    print(f"\nsearch over {len(data.doc_ids)} products, {args.queries} queries:")
    print(f"  ours (bm25s sparse index): mean {s['mean_ms']:.3f} ms  p50 {s['p50_ms']:.3f}  "
          f"p95 {s['p95_ms']:.3f}  max {s['max_ms']:.3f}   (target < 10 ms: "
          f"{'met' if s['p95_ms'] < 10 else 'MISSED'})")
    print(f"  baseline (plain-Python BM25): mean {s['baseline_mean_ms']:.3f} ms  "
          f"-> ours is {s['baseline_mean_ms'] / s['mean_ms']:.1f}x faster; "
          f"same top 10 on {100 * s['top10_agreement']:.1f}% of queries")

    steps, seconds, per_kind = run_mix(env, args.episodes, args.seed)
    base = bench_baseline_env(max(steps, 1000))
    ours = steps / seconds
    print(f"\nscripted mix: {args.episodes} episodes, {steps} steps in {seconds:.2f} s "
          f"-> {ours:.0f} steps/s")
    for kind, times in per_kind.items():
        print(f"  {kind:8s} {len(times):5d} steps  mean {1000 * statistics.mean(times):.3f} ms/step  "
              f"max {1000 * max(times):.2f} ms")
    print(f"  baseline echo env through the same wrappers: {base:.0f} steps/s "
          f"-> a WebShop step costs {base / ours:.1f} echo steps")


if __name__ == "__main__":
    main()
