"""Does the actor learn? ``grpo`` and ``comp_rl`` on MiniHack Room, N seeds, evaluation success
at the start and at the end with 95% CIs, and the learning curve (issue 18, "must show").

    python benchmarks/learning_minihack.py --preset cpu --seeds 0 1 2 --steps 20 \\
        --out results/learning_minihack

Each (agent, seed) is one ``run_experiment`` on the ``minihack`` task set
(``crl/MiniHack-Room-Ultimate-5x5-v0``) in ``OUT/runs/minihack__<agent>__<seed>``; an
interrupted call resumes its runs from their last checkpoints when run again with the same
arguments. The evaluation plays the same held-out task instances at every evaluated step, so
start and end are paired episode by episode.

Written to ``OUT``:

* ``summary.json`` / ``summary.md`` — per agent (and with / without experience for agents with a
  bank): success at the first and the last evaluation, each as mean over seeds with a 95%
  Student-t CI over seeds (n = seeds; no CI with one seed) and, pooled over every evaluated
  episode, a 95% Wilson interval; end - start with a 95% CI over seeds and, pooled, a paired
  per-episode 95% t interval (episodes of one seed are not independent draws of the policy's
  success, so the pooled interval is the optimistic one); the wall time per run; the command.
* ``learning_curve.png`` — evaluation success per evaluated step (mean over seeds) and the
  training success per step.

The issue's target: ``grpo`` end - start >= +0.25 with the CI excluding 0, in <= 2 h per seed on 2
cores. DESIGN.md §3 gives the chance level measured for Room-Ultimate-5x5 (uniform random
admissible actions, <= 10 actions): 24.5%.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Any

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
    from crl_bench.runner.records import read_jsonl

    return [e for e in read_jsonl(run / "episodes.jsonl") if e["phase"] == "eval"]


def summarise(runs: dict[tuple[str, int], Path]) -> dict[str, Any]:
    from crl_bench.runner.records import read_jsonl

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
            out[key] = {
                "seeds": seeds, "first_last_step": steps_seen,
                "start": t_ci(start_v), "end": t_ci(end_v),
                "delta_over_seeds": t_ci([e - s for s, e in zip(start_v, end_v)]),
                "start_pooled": {"k": pooled["start"][0], "n": pooled["start"][1],
                                 "wilson95": wilson(*pooled["start"])},
                "end_pooled": {"k": pooled["end"][0], "n": pooled["end"][1],
                               "wilson95": wilson(*pooled["end"])},
                "delta_paired_episodes": t_ci(deltas),
                "wall_min_per_run": [
                    round(sum(m.get("timing_s/step", 0.0) + (m.get("timing_s/eval", 0.0) if m["step"] == 0 else 0.0)
                              for m in read_jsonl(runs[(agent, s)] / "metrics.jsonl")) / 60, 1)
                    for s in seeds],
            }
    return out


def fmt(c: dict[str, Any]) -> str:
    if c["low"] is None:
        return f"{c['mean']:+.3f} (n={c['n']}, no CI)" if c["mean"] < 0 else f"{c['mean']:.3f} (n={c['n']}, no CI)"
    return f"{c['mean']:.3f} [{c['low']:.3f}, {c['high']:.3f}] (n={c['n']})"


def write_markdown(out: Path, summary: dict[str, Any], command: str, preset: str) -> None:
    lines = ["# Learning on MiniHack Room (Room-Ultimate-5x5)", "", f"Command: `{command}`", "",
             f"Preset `{preset}`; generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
             "| agent | start (mean over seeds, 95% t CI) | end | end - start over seeds | start pooled k/n [Wilson 95%] | end pooled | end - start, paired episodes (95% t) | min per run |",
             "|---|---|---|---|---|---|---|---|"]
    for key, r in summary.items():
        sp, ep = r["start_pooled"], r["end_pooled"]
        lines.append(
            f"| {key} | {fmt(r['start'])} | {fmt(r['end'])} | {fmt(r['delta_over_seeds'])} | "
            f"{sp['k']}/{sp['n']} [{sp['wilson95'][0]:.2f}, {sp['wilson95'][1]:.2f}] | "
            f"{ep['k']}/{ep['n']} [{ep['wilson95'][0]:.2f}, {ep['wilson95'][1]:.2f}] | "
            f"{fmt(r['delta_paired_episodes'])} | {r['wall_min_per_run']} |")
    lines += ["", "Target (issue 18): grpo end - start >= +0.25 with the CI excluding 0, <= 2 h per "
              "seed on 2 cores. Chance level of Room-Ultimate-5x5 (DESIGN.md §3, uniform random "
              "admissible actions, <= 10 actions): 24.5%.", "",
              "![learning curve](learning_curve.png)", ""]
    (out / "summary.md").write_text("\n".join(lines))


def plot(out: Path, runs: dict[tuple[str, int], Path]) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    from crl_bench.runner.records import read_jsonl

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for agent in sorted({a for a, _ in runs}):
        for mode in (False, True):
            per_step: dict[int, list[float]] = {}
            for (a, s), path in runs.items():
                if a != agent:
                    continue
                for e in read_jsonl(path / "eval.jsonl"):
                    if bool(e["with_experience"]) == mode:
                        per_step.setdefault(e["step"], []).append(e["success_rate"])
            if per_step:
                xs = sorted(per_step)
                ax1.plot(xs, [sum(per_step[x]) / len(per_step[x]) for x in xs], marker="o",
                         label=f"{agent}{' w/ exp' if mode else ''}")
        train: dict[int, list[float]] = {}
        for (a, s), path in runs.items():
            if a == agent:
                for m in read_jsonl(path / "metrics.jsonl"):
                    if "charts/success_rate" in m:
                        train.setdefault(m["step"], []).append(m["charts/success_rate"])
        if train:
            xs = sorted(train)
            ax2.plot(xs, [sum(train[x]) / len(train[x]) for x in xs], marker=".", label=agent)
    ax1.axhline(0.245, color="grey", ls=":", label="chance (DESIGN §3)")
    ax1.set(title="evaluation success (mean over seeds)", xlabel="actor step", ylabel="success", ylim=(0, 1))
    ax2.set(title="training success per step", xlabel="actor step", ylim=(0, 1))
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    path = out / "learning_curve.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
    args = p.parse_args(argv)
    command = "python benchmarks/learning_minihack.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))

    from crl_bench.cli import parse_overrides
    from crl_bench.runner.api import run_experiment

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    overrides = parse_overrides(args.overrides)
    runs: dict[tuple[str, int], Path] = {}
    for seed in args.seeds:           # seed-major: a partial call still has both agents per seed
        for agent in args.agents:
            run_dir = out / "runs" / f"{args.tasks}__{agent}__{seed}"
            t0 = time.time()
            runs[(agent, seed)] = run_experiment(agent, args.tasks, args.preset, seed, run_dir,
                                                 steps=args.steps, overrides=overrides, resume=True,
                                                 progress=not args.no_progress)
            print(f"[learning] {agent} seed {seed}: {(time.time() - t0) / 60:.1f} min in this call")
    summary = summarise(runs)
    data = {"command": command, "preset": args.preset, "steps": args.steps, "tasks": args.tasks,
            "overrides": overrides, "agents": summary}
    (out / "summary.json").write_text(json.dumps(data, indent=2))
    write_markdown(out, summary, command, args.preset)
    png = plot(out, runs)
    print((out / "summary.md").read_text())
    print(f"written: {out / 'summary.json'}, {out / 'summary.md'}" + (f", {png}" if png else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
