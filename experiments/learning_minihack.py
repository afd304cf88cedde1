"""Does the actor learn? ``grpo`` and ``comp_rl`` on MiniHack Room, N seeds, evaluation success
at the start and at the end with 95% CIs, and the learning curve.

    # what results/learning_minihack holds (2 runs at a time on 2 cores, one torch thread each)
    python experiments/learning_minihack.py --tasks crl/MiniHack-Room-Random-5x5-v0 --preset cpu \\
        --steps 10 --seeds 0 1 2 --agents grpo comp_rl --jobs 2 --order seed --set threads=1 \\
        --set rollout.history=0 --set rollout.example_pick=random --set rollout.groups=4 \\
        --set 'rollout.env_max_steps={"minihack": 10}' --set actor.lr=3e-4 \\
        --set actor.max_samples_per_update=48 --set eval.every=0 --set eval.episodes_per_task=16 \\
        --out OUT
    # then, to summarise what has finished without running the rest:
    python experiments/learning_minihack.py ... --summary-only
    # from the committed records alone (no run directory): a results table's per-seed evaluation
    # records, and summary.md from a committed summary.json
    python experiments/learning_minihack.py --records results/learning_minihack/adjacent_3x3_balanced_16groups/five_seeds
    python experiments/learning_minihack.py --markdown-only --out results/learning_minihack/adjacent_3x3

Each (agent, seed) is one ``run_experiment`` on ``--tasks`` (default the ``minihack`` task set,
``crl/MiniHack-Room-Ultimate-5x5-v0``) in ``OUT/runs/<tasks>__<agent>__<seed>``; with ``--jobs N``
N of them run at once, each in its own process logging to ``OUT/runs/<name>.log``. An interrupted
call resumes its runs from their last checkpoints when run again with the same arguments. The
evaluation plays the same held-out task instances at every evaluated step, so start and end are
paired episode by episode. The floor is measured too: a uniform random walker over the 8 moves
on the same env, cap and held-out seeds (``chance``).

Written to ``OUT``:

* ``summary.json`` / ``summary.md`` — per agent (and with / without experience for agents with a
  bank): success at the first and the last evaluation, each as mean over seeds with a 95%
  Student-t CI over seeds (n = seeds; no CI with one seed) and, pooled over every evaluated
  episode, a 95% Wilson interval; end - start with a 95% CI over seeds and, pooled, a paired
  per-episode 95% t interval (episodes of one seed are not independent draws of the policy's
  success, so the pooled interval is the optimistic one: ``summary.json`` keeps it, the table in
  ``summary.md`` shows intervals over seeds only and the pooled counts bare); the wall time per
  run; the command.
* ``learning_curve.png`` — evaluation success per evaluated step (mean over seeds) and the
  training success per step.

The issue's target: ``grpo`` end - start >= +0.25 with the CI excluding 0, in <= 2 h per seed on 2
cores.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, centre - half), min(1.0, centre + half))


def t_ci(values: list[float]) -> dict[str, Any]:
    from crl_bench.report.stats import mean_ci

    est = mean_ci(values)
    return {"mean": est.mean, "low": est.low if est.has_ci else None,
            "high": est.high if est.has_ci else None, "n": len(values)}


def episodes(run: Path) -> list[dict[str, Any]]:
    from crl_bench.records.files import read_jsonl

    return [e for e in read_jsonl(run / "episodes.jsonl") if e["phase"] == "eval"]


def trained_eval_levels(run: Path) -> list[int]:
    """Evaluation level seeds the run also trained on (same task): must be empty, or the
    "held-out" success is partly memorised. Runs before the training-seed fix
    (``crl_bench.run.context.train_seed``) with run seed 1 have 9 of 16."""
    from crl_bench.records.files import read_jsonl

    seen: dict[str, set[tuple[str, int]]] = {"train": set(), "eval": set()}
    for e in read_jsonl(run / "episodes.jsonl"):
        seen["train" if e["phase"] == "train" else "eval"].add((e.get("task"), e["seed"]))
    return sorted(seed for _, seed in seen["train"] & seen["eval"])


def _turns_first_last(stats: dict[tuple[str, int], dict[int, dict[str, Any]]], agent: str,
                      seeds: list[int]) -> dict[str, Any]:
    """Turn statistics of the first and the last training step, mean over seeds."""
    out: dict[str, Any] = {}
    for key in ("valid", "toward_goal", "copies_example", "action_entropy_bits", "flat_groups"):
        for which in ("first", "last"):
            vals = []
            for s in seeds:
                st = stats.get((agent, s)) or {}
                if st:
                    v = st[min(st) if which == "first" else max(st)].get(key, math.nan)
                    if v == v:  # not nan
                        vals.append(v)
            out[f"{key}_{which}"] = round(sum(vals) / len(vals), 3) if vals else None
    out["top_action_last"] = [st[max(st)]["top_action"] for s in seeds
                              if (st := stats.get((agent, s)))]
    return out


TIME_PHASES = (
    ("run", "whole run (wall)"),
    ("evaluation", "evaluating"),
    ("playing", "playing the training episodes"),
    ("actor_update", "updating the actor"),
    ("waiting", "of these three: waiting for the model while the extractor held it"),
    ("distilling", "extractor: distilling episodes into entries"),
    ("merging", "extractor: merging the bank"),
    ("extractor_training", "extractor: training"),
)


def time_breakdown(run: Path) -> dict[str, Any]:
    """Where a run's wall time went, in minutes, from its own records.

    The actor loop's phases (evaluating, playing, updating the actor) add up to the run; the
    extractor track works in a background thread but takes turns with the loop on the one model
    (a lock), so its work shows in the loop's phases as ``waiting``, and on its own in the
    ``extractor:`` rows (each batch's record in ``extractor.jsonl``; runs older than that file
    have only the step records, in which batches that finished between the same two steps were
    one record, so their extractor rows are a lower bound: ``extractor_records`` says which)."""
    from crl_bench.records.files import read_jsonl

    metrics = read_jsonl(run / "metrics.jsonl")
    batch_file = run / "extractor.jsonl"
    batches = read_jsonl(batch_file) if batch_file.exists() else metrics

    def total(records: list[dict[str, Any]], *keys: str) -> float:
        return round(sum(float(r.get(k, 0.0)) for r in records for k in keys) / 60, 1)

    out: dict[str, Any] = {
        "run": round(sum(m.get("timing_s/step", 0.0) + (m.get("timing_s/eval", 0.0) if m["step"] == 0 else 0.0)
                         for m in metrics) / 60, 1),
        "evaluation": total(metrics, "timing_s/eval"),
        "playing": total(metrics, "timing_s/rollout"),
        "actor_update": total(metrics, "timing_s/actor_update"),
        "waiting": total(metrics, "timing_s/extractor_wait"),
        "distilling": total(batches, "extractor/extract_s"),
        "merging": total(batches, "extractor/merge_s"),
        "extractor_training": total(batches, "losses/extractor_time_recompute_s",
                                    "losses/extractor_time_forward_s",
                                    "losses/extractor_time_backward_s"),
    }
    from crl_bench.report.runs import actor_wait_share, bank_lag_max

    out["actor_wait_share"] = actor_wait_share(metrics)
    out["bank_lag_max"] = bank_lag_max(metrics)
    used_extractor = any("extractor/backlog" in m for m in metrics)
    out["extractor_records"] = (None if not used_extractor else "extractor.jsonl"
                                if batch_file.exists() else "metrics.jsonl (a lower bound)")
    return out


def summarise(runs: dict[tuple[str, int], Path],
              stats: dict[tuple[str, int], dict[int, dict[str, Any]]] | None = None) -> dict[str, Any]:
    stats = stats or {}
    out: dict[str, Any] = {}
    for agent in sorted({a for a, _ in runs}):
        seeds = sorted(s for a, s in runs if a == agent)
        eps_by_seed = {s: episodes(runs[(agent, s)]) for s in seeds}
        modes = sorted({e["with_experience"] for eps in eps_by_seed.values() for e in eps})
        for mode in modes:
            key = f"{agent} {'with' if mode else 'without'} exp" if True in modes else agent
            start_v, end_v, deltas, pooled = [], [], [], {"start": [0, 0], "end": [0, 0]}
            steps_seen = []
            for s in seeds:
                eps = [e for e in eps_by_seed[s] if e["with_experience"] == mode]
                if not eps:
                    continue
                first, last = min(e["step"] for e in eps), max(e["step"] for e in eps)
                steps_seen.append((first, last))
                a = {(e["task_id"], e["seed"]): float(e["success"]) for e in eps if e["step"] == first}
                b = {(e["task_id"], e["seed"]): float(e["success"]) for e in eps if e["step"] == last}
                start_v.append(sum(a.values()) / len(a))
                end_v.append(sum(b.values()) / len(b))
                deltas.extend(b[k] - a[k] for k in a if k in b)
                pooled["start"][0] += int(sum(a.values()))
                pooled["start"][1] += len(a)
                pooled["end"][0] += int(sum(b.values()))
                pooled["end"][1] += len(b)
            if not start_v:
                continue
            times = [time_breakdown(runs[(agent, s)]) for s in seeds]
            out[key] = {
                "seeds": seeds, "first_last_step": steps_seen,
                "start": t_ci(start_v), "end": t_ci(end_v),
                "delta_over_seeds": t_ci([e - s for s, e in zip(start_v, end_v)]),
                "start_pooled": {"k": pooled["start"][0], "n": pooled["start"][1],
                                 "wilson95": wilson(*pooled["start"])},
                "end_pooled": {"k": pooled["end"][0], "n": pooled["end"][1],
                               "wilson95": wilson(*pooled["end"])},
                "delta_paired_episodes": t_ci(deltas),
                "turns_first_last_step": _turns_first_last(stats, agent, seeds),
                "eval_levels_trained_on": [len(trained_eval_levels(runs[(agent, s)]))
                                           for s in seeds],
                "wall_min_per_run": [t["run"] for t in times],
                "time_min_per_run": times,
            }
    return out


def eval_records(folder: Path, with_experience: bool = False) -> dict[int, dict[int, float]]:
    """The committed per-seed evaluation records of ``folder``: ``eval_seed<N>.jsonl``, each a
    run's own ``eval.jsonl`` (one line per evaluated step and mode, success over its held-out
    levels) -> {seed: {step: success}} for one mode (with or without experience)."""
    out: dict[int, dict[int, float]] = {}
    for path in sorted(folder.glob("eval_seed*.jsonl")):
        seed = int(path.stem.removeprefix("eval_seed"))
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        curve = {int(r["step"]): float(r["success_rate"]) for r in rows
                 if bool(r["with_experience"]) == with_experience}
        if curve:
            out[seed] = curve
    if not out:
        raise SystemExit(f"no eval_seed<N>.jsonl records in {folder}: pass the folder beside a "
                         "results table, e.g. results/learning_minihack/adjacent_3x3_balanced_16groups/five_seeds")
    return out


def sign_test(values: list[float]) -> dict[str, Any]:
    """Exact two-sided sign test of "the median is 0" on ``values`` (zeros dropped): the
    binomial(n, 1/2) probability of a split at least as uneven as the one seen."""
    pos, neg = sum(v > 0 for v in values), sum(v < 0 for v in values)
    n, k = pos + neg, min(pos, neg)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0
    return {"positive": pos, "negative": neg, "p_two_sided": p}


def summarise_records(folder: Path, with_experience: bool = False,
                      seeds: list[int] | None = None) -> dict[str, Any]:
    """Re-derive a results table from committed evaluation records only (no run directory):
    per seed the success at every evaluated step, start (first step), end (last step) and
    end - start; across seeds the mean end - start with its 95% Student-t interval over seeds
    (n = seeds, df = n - 1: each seed one value, the episodes of a seed are not independent
    draws) and an exact sign test. ``seeds`` keeps only those seeds."""
    curves = eval_records(folder, with_experience)
    if seeds is not None:
        curves = {s: c for s, c in curves.items() if s in seeds}
    per_seed = {s: {"curve": c, "start": c[min(c)], "end": c[max(c)],
                    "delta": c[max(c)] - c[min(c)], "first_last_step": (min(c), max(c))}
                for s, c in sorted(curves.items())}
    deltas = [r["delta"] for r in per_seed.values()]
    return {"folder": str(folder), "with_experience": with_experience, "seeds": per_seed,
            "start": t_ci([r["start"] for r in per_seed.values()]),
            "end": t_ci([r["end"] for r in per_seed.values()]),
            "delta_over_seeds": t_ci(deltas), "sign_test": sign_test(deltas)}


def records_markdown(summary: dict[str, Any]) -> str:
    """``summarise_records`` as the per-seed table and the line under it."""
    steps = sorted({t for r in summary["seeds"].values() for t in r["curve"]})
    lines = [f"| seed | steps {' / '.join(map(str, steps))} | end - start |",
             "|---|---|---|"]
    for seed, r in summary["seeds"].items():
        cells = " / ".join(f"{r['curve'][t]:.3f}" if t in r["curve"] else "-" for t in steps)
        lines.append(f"| {seed} | {cells} | {r['delta']:+.3f} |")
    d, sign = summary["delta_over_seeds"], summary["sign_test"]
    interval = ("no interval (one seed)" if d["low"] is None else
                "every seed equal: no interval" if d["high"] - d["low"] < 1e-9 else
                f"95% t interval over seeds [{d['low']:+.3f}, {d['high']:+.3f}] (df = {d['n'] - 1})")
    lines += ["", f"end - start over {d['n']} seeds: {d['mean']:+.3f}, {interval}; sign test: "
              f"{sign['positive']} up, {sign['negative']} down, two-sided p = {sign['p_two_sided']:.4f}"]
    return "\n".join(lines)


def blind_episode(env: Any, seed: int, move: Callable[[], str]) -> bool:
    """Play level ``seed`` of ``env`` to its end with ``move()`` as every action (a policy that
    ignores the observation); True when it reached the goal."""
    env.reset(seed=seed)
    done, info = False, {}
    while not done:
        _, _, term, trunc, info = env.step(move())
        done = term or trunc
    return bool(info.get("success"))


def chance(run: Path, episodes: int = 500) -> dict[str, Any]:
    """Success of a uniform random walker (one of the 8 move words per action, no invalid turns)
    on the run's env with its action cap, on the held-out seeds the evaluation draws from: the
    floor a policy must beat. Measured, not assumed: it depends on the task and the cap."""
    import random

    import gymnasium

    import crl_bench  # noqa: F401  (registers the envs)
    from crl_bench.envs.minihack.language import DIRECTIONS

    from crl_bench.mixes import MixTask

    cfg = json.loads((run / "config.json").read_text())
    env_id = cfg["env_ids"][0]
    eval_offset = MixTask("", env_id, "minihack").eval_seed_offset  # the runs' held-out levels
    cap = cfg["rollout"]["env_max_steps"].get("minihack")
    env = gymnasium.make(env_id, **({"max_steps": cap} if cap else {}))
    rng = random.Random(0)
    wins = sum(blind_episode(env, eval_offset + i, lambda: rng.choice(DIRECTIONS))
               for i in range(episodes))
    # the best blind policy on the evaluation's own levels: one move, repeated. A policy that
    # collapses onto one move scores this, not 1/8, when the held-out levels are unbalanced
    levels = int(cfg["eval"]["episodes_per_task"])
    constant = {}
    for move in DIRECTIONS:
        solved = sum(blind_episode(env, eval_offset + i, lambda: move) for i in range(levels))
        constant[move] = solved / levels
    best = max(constant, key=constant.__getitem__)
    env.close()
    return {"env_id": env_id, "max_actions": cap, "episodes": episodes, "success": wins / episodes,
            "wilson95": wilson(wins, episodes),
            "best_constant_move": {"move": best, "success": constant[best], "levels": levels,
                                   "per_move": constant}}


GOAL_FEATURE = "staircase down"
EXAMPLE_ANSWER = r"e\.g\. <answer>([^<]+)</answer>"
"""The small-model prompt's example answer, as the format line writes it."""


