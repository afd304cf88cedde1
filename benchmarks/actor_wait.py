"""How long the actor loop waits on the extractor: the same CPU ``comp_rl`` run with the
extractor in a thread of the actor's process (``extractor.runs=thread``: one model behind one
lock, the baseline) and in its own process (``extractor.runs=process``), measured in the same
invocation, one after the other.

    .venv/bin/python benchmarks/actor_wait.py --json OUT.json            # the measured size
    .venv/bin/python benchmarks/actor_wait.py --smoke --json OUT.json    # the tiny preset, 2 steps

Each run is ``crl-bench run --agent comp_rl`` in a fresh process (MiniHack's one-action level,
``--preset cpu --set threads=1``, the one-action settings of results/comp_rl_one_action.md,
4 groups of 8, 4 steps, a bank merge every 2 steps so that all three kinds of extractor work
(distil, merge, train) fall inside the run, one evaluation episode at the end). Per run it prints the wall time of the
process, the time of the training steps (the sum of ``timing_s/step``) and, as a share of that,
the time the actor loop waited on the extractor: the model lock / worker wait
(``timing_s/extractor_wait``) plus the wait for pending bank writes before a rollout
(``timing_s/bank_wait``); the time in Search-and-Ask calls (``timing_s/ask``) is shown beside it
and, in "wait + asks", added (an upper bound: an ask's own generation is work for the actor, and
in ``thread`` its lock wait is already in the first figure). The last step's final drain
(``timing_s/final_drain``: the actor is done and the loop waits for the extractor's backlog
before the last record) is shown apart, and in "wait + drain" added: an extractor that no
longer holds the actor back may fall behind it instead. Then the ratios process / thread.
``--show OUT.json`` prints the table of a saved result again.
The machine's load (``/proc/loadavg``) is recorded before and after each run: on a shared
machine the figures move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LEVEL = "crl/MiniHack-Room-Adjacent-3x3-Balanced-v0"
ONE_ACTION = ["--set", "rollout.history=0", "--set", "rollout.example_pick=random",
              "--set", 'rollout.env_max_steps={"minihack": 1}',
              "--set", 'rollout.env_kwargs={"minihack": {"view": "compact"}}',
              "--set", "actor.lr=3e-4"]
SIZES = {
    # preset, tasks, steps, groups, group size, extra settings
    "default": ("cpu", LEVEL, 4, 4, 8, [*ONE_ACTION, "--set", "experience.merge_every=2"]),
    "smoke": ("tiny", "minihack", 1, 2, 4, []),
}
MODES = ("thread", "process")


def load() -> str:
    return Path("/proc/loadavg").read_text().split(" ")[0] if Path("/proc/loadavg").exists() else "?"


def one_run(mode: str, size: str, out: Path, extra: list[str]) -> dict:
    preset, tasks, steps, groups, group_size, settings = SIZES[size]
    cmd = [str(Path(sys.executable).parent / "crl-bench"), "run", "--agent", "comp_rl",
           "--tasks", tasks, "--preset", preset, "--seed", "0", "--steps", str(steps),
           "--no-progress", "--no-report", "--out", str(out),
           "--set", "threads=1", "--set", f"rollout.groups={groups}",
           "--set", f"rollout.group_size={group_size}", "--set", "eval.every=0",
           "--set", "eval.at_start=false", "--set", "eval.episodes_per_task=1",
           *settings, *extra, "--set", f"extractor.runs={mode}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", TQDM_DISABLE="1", CRL_WANDB="0")
    load_before = load()
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{mode} run failed ({res.returncode}):\n{res.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
            if line.strip()]
    rows = [r for r in rows if r.get("step", 0) > 0]

    def total(key: str) -> float:
        return sum(float(r.get(key, 0.0)) for r in rows)
    steps_s = total("timing_s/step")
    lock, bank, ask = total("timing_s/extractor_wait"), total("timing_s/bank_wait"), total("timing_s/ask")
    return {"mode": mode, "wall_s": wall, "steps_s": steps_s, "extractor_wait_s": lock,
            "bank_wait_s": bank, "ask_s": ask, "wait_share": (lock + bank) / steps_s,
            "wait_with_asks_share": (lock + bank + ask) / steps_s,
            "wait_with_drain_share": (lock + bank + total("timing_s/final_drain")) / steps_s,
            "extractor_updates": max(int(r.get("extractor/updates", 0)) for r in rows),
            "final_drain_s": total("timing_s/final_drain"),
            "bank_lag_max": max((int(r["extractor/bank_lag_steps"]) for r in rows
                                 if "extractor/bank_lag_steps" in r), default=None),
            "load_before": load_before, "load_after": load(), "command": cmd}


def _lag(v: int | None) -> str:
    """The bank's largest lag in steps (``extractor/bank_lag_steps``); n/a for older records."""
    return "n/a" if v is None else str(v)


def show(results: list[dict], ratios: dict) -> None:
    print(f"{'extractor.runs':<15}{'wall s':>8}{'steps s':>9}{'lock/worker wait s':>19}"
          f"{'bank wait s':>12}{'asks s':>8}{'final drain s':>14}{'wait share':>11}"
          f"{'wait + asks':>12}{'wait + drain':>13}{'ext. updates':>13}{'bank lag max':>13}{'load':>12}")
    for r in results:
        drain = r.get("wait_with_drain_share",
                      (r["extractor_wait_s"] + r["bank_wait_s"] + r["final_drain_s"]) / r["steps_s"])
        print(f"{r['mode']:<15}{r['wall_s']:>8.1f}{r['steps_s']:>9.1f}{r['extractor_wait_s']:>19.1f}"
              f"{r['bank_wait_s']:>12.1f}{r['ask_s']:>8.1f}{r['final_drain_s']:>14.1f}"
              f"{r['wait_share']:>11.1%}{r['wait_with_asks_share']:>12.1%}{drain:>13.1%}"
              f"{r['extractor_updates']:>13d}{_lag(r.get('bank_lag_max')):>13}"
              f"{r['load_before'] + '->' + r['load_after']:>12}")
    print(f"process / thread: wall {ratios['wall']:.2f}, steps {ratios['steps']:.2f}, "
          f"wait share {ratios['wait_share']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="the tiny preset, 2 steps (seconds)")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--out", default=None, help="keep the runs here (default: a temporary folder)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="more settings for both runs (crl-bench run --set)")
    ap.add_argument("--show", default=None, metavar="OUT.json", help="print a saved result's table")
    args = ap.parse_args()
    if args.show:
        saved = json.loads(Path(args.show).read_text())
        show(saved["runs"], saved["ratios"])
        return
    size = "smoke" if args.smoke else "default"
    extra = [x for kv in args.set for x in ("--set", kv)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        results = [one_run(mode, size, root / mode, extra) for mode in MODES]
    before, after = results
    ratios = {"wall": after["wall_s"] / before["wall_s"],
              "steps": after["steps_s"] / before["steps_s"],
              "wait_share": after["wait_share"] / max(before["wait_share"], 1e-12)}
    show(results, ratios)
    if args.json:
        Path(args.json).write_text(json.dumps({"size": size, "runs": results, "ratios": ratios},
                                              indent=2))


if __name__ == "__main__":
    main()
