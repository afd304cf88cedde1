"""ALFWorld env speed: reset and step latency (mean, p95) against plain TextWorld, as ALFWorld.

    python benchmarks/alfworld_latency.py [--data-dir DIR] [--split valid_unseen] [--games 10]
                                          [--think-ms 300] [--seed 0]

The same games (drawn with ``--seed``, all six task types) and the same commands (each game's
walkthrough plus three invalid or information commands) are played four ways:

* **baseline** - what alfworld's ``AlfredTWEnv`` does per episode: ``textworld.start(game,
  wrappers=[AlfredDemangler(), AlfredInfos])`` then ``reset()``; steps are TextWorld's ``step``.
  It runs before our parse caches are installed, so it is plain TextWorld.
* **cold** - ``ALFWorldTextEnv.reset(options={"task_id": ...})`` on a game this process has not
  prepared yet, prefetching off (the worst case: read, parse and translate on the spot);
* **warm** - the same resets again (the game is in the process-wide store, e.g. the other
  K-1 rollouts of a GRPO group, or a later epoch);
* **prefetched** - an agent that spends ``--think-ms`` per action (sleeping, as a process that
  waits for its LLM does), with ``env.prefetch`` told the upcoming games one episode ahead;
  resets hit games the background thread prepared meanwhile.

Step latency is timed on every ``env.step`` of the warm and prefetched runs (valid and invalid
commands). Ratios are baseline / ours, from this run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

EXTRA_COMMANDS = ("look", "inventory", "fly to the moon")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: list[float]) -> str:
    mean_ms, p95_ms = statistics.mean(values) * 1e3, percentile(values, 0.95) * 1e3
    return f"mean {mean_ms:8.1f} ms   p95 {p95_ms:8.1f} ms   (n={len(values)})"


def run_baseline(paths: list[str]) -> tuple[list[float], list[float]]:
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    resets, steps = [], []
    saved_argv = list(sys.argv)  # textworld's pddl2sas overwrites sys.argv
    for path in paths:
        walkthrough = json.loads(Path(path).read_text())["walkthrough"]
        start = time.perf_counter()
        infos = textworld.EnvInfos(won=True, admissible_commands=True)
        env = textworld.start(path, request_infos=infos, wrappers=[AlfredDemangler(), AlfredInfos])
        env.reset()
        resets.append(time.perf_counter() - start)
        for command in list(EXTRA_COMMANDS) + walkthrough:
            t = time.perf_counter()
            env.step(command)
            steps.append(time.perf_counter() - t)
        env.close()
    sys.argv[:] = saved_argv
    return resets, steps


def play(env, task_id: str, think_s: float, steps: list[float]) -> bool:
    won = False
    for command in list(EXTRA_COMMANDS) + env.walkthrough():
        time.sleep(think_s)
        t = time.perf_counter()
        _obs, _r, terminated, _tr, info = env.step(command)
        steps.append(time.perf_counter() - t)
        won = won or bool(info["success"])
        if terminated:
            break
    return won


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--split", default="valid_unseen")
    parser.add_argument("--games", type=int, default=10)
    parser.add_argument("--think-ms", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from crl_bench.envs.alfworld.env import ALFWorldTextEnv
    from crl_bench.envs.alfworld.expert import sample_per_task_type

    probe = ALFWorldTextEnv(split=args.split, data_dir=args.data_dir, prefetch=False)
    per_type = max(1, -(-args.games // 6))
    ids = sample_per_task_type(probe.games, per_type=per_type, seed=args.seed)[: args.games]
    paths = [str(probe._record_for(t).path) for t in ids]
    half = len(ids) // 2
    cold_ids, fetch_ids = ids[:half] or ids, ids[half:] or ids
    print(f"ALFWorld {args.split}: {len(ids)} games ({len(cold_ids)} cold/warm, {len(fetch_ids)} "
          f"prefetched), think time {args.think_ms:.0f} ms per action")

    base_reset, base_step = run_baseline(paths)

    env = ALFWorldTextEnv(split=args.split, data_dir=args.data_dir, prefetch=False)
    spare = next(g.task_id for g in probe.games if g.task_id not in ids)
    env.reset(options={"task_id": spare})  # library copy and imports, outside the timings
    cold, warm, steps = [], [], []
    for task_id in cold_ids:
        t = time.perf_counter()
        env.reset(options={"task_id": task_id})
        cold.append(time.perf_counter() - t)
        play(env, task_id, 0.0, [])
    for task_id in cold_ids:
        t = time.perf_counter()
        env.reset(options={"task_id": task_id})
        warm.append(time.perf_counter() - t)
        assert play(env, task_id, 0.0, steps), task_id

    think = args.think_ms / 1e3
    fetched, wins = [], 0
    env.prefetch(fetch_ids)
    env.reset(options={"task_id": spare})  # the episode during which the first games load
    play(env, spare, think, [])
    for task_id in fetch_ids:
        t = time.perf_counter()
        env.reset(options={"task_id": task_id})
        fetched.append(time.perf_counter() - t)
        wins += play(env, task_id, think, steps)
    env.close()

    print("\nreset latency")
    print(f"  baseline  (textworld.start + reset) {summary(base_reset)}")
    print(f"  cold      (first time, on the spot) {summary(cold)}")
    print(f"  warm      (prepared game)           {summary(warm)}")
    print(f"  prefetched (background thread)      {summary(fetched)}")
    print("step latency")
    print(f"  baseline  (TextWorld step)          {summary(base_step)}")
    print(f"  ours      (ALFWorldTextEnv.step)    {summary(steps)}")
    b = statistics.mean(base_reset)
    print("\nratios baseline/ours (mean): "
          f"reset cold {b / statistics.mean(cold):.1f}x, warm {b / statistics.mean(warm):.1f}x, "
          f"prefetched {b / statistics.mean(fetched):.1f}x; "
          f"step {statistics.mean(base_step) / statistics.mean(steps):.1f}x")
    print(f"walkthrough wins in the prefetched run: {wins}/{len(fetch_ids)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