def stairs_direction(observation: str) -> str | None:
    """The direction in which ``observation`` names the staircase down (None: not in view)."""
    from crl_bench.envs.minihack.scripted import parse_observation

    goal = [g for g in parse_observation(observation).sightings if g.name == GOAL_FEATURE]
    return goal[0].direction if goal else None


@functools.lru_cache(maxsize=None)
def _tokenizer(model: str) -> Any:
    """One tokenizer load per model for all the runs a summary reads."""
    from crl_bench.llm.models import load_tokenizer

    return load_tokenizer(model)


def turn_stats(run: Path) -> dict[int, dict[str, float]]:
    """Per training step, what the actor's turns did (read from the run's trajectories, each
    prompt decoded): ``valid`` share of turns that were an action; ``toward_goal`` share of the
    actions whose direction is the one in which the observation shown that turn names the
    staircase down (the greedy move; 1/8 for a uniform walker, turns that do not see the stairs
    left out); ``copies_example`` share of actions equal to the format line's example answer;
    ``top_action`` share of the most frequent action; ``action_entropy_bits`` entropy of the
    actions' distribution (3 bits: all 8 moves equally often; 0: one move only);
    ``flat_groups`` share of the step's groups whose episodes all got the same reward, so that
    every advantage in them is 0 and they train nothing (GRPO's signal is in the others). A policy
    that reads its observation raises ``toward_goal``; one that copies the prompt raises
    ``copies_example``; one collapsing onto a single move drives the entropy to 0 and the flat
    groups to 1. Actions are compared as the env reads them (``"Southeast"`` is ``southeast``)."""
    import gzip
    import re
    from collections import Counter

    from crl_bench.envs.minihack.actions import normalise_action

    tok = _tokenizer(json.loads((run / "config.json").read_text())["model"]["actor"])
    example = re.compile(EXAMPLE_ANSWER)
    out: dict[int, dict[str, float]] = {}
    for path in sorted((run / "trajectories").glob("train_step_*.jsonl.gz")):
        step = int(path.name.split("_")[2].split(".")[0])
        turns = valid = toward = seen = copies = 0
        actions: Counter[str] = Counter()
        group_rewards: dict[Any, set[float]] = {}
        with gzip.open(path, "rt") as fh:
            for line in fh:
                episode = json.loads(line)
                group_rewards.setdefault(episode["group_id"], set()).add(episode["reward"])
                for t in episode["turns"]:
                    turns += 1
                    if t["kind"] != "action":
                        continue
                    valid += 1
                    action = normalise_action(t["action"])  # as the env reads it
                    actions[action] += 1
                    prompt = tok.decode(t["prompt_ids"])
                    shown = prompt.rsplit("Current observation", 1)[-1].split("\n", 1)[-1]
                    shown = shown.split("\n\nAdmissible actions", 1)[0]
                    goal = stairs_direction(shown)
                    if goal is not None:
                        seen += 1
                        toward += goal == action
                    ex = example.findall(prompt)
                    copies += bool(ex) and normalise_action(ex[-1]) == action
        shares = [n / valid for n in actions.values()] if valid else []
        out[step] = {"turns": turns, "valid": valid / max(turns, 1),
                     "action_entropy_bits": 0.0 - sum(q * math.log2(q) for q in shares),
                     "flat_groups": (sum(len(r) == 1 for r in group_rewards.values())
                                     / max(len(group_rewards), 1)),
                     "toward_goal": toward / seen if seen else float("nan"),
                     "copies_example": copies / max(valid, 1),
                     "top_action": (f"{actions.most_common(1)[0][0]} "
                                    f"{actions.most_common(1)[0][1] / valid:.0%}") if valid else ""}
    return out


