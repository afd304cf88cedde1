"""Experience bank speed: hnswlib ANN search vs brute-force cosine, measured in the same run.

For each bank size (default 20k and 200k entries) it reports:
- p50 / p99 latency of one 32-query batch, top-1: search only, and with the query embedding
  (all-MiniLM-L6-v2 on synthetic goal texts);
- recall@1 of ANN against exact brute force;
- throughput with 8 reader threads (32-query batches) + 1 writer thread adding entries (FIFO at
  capacity, so every add also evicts), and with the 8 readers alone.

Data: entries are random unit vectors at the embedder's dimension (384), which is fine for the
cost of search but is the hardest case for an ANN graph (no cluster structure). Two query sets:
``near`` = a stored entry plus noise (cosine ~0.7 to it: the case where related experience
exists, the one retrieval is for) and ``random`` = unrelated unit vectors (every candidate is
about equally far; recall@1 there is a tie-break, reported for completeness).

    .venv/bin/python benchmarks/bank.py                      # 20k and 200k
    .venv/bin/python benchmarks/bank.py --sizes 20000 --ef 64 96 128 --seconds 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys

# One BLAS thread unless told otherwise: the brute-force baseline then runs on one core, like
# an hnswlib search with search_threads=1, so the two are compared on equal terms.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from crl_bench.experience.bank import ExperienceBank, IndexConfig

SUBJECTS = ["stairs", "key", "door", "monster", "shirt", "mug", "lamp", "apple", "sword",
            "microwave", "fridge", "potion", "corridor", "lava", "boots", "laptop"]
ADJECTIVES = ["red", "cheap", "locked", "hidden", "small", "wooden", "blue", "hot", "large"]
VERBS = ["find", "buy", "open", "avoid", "heat", "pick up", "put away", "reach", "clean"]
PLACES = ["kitchen", "dungeon", "shop", "bedroom", "maze", "garden", "office", "cave"]


def unit_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    v = rng.standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def near_queries(rng: np.random.Generator, base: np.ndarray, n: int, cos: float) -> np.ndarray:
    """n queries, each a random stored row plus isotropic noise so that cos(query, row) ~ cos."""
    src = base[rng.integers(0, base.shape[0], n)]
    noise = unit_rows(rng, n, base.shape[1])
    scale = float(np.sqrt(1.0 / cos**2 - 1.0))
    q = src + scale * noise
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


def goal_texts(rng: np.random.Generator, n: int) -> list[str]:
    return [f"{rng.choice(VERBS)} the {rng.choice(ADJECTIVES)} {rng.choice(SUBJECTS)} in the "
            f"{rng.choice(PLACES)} and then {rng.choice(VERBS)} the {rng.choice(SUBJECTS)} "
            f"(task {int(rng.integers(0, 10**6))})" for _ in range(n)]


SITUATIONS = ["the room is dark", "a monster is next to you", "the door is locked",
              "the item is not in the list", "the price is above the budget", "you are hungry",
              "the object is dirty", "the search returns nothing", "you hold a key",
              "the stairs are not visible", "the product has no size option", "it is too hot"]
ACTIONS = ["look around first", "step back and wait", "search the nearest container",
           "open the inventory", "compare the attributes one by one", "go back to the results",
           "pick it up before moving on", "read the goal again", "use the tool you carry",
           "try the other direction", "clean it in the sink", "check every drawer"]


def strategy_texts(rng: np.random.Generator, n: int) -> list[str]:
    """n entry-like texts ("title: content") from templates, for --data text."""
    return [f"{rng.choice(VERBS).capitalize()} the {rng.choice(SUBJECTS)}: when "
            f"{rng.choice(SITUATIONS)} in the {rng.choice(PLACES)}, {rng.choice(ACTIONS)}, then "
            f"{rng.choice(VERBS)} the {rng.choice(ADJECTIVES)} {rng.choice(SUBJECTS)} "
            f"({int(rng.integers(0, 10**6))})." for _ in range(n)]


def embed_cached(embedder, texts: list[str], cache: Path) -> np.ndarray:
    """Embeddings of ``texts`` (float32 [n, dim]), cached in ``cache`` (.npy)."""
    if cache.exists():
        vecs = np.load(cache)
        if vecs.shape[0] == len(texts):
            return vecs
    t0 = time.perf_counter()
    vecs = np.concatenate([embedder.encode(texts[i:i + 512])
                           for i in range(0, len(texts), 512)]).astype(np.float32)
    print(f"# embedded {len(texts)} texts in {time.perf_counter() - t0:.0f}s", flush=True)
    np.save(cache, vecs)
    return vecs


class BruteForce:
    """Exact cosine top-1 over a float32 matrix, with appends (the baseline for every figure)."""

    def __init__(self, vecs: np.ndarray, capacity: int) -> None:
        self.mat = np.empty((max(capacity, vecs.shape[0]) * 2, vecs.shape[1]), dtype=np.float32)
        self.mat[: vecs.shape[0]] = vecs
        self.n = vecs.shape[0]
        self.capacity = capacity
        self.start = 0  # FIFO: the oldest rows are dropped from the front
        self.lock = threading.Lock()

    def search(self, q: np.ndarray) -> np.ndarray:
        start, n = self.start, self.n
        return np.argmax(q @ self.mat[start:n].T, axis=1) + start

    def add(self, vec: np.ndarray) -> None:
        with self.lock:
            if self.n == self.mat.shape[0]:  # compact (rare)
                live = self.mat[self.start:self.n].copy()
                self.mat[: live.shape[0]] = live
                self.start, self.n = 0, live.shape[0]
            self.mat[self.n] = vec
            self.n += 1
            if self.n - self.start > self.capacity:
                self.start += 1


def build_bank(path: Path, n: int, dim: int, seed: int,
               vectors: np.ndarray | None = None) -> tuple[float, bool]:
    """Write n entries (random unit vectors, or ``vectors``) to SQLite only (the index is built
    on open). Returns (seconds, reused): a file already holding exactly these is reused."""
    marker = path.with_suffix(".built")
    if path.exists() and marker.exists() and marker.read_text() == f"{n} {dim} {seed}":
        return 0.0, True
    for suffix in ("", "-wal", "-shm"):
        p = Path(f"{path}{suffix}")
        if p.exists():
            p.unlink()
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    with ExperienceBank(path, dim=dim, capacity=n, embedder_name="random-unit-vectors",
                        build_index=False) as bank:
        chunk = 5000
        for start in range(0, n, chunk):
            m = min(chunk, n - start)
            vecs = (unit_rows(rng, m, dim) if vectors is None
                    else vectors[start:start + m])
            bank.add([{"title": f"entry {start + j}", "content": "synthetic entry for the "
                       "benchmark", "family": "bench"} for j in range(m)], vecs, step=0)
    marker.write_text(f"{n} {dim} {seed}")
    return time.perf_counter() - t0, False


def percentiles(xs: list[float]) -> tuple[float, float]:
    a = np.asarray(xs) * 1e3
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


def time_batches(fn, batches: list) -> tuple[list[float], list[float]]:
    """(wall seconds, process CPU seconds) per call. On a shared machine the wall time includes
    waiting for a core; the CPU time is what the call costs on an idle one (single-threaded)."""
    fn(batches[0])  # warm-up
    wall, cpu = [], []
    for b in batches:
        t0, c0 = time.perf_counter(), time.process_time()
        fn(b)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    return wall, cpu


def throughput(search, add, dim: int, seconds: float, readers: int, batch: int,
               with_writer: bool, seed: int) -> tuple[float, float]:
    """(queries/s of all readers, adds/s of the writer) over ``seconds``."""
    stop = threading.Event()
    counts = [0] * readers
    adds = [0]
    errors: list[BaseException] = []

    def reader(r: int) -> None:
        rng = np.random.default_rng(seed + r)
        qs = [unit_rows(rng, batch, dim) for _ in range(16)]
        j = 0
        try:
            while not stop.is_set():
                search(qs[j % 16])
                counts[r] += batch
                j += 1
        except BaseException as exc:
            errors.append(exc)

    def writer() -> None:
        rng = np.random.default_rng(seed + 999)
        try:
            while not stop.is_set():
                add(unit_rows(rng, 1, dim)[0])
                adds[0] += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(r,)) for r in range(readers)]
    if with_writer:
        threads.append(threading.Thread(target=writer))
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(counts) / seconds, adds[0] / seconds


def run_size(n: int, args: argparse.Namespace, embedder, workdir: Path) -> list[dict]:
    """Build (or reuse) a bank of n entries, open it (index rebuild), then measure latency and
    recall for every (ef_search, search_threads) pair, then throughput at the first pair."""
    dim = args.dim
    path = workdir / f"bank_{args.data}_{n}_{dim}_M{args.M}_efc{args.ef_construction}.sqlite"
    text_vecs = text_queries = None
    if args.data == "text":
        text_vecs = embed_cached(embedder, strategy_texts(np.random.default_rng(args.seed), n),
                                 workdir / f"text_entries_{n}_{args.seed}.npy")
        text_queries = embed_cached(
            embedder, goal_texts(np.random.default_rng(args.seed + 7), args.repeats * args.batch),
            workdir / f"text_queries_{args.repeats * args.batch}_{args.seed}.npy")
    write_s, reused = build_bank(path, n, dim, args.seed, text_vecs)
    cfg = IndexConfig(M=args.M, ef_construction=args.ef_construction, ef_search=args.ef[0],
                      search_threads=args.search_threads[0],
                      build_threads=args.build_threads)
    t0 = time.perf_counter()
    bank = ExperienceBank(path, dim=dim, capacity=n, index=cfg)
    open_s = time.perf_counter() - t0
    ids = np.asarray(bank.all_ids(), dtype=np.int64)
    brute = BruteForce(bank.get_embeddings(ids.tolist()), capacity=n)
    rng = np.random.default_rng(args.seed + 1)
    b = args.batch
    base = brute.mat[: brute.n]
    if text_queries is None:
        near = [near_queries(rng, base, b, args.near_cos) for _ in range(args.repeats)]
    else:  # goal texts against strategy texts, both embedded with the real embedder
        near = [text_queries[i * b:(i + 1) * b] for i in range(args.repeats)]
    rand = [unit_rows(rng, b, dim) for _ in range(args.repeats)]
    texts = [goal_texts(rng, b) for _ in range(args.embed_repeats)]

    def ann_top1(q):
        return [h[0][0] for h in bank.search(q, k=1)]

    def exact_top1(q):
        return ids[brute.search(q)].tolist()

    exact = {name: [exact_top1(q) for q in qs] for name, qs in (("near", near), ("random", rand))}
    bf_lat, bf_cpu = time_batches(exact_top1, near)
    bf_emb = (time_batches(lambda t: exact_top1(embedder.encode(t)), texts)[0]
              if embedder is not None else [float("nan")])
    rows = []
    for threads in args.search_threads:
        for ef in args.ef:
            bank.set_search_params(ef_search=ef, search_threads=threads)
            ann_lat, ann_cpu = time_batches(ann_top1, near)
            recall = {name: sum(int(a == e) for q, ex in zip(qs, exact[name])
                                for a, e in zip(ann_top1(q), ex)) / (len(qs) * b)
                      for name, qs in (("near", near), ("random", rand))}
            ann_emb = (time_batches(lambda t: ann_top1(embedder.encode(t)), texts)[0]
                       if embedder is not None else [float("nan")])
            rows.append({
                "entries": n, "dim": dim, "M": args.M, "ef_construction": args.ef_construction,
                "ef_search": ef, "search_threads": threads, "batch": b,
                "sqlite_write_s": float("nan") if reused else write_s, "open_rebuild_s": open_s,
                "ann_p50_ms": percentiles(ann_lat)[0], "ann_p99_ms": percentiles(ann_lat)[1],
                "bf_p50_ms": percentiles(bf_lat)[0], "bf_p99_ms": percentiles(bf_lat)[1],
                "ann_cpu_p50_ms": percentiles(ann_cpu)[0], "ann_cpu_p99_ms": percentiles(ann_cpu)[1],
                "bf_cpu_p50_ms": percentiles(bf_cpu)[0], "bf_cpu_p99_ms": percentiles(bf_cpu)[1],
                "ann_embed_p50_ms": percentiles(ann_emb)[0],
                "ann_embed_p99_ms": percentiles(ann_emb)[1],
                "bf_embed_p50_ms": percentiles(bf_emb)[0], "bf_embed_p99_ms": percentiles(bf_emb)[1],
                "recall1_near": recall["near"], "recall1_random": recall["random"],
            })
            print_latency(rows[-1])

    if args.seconds > 0:
        bank.set_search_params(ef_search=args.ef[0], search_threads=args.search_threads[0])

        def bank_add(vec):
            bank.add([{"title": "new", "content": "added during the benchmark",
                       "family": "bench"}], vec[None, :], step=1)

        def ann(q):
            return bank.search(q, k=1)

        thr = {"ef_search": args.ef[0], "search_threads": args.search_threads[0]}
        thr["qps_ann_readers"], _ = throughput(ann, bank_add, dim, args.seconds, args.readers, b,
                                               False, args.seed)
        thr["qps_ann_mixed"], thr["ann_adds_per_s"] = throughput(
            ann, bank_add, dim, args.seconds, args.readers, b, True, args.seed)
        thr["qps_bf_readers"], _ = throughput(brute.search, brute.add, dim, args.seconds,
                                              args.readers, b, False, args.seed)
        thr["qps_bf_mixed"], thr["bf_adds_per_s"] = throughput(
            brute.search, brute.add, dim, args.seconds, args.readers, b, True, args.seed)
        path.with_suffix(".built").unlink(missing_ok=True)  # the writer changed the bank
        thr["verify_problems"] = len(bank.verify()) if args.verify else -1
        for row in rows:
            row.update({f"throughput_{k}": v for k, v in thr.items()})
        print_throughput(thr, args.readers)
    bank.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[20_000, 200_000])
    p.add_argument("--dim", type=int, default=384, help="embedding dim (all-MiniLM-L6-v2: 384)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=200, help="32-query batches for latency/recall")
    p.add_argument("--embed-repeats", type=int, default=30)
    p.add_argument("--no-embed", action="store_true", help="skip the with-embedding latency")
    p.add_argument("--near-cos", type=float, default=0.7)
    p.add_argument("--data", choices=["random", "text"], default="random",
                   help="random unit vectors (default), or template texts embedded with the "
                        "real embedder (entries: strategies; near queries: goals)")
    p.add_argument("--ef", type=int, nargs="+", default=[IndexConfig.ef_search],
                   help="ef_search values (first value is used for throughput)")
    p.add_argument("--M", type=int, default=IndexConfig.M)
    p.add_argument("--ef-construction", type=int, default=IndexConfig.ef_construction)
    p.add_argument("--search-threads", type=int, nargs="+", default=[IndexConfig.search_threads],
                   help="hnswlib threads per batch, 0 = min(4, CPUs) (first value is used for "
                        "throughput)")
    p.add_argument("--build-threads", type=int, default=0, help="index rebuild threads (0 = all)")
    p.add_argument("--readers", type=int, default=8)
    p.add_argument("--seconds", type=float, default=5.0,
                   help="per throughput measurement (0 = skip throughput)")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="threads of the embedder (1: on a busy machine more are slower)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", type=Path, help="where bank files go (default: a temp dir)")
    p.add_argument("--verify", action="store_true", help="check table vs index at the end")
    p.add_argument("--json-out", type=Path)
    args = p.parse_args(argv)

    try:
        import torch

        torch.set_num_threads(args.torch_threads)
    except ImportError:
        pass
    embedder = None
    if args.data == "text" and args.no_embed:
        print("--data text needs the embedder (drop --no-embed)", file=sys.stderr)
        return 2
    if not args.no_embed:
        from crl_bench.experience.embedder import load_embedder

        embedder = load_embedder()
        if embedder.dim != args.dim:
            print(f"--dim {args.dim} differs from the embedder's {embedder.dim}", file=sys.stderr)
            return 2
    print(f"# bank benchmark: cpus={os.cpu_count()} load(1 min)={os.getloadavg()[0]:.1f} "
          f"dim={args.dim} batch={args.batch} data={args.data}"
          f"{f', near-query cos={args.near_cos}' if args.data == 'random' else ''}, BLAS threads={os.environ['OPENBLAS_NUM_THREADS']}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        rows = []
        for n in args.sizes:
            rows += run_size(n, args, embedder, workdir)
    if args.json_out:
        args.json_out.write_text(json.dumps(rows, indent=2))
    return 0


def print_latency(r: dict) -> None:
    print(f"\n## {r['entries']:,} entries  M={r['M']} ef_construction={r['ef_construction']}  "
          f"ef_search={r['ef_search']} search_threads={r['search_threads']}")
    write = r["sqlite_write_s"]
    print(f"build: SQLite write {'(reused)' if write != write else f'{write:.1f}s'}, "
          f"open + index rebuild {r['open_rebuild_s']:.1f}s")
    print(f"{'32-query batch, top-1':<34}{'ANN':>12}{'brute force':>14}{'speed-up':>10}")
    for label, a, bf in (("search only  p50 (ms)", "ann_p50_ms", "bf_p50_ms"),
                         ("search only  p99 (ms)", "ann_p99_ms", "bf_p99_ms"),
                         ("search only  CPU p50 (ms)", "ann_cpu_p50_ms", "bf_cpu_p50_ms"),
                         ("search only  CPU p99 (ms)", "ann_cpu_p99_ms", "bf_cpu_p99_ms"),
                         ("with embedding p50 (ms)", "ann_embed_p50_ms", "bf_embed_p50_ms"),
                         ("with embedding p99 (ms)", "ann_embed_p99_ms", "bf_embed_p99_ms")):
        print(f"{label:<34}{r[a]:>12.2f}{r[bf]:>14.2f}{r[bf] / r[a]:>9.1f}x")
    print(f"{'recall@1 near (or text) queries':<34}{r['recall1_near']:>12.3f}{1.0:>14.3f}")
    print(f"{'recall@1 random queries':<34}{r['recall1_random']:>12.3f}{1.0:>14.3f}")
    sys.stdout.flush()


def print_throughput(t: dict, readers: int) -> None:
    print(f"throughput (ef_search={t['ef_search']}, search_threads={t['search_threads']}, "
          f"32-query batches){'':<4}{'ANN':>10}{'brute force':>14}{'ratio':>9}")
    for label, a, bf in ((f"{readers} readers, queries/s", "qps_ann_readers", "qps_bf_readers"),
                         (f"{readers} readers + 1 writer, queries/s", "qps_ann_mixed",
                          "qps_bf_mixed")):
        print(f"  {label:<66}{t[a]:>10.0f}{t[bf]:>14.0f}{t[a] / t[bf]:>8.1f}x")
    print(f"  {'writer adds/s while reading (ANN: SQLite commit + index, FIFO evicting)':<66}"
          f"{t['ann_adds_per_s']:>10.0f}{t['bf_adds_per_s']:>14.0f}")
    if t["verify_problems"] > 0:
        print(f"VERIFY: {t['verify_problems']} problems")
    elif t["verify_problems"] == 0:
        print("  verify: table and index agree after the run")
    sys.stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main())