def fmt(c: dict[str, Any]) -> str:
    if c["low"] is None:
        return f"{c['mean']:+.3f} (n={c['n']}, no CI)" if c["mean"] < 0 else f"{c['mean']:.3f} (n={c['n']}, no CI)"
    if c["high"] - c["low"] < 1e-9:  # every seed the same value: a zero-width t interval says nothing
        return f"{c['mean']:.3f} (n={c['n']}, every seed equal: no interval)"
    return f"{c['mean']:.3f} [{c['low']:.3f}, {c['high']:.3f}] (n={c['n']})"


def write_markdown(out: Path, summary: dict[str, Any], command: str, preset: str,
                   floor: dict[str, Any], generated: str | None = None) -> None:
    """``summary.md`` from the summary's data. Intervals in the table are over seeds only: the
    pooled counts are shown without one (episodes of one seed are not independent draws; the
    pooled and paired per-episode intervals stay in ``summary.json``, not in a headline)."""
    generated = generated or f"generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    lines = [f"# Learning on MiniHack ({floor['env_id']})", "", f"Command: `{command}`", "",
             f"Preset `{preset}`; {generated}.", "",
             "| agent | start (mean over seeds, 95% t CI over seeds) | end | end - start over seeds | start, k/n pooled over seeds | end, pooled | min per run |",
             "|---|---|---|---|---|---|---|"]
    for key, r in summary.items():
        sp, ep = r["start_pooled"], r["end_pooled"]
        lines.append(
            f"| {key} | {fmt(r['start'])} | {fmt(r['end'])} | {fmt(r['delta_over_seeds'])} | "
            f"{sp['k']}/{sp['n']} | {ep['k']}/{ep['n']} | {r['wall_min_per_run']} |")
    lines += ["", "Evaluated steps (first, last) of each seed: "
              + "; ".join(f"{key} {[tuple(x) for x in r['first_last_step']]}" for key, r in summary.items())
              + ".", ""]
    lines += ["What the training turns did, first → last training step (mean over seeds; "
              "`turn_stats`): valid = share of turns that were an action; toward stairs = share "
              "of actions in the direction the observation names the staircase down (a uniform "
              "walker: 1/8); copies example = share of actions equal to the prompt's example "
              "answer; action entropy = entropy of the moves' distribution in bits (3: all 8 "
              "equally often, 0: one move only); flat groups = share of groups whose episodes "
              "all got the same reward (every advantage 0: they train nothing).", "",
              "| agent | valid | toward stairs | copies example | action entropy (bits) | flat groups |",
              "|---|---|---|---|---|---|"]
    shown: set[str] = set()
    for key, r in summary.items():
        agent = key.split()[0]  # the turn statistics are per agent (both modes' turns)
        if agent in shown:
            continue
        shown.add(agent)
        t = r.get("turns_first_last_step") or {}

        def pair(name: str) -> str:
            a, b = t.get(f"{name}_first"), t.get(f"{name}_last")
            return "n/a" if a is None or b is None else f"{a:.0%} → {b:.0%}"

        def bits() -> str:
            a, b = t.get("action_entropy_bits_first"), t.get("action_entropy_bits_last")
            return "n/a" if a is None or b is None else f"{a:.2f} → {b:.2f}"
        lines.append(f"| {agent} | {pair('valid')} | {pair('toward_goal')} | "
                     f"{pair('copies_example')} | {bits()} | {pair('flat_groups')} |")
    if any(r.get("time_min_per_run") for r in summary.values()):
        lines += ["", "Where a run's time went, minutes (mean over seeds; `time_breakdown`, to the last "
                  "recorded step): evaluating, playing and updating the actor add up to the whole run; "
                  "waiting is the part of those three the loop spent waiting for the model while the "
                  "extractor track held it; the extractor columns are the track's own work.", "",
                  "| agent | " + " | ".join(label for _, label in TIME_PHASES) + " |",
                  "|---|" + "---|" * len(TIME_PHASES)]
    timed: list[str] = []
    lower_bound: list[str] = []
    for key, r in summary.items():
        agent = key.split()[0]
        times = r.get("time_min_per_run") or []
        if agent in timed or not times:
            continue
        timed.append(agent)
        cells = [f"{sum(t[name] for t in times) / len(times):.1f}" for name, _ in TIME_PHASES]
        lines.append(f"| {agent} | " + " | ".join(cells) + " |")
        if any(t.get("extractor_records") == "metrics.jsonl (a lower bound)" for t in times):
            lower_bound.append(agent)
    if lower_bound:
        lines += ["", f"Extractor rows of {', '.join(lower_bound)}: a lower bound (runs without "
                  "`extractor.jsonl`: batches that finished between the same two steps were one record)."]
    lags = {}
    for key, r in summary.items():
        for t in r.get("time_min_per_run") or []:
            if t.get("bank_lag_max") is not None:
                lags.setdefault(key.split()[0], []).append(int(t["bank_lag_max"]))
    if lags:
        lines += ["", "Bank lag beside the wait (the most steps the bank was behind at a training "
                  "rollout's start, per run; 0: it held every earlier step's entries): "
                  + "; ".join(f"{a} {', '.join(map(str, v))}" for a, v in sorted(lags.items())) + "."]
    lo, hi = floor["wilson95"]
    lines += ["", "Target: grpo end - start >= +0.25 with the CI excluding 0, <= 2 h per "
              f"seed on 2 cores. Chance level of {floor['env_id']} with <= {floor['max_actions']} "
              f"actions (a uniform random walker over the 8 moves, {floor['episodes']} held-out "
              f"seeds, measured by this script): {floor['success']:.3f} [{lo:.3f}, {hi:.3f}]."]
    best = floor.get("best_constant_move")
    if best:
        lines += ["", f"Best blind policy on the evaluation's own {best['levels']} levels (one move "
                  f"repeated): `{best['move']}`, {best['success']:.3f} — what collapsing onto a "
                  "single move scores here."]
    leaked = {key: r["eval_levels_trained_on"] for key, r in summary.items()
              if any(r.get("eval_levels_trained_on", []))}
    if leaked:
        lines += ["", "**Not held out**: evaluation levels these runs also trained on, per seed: "
                  + "; ".join(f"{k} {v}" for k, v in leaked.items())
                  + " (runs before the training-seed fix; `trained_eval_levels`)."]
    lines += ["", "![learning curve](learning_curve.png)", ""]
    (out / "summary.md").write_text("\n".join(lines))


def plot(out: Path, runs: dict[tuple[str, int], Path], floor: float,
         stats: dict[tuple[str, int], dict[int, dict[str, Any]]] | None = None) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    from crl_bench.records.files import read_jsonl

    stats = stats or {}
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(14, 3.8))
    for agent in sorted({a for a, _ in runs}):
        for mode in (False, True):
            per_step: dict[int, list[float]] = {}
            for (a, s), path in runs.items():
                if a != agent:
                    continue
                mine = [e for e in read_jsonl(path / "eval.jsonl")
                        if bool(e["with_experience"]) == mode]
                for e in mine:
                    per_step.setdefault(e["step"], []).append(e["success_rate"])
                if mine:  # each seed thin, so that one seed's jump is not read as everyone's
                    ax1.plot([e["step"] for e in mine], [e["success_rate"] for e in mine],
                             lw=0.8, alpha=0.5, color="grey" if not mode else "tab:orange")
            if per_step:
                xs = sorted(per_step)
                ax1.plot(xs, [sum(per_step[x]) / len(per_step[x]) for x in xs], marker="o",
                         label=f"{agent}{' w/ exp' if mode else ''} (mean; thin: seeds)")
        train: dict[int, list[float]] = {}
        for (a, s), path in runs.items():
            if a == agent:
                for m in read_jsonl(path / "metrics.jsonl"):
                    if "charts/success_rate" in m:
                        train.setdefault(m["step"], []).append(m["charts/success_rate"])
        if train:
            xs = sorted(train)
            ax2.plot(xs, [sum(train[x]) / len(train[x]) for x in xs], marker=".", label=agent)
        toward: dict[int, list[float]] = {}
        for (a, s), st in stats.items():
            if a == agent:
                for step, v in st.items():
                    if v["toward_goal"] == v["toward_goal"]:
                        toward.setdefault(step, []).append(v["toward_goal"])
        if toward:
            xs = sorted(toward)
            ax3.plot(xs, [sum(toward[x]) / len(toward[x]) for x in xs], marker=".", label=agent)
    ax1.axhline(floor, color="grey", ls=":", label="random walker")
    ax1.set(title="evaluation success (mean and per seed)", xlabel="actor step", ylabel="success", ylim=(0, 1))
    ax2.set(title="training success per step", xlabel="actor step", ylim=(0, 1))
    ax3.axhline(1 / 8, color="grey", ls=":", label="uniform walker")
    ax3.set(title="training actions toward the stairs", xlabel="actor step", ylim=(0, 1))
    for ax in (ax1, ax2, ax3):
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "learning_curve.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def lane_args(argv: list[str]) -> list[str]:
    """This call's arguments without ``--agents``/``--seeds``/``--jobs`` and their values (each
    lane gets its own agent and seed)."""
    rest, skip = [], False
    for a in argv:
        if skip and not a.startswith("--"):
            continue
        skip = a in ("--agents", "--seeds", "--jobs")
        if not skip:
            rest.append(a)
    return rest


def lanes(order: list[tuple[str, int]], runs: dict[tuple[str, int], Path], args: Any,
          argv: list[str]) -> None:
    """Run each (agent, seed) as its own process of this script, ``args.jobs`` at a time; each
    writes its live progress lines to ``RUN_DIR.log`` (a failed run names its log)."""
    import subprocess

    rest = lane_args(argv)
    pending, running, failed = list(order), [], []
    while pending or running:
        while pending and len(running) < args.jobs:
            agent, seed = pending.pop(0)
            log = runs[(agent, seed)].with_suffix(".log")
            log.parent.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, __file__, *rest, "--agents", agent, "--seeds", str(seed),
                   "--runs-only"]
            running.append(((agent, seed), log, time.time(),
                            subprocess.Popen(cmd, stdout=log.open("a"), stderr=subprocess.STDOUT)))
        time.sleep(5)
        for item in list(running):
            (agent, seed), log, t0, proc = item
            if proc.poll() is not None:
                running.remove(item)
                print(f"[learning] {agent} seed {seed}: exit {proc.returncode} after "
                      f"{(time.time() - t0) / 60:.1f} min (log: {log})", flush=True)
                if proc.returncode:
                    failed.append(str(log))
    if failed:
        raise SystemExit(f"runs failed; see {', '.join(failed)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", nargs="+", default=["grpo", "comp_rl"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--preset", default="cpu")
    p.add_argument("--steps", type=int, default=None, help="actor steps (default: the preset's)")
    p.add_argument("--tasks", default="minihack")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", default="results/learning_minihack")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs at once, each in its own process (with 2 cores: 2 and --set threads=1)")
    p.add_argument("--order", choices=["seed", "agent"], default="seed",
                   help="run order: seed-major (both agents of a seed first) or agent-major")
    p.add_argument("--summary-only", action="store_true",
                   help="run nothing: summarise the finished runs of these agents and seeds in OUT")
    p.add_argument("--include-unfinished", action="store_true",
                   help="with --summary-only: also runs that were stopped (their end is their last "
                        "evaluation; the summary names each run's first and last evaluated step)")
    p.add_argument("--records", metavar="DIR", default=None,
                   help="run nothing: re-derive the per-seed table and the interval over seeds from "
                        "the committed eval_seed<N>.jsonl in DIR (with --seeds: only those seeds)")
    p.add_argument("--markdown-only", action="store_true",
                   help="run nothing: rewrite OUT/summary.md from OUT/summary.json (committed "
                        "summaries whose run directories were not committed)")
    p.add_argument("--runs-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    given = argv if argv is not None else sys.argv[1:]
    if args.records:
        chosen = args.seeds if "--seeds" in given else None
        for mode in (False, True):
            try:
                summary = summarise_records(Path(args.records), mode, chosen)
            except SystemExit:
                if mode:
                    break
                raise
            print(("with experience" if mode else "without experience") + ":\n")
            print(records_markdown(summary) + "\n")
        return 0
    if args.markdown_only:
        data = json.loads((Path(args.out) / "summary.json").read_text())
        write_markdown(Path(args.out), data["agents"], data["command"], data["preset"],
                       data["chance"], generated="rendered from summary.json by --markdown-only")
        print((Path(args.out) / "summary.md").read_text())
        return 0
    command = "python experiments/learning_minihack.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))

    from crl_bench.config.overrides import parse_overrides
    from crl_bench.runner.api import run_experiment

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    overrides = parse_overrides(args.overrides)
    label = args.tasks.replace("crl/", "").replace("/", "_").replace(",", "+")
    # seed-major by default: a partial call still has both agents per seed
    order = ([(agent, seed) for seed in args.seeds for agent in args.agents]
             if args.order == "seed" else
             [(agent, seed) for agent in args.agents for seed in args.seeds])
    runs = {(a, s): out / "runs" / f"{label}__{a}__{s}" for a, s in order}
    if args.summary_only:
        wanted = ("done", "running", "failed") if args.include_unfinished else ("done",)
        runs = {k: v for k, v in runs.items() if (v / "status.json").exists()
                and json.loads((v / "status.json").read_text()).get("state") in wanted}
        if not runs:
            raise SystemExit(f"no finished run of {args.agents} x seeds {args.seeds} in {out / 'runs'}")
    elif args.jobs > 1:
        lanes(order, runs, args, argv if argv is not None else sys.argv[1:])
    else:
        for agent, seed in order:
            t0 = time.time()
            run_experiment(agent, args.tasks, args.preset, seed, runs[(agent, seed)],
                           steps=args.steps, overrides=overrides, resume=True,
                           progress=not args.no_progress)
            print(f"[learning] {agent} seed {seed}: {(time.time() - t0) / 60:.1f} min in this call")
    if args.runs_only:
        return 0
    stats = {k: turn_stats(v) for k, v in runs.items()}
    summary = summarise(runs, stats)
    floor = chance(next(iter(runs.values())))
    data = {"command": command, "preset": args.preset, "steps": args.steps, "tasks": args.tasks,
            "overrides": overrides, "chance": floor, "agents": summary}
    (out / "summary.json").write_text(json.dumps(data, indent=2))
    write_markdown(out, summary, command, args.preset, floor)
    png = plot(out, runs, floor["success"], stats)
    print((out / "summary.md").read_text())
    print(f"written: {out / 'summary.json'}, {out / 'summary.md'}" + (f", {png}" if png else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
