"""ALFWorld expert sweep: every game's stored walkthrough, replayed through the env's text actions.

    python experiments/alfworld_expert.py [--data-dir DIR] [--train-per-type 10] [--seed 0]
                                         [--compare-textworld] [--json results.json]

Plays all 134 ``valid_unseen`` games and ``--train-per-type`` train games of each of the six task
types (drawn with ``--seed``), each through ``ALFWorldTextEnv.step`` (the bar: >= 99% won in
each set), and prints the win rate per task type, steps and seconds per game.

``--compare-textworld`` also plays every valid_unseen game with plain TextWorld as alfworld
does (``textworld.start`` with ``AlfredDemangler``; run before any of our caches are installed)
and checks that every observation, admissible-command list and win flag along the walkthrough
(plus ``look``, ``inventory`` and an invalid command) equals ours. It is slow (~4 s a game here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

PROBES = ("look", "inventory", "dance with the fridge")


def trace(game, commands) -> list[tuple[str, list[str], bool]]:
    state = game.reset()
    out = [(state.feedback, list(state["admissible_commands"]), bool(state["won"]))]
    for command in list(PROBES) + list(commands):
        state, _score, _done = game.step(command)
        out.append((state.feedback, list(state["admissible_commands"]), bool(state["won"])))
    return out


def plain_textworld_traces(paths: list[str]) -> list[list]:
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler

    saved_argv = list(sys.argv)  # textworld's pddl2sas overwrites sys.argv
    traces = []
    for i, path in enumerate(paths):
        infos = textworld.EnvInfos(won=True, admissible_commands=True)
        env = textworld.start(path, request_infos=infos, wrappers=[AlfredDemangler()])
        traces.append(trace(env, json.loads(Path(path).read_text())["walkthrough"]))
        env.close()
        print(f"\r  plain TextWorld: {i + 1}/{len(paths)}", end="", flush=True)
    print()
    sys.argv[:] = saved_argv
    return traces


def our_traces(paths: list[str]) -> list[list]:
    from crl_bench.envs.alfworld import engine

    game = engine.new_alfred_game()
    traces = []
    for path in paths:
        prepared = engine.game_store().get(path)
        game.use(prepared)
        traces.append(trace(game, prepared.walkthrough))
    game.close()
    return traces


def sweep(env, task_ids: list[str], label: str):
    from crl_bench.envs.alfworld.expert import replay_walkthrough, win_rates

    start = time.perf_counter()
    env.prefetch(task_ids[1:17])
    episodes = []
    for i, task_id in enumerate(task_ids):
        episodes.append(replay_walkthrough(env, task_id))
        if i + 17 < len(task_ids):
            env.prefetch([task_ids[i + 17]])
        print(f"\r  {label}: {i + 1}/{len(task_ids)}", end="", flush=True)
    print()
    wall = time.perf_counter() - start
    rates = win_rates(episodes)
    print(f"\n{label}: {rates['all'][0]}/{rates['all'][1]} won "
          f"({100.0 * rates['all'][0] / rates['all'][1]:.1f}%), {wall:.0f} s "
          f"({wall / len(episodes):.2f} s a game, load + reset + steps)")
    print(f"  {'task type':34s} {'won':>9s} {'steps':>6s} {'s/game':>7s}")
    from crl_bench.envs.alfworld.games import TASK_TYPES

    for task_type in TASK_TYPES.values():
        eps = [e for e in episodes if e.task_type == task_type]
        if eps:
            won, n = rates[task_type]
            steps = statistics.mean(e.steps for e in eps)
            seconds = statistics.mean(e.seconds for e in eps)
            print(f"  {task_type:34s} {won:4d}/{n:<4d} {steps:6.1f} {seconds:7.2f}")
    lost = [e for e in episodes if not e.won]
    for e in lost:
        print(f"  LOST {e.task_id}: {e.steps} steps, {e.invalid_actions} invalid")
    return episodes, rates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--train-per-type", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compare-textworld", action="store_true")
    parser.add_argument("--json", default=None, help="write the per-game results here")
    args = parser.parse_args()

    from crl_bench.envs.alfworld.env import ALFWorldTextEnv
    from crl_bench.envs.alfworld.expert import sample_per_task_type

    unseen = ALFWorldTextEnv(split="valid_unseen", data_dir=args.data_dir)
    results: dict[str, object] = {}
    ok = True
    if args.compare_textworld:
        paths = [str(g.path) for g in unseen.games]
        print(f"comparing {len(paths)} valid_unseen games with plain TextWorld")
        reference = plain_textworld_traces(paths)
        ours = our_traces(paths)
        same = sum(r == o for r, o in zip(reference, ours))
        steps = sum(len(r) for r in reference)
        print(f"identical traces: {same}/{len(paths)} games ({steps} observations compared)")
        results["identical_traces"] = [same, len(paths)]
        ok &= same == len(paths)

    sets = [("valid_unseen (all)", unseen, unseen.task_ids())]
    if args.train_per_type > 0:
        train = ALFWorldTextEnv(split="train", data_dir=args.data_dir)
        sets.append((f"train ({args.train_per_type} per task type, seed {args.seed})", train,
                     sample_per_task_type(train.games, args.train_per_type, args.seed)))
    for label, env, ids in sets:
        episodes, rates = sweep(env, ids, label)
        results[label] = {"rates": rates, "episodes": [e.__dict__ for e in episodes]}
        ok &= rates["all"][0] >= 0.99 * rates["all"][1]
        env.close()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print("\nPASS: >= 99% won in every set" if ok else "\nFAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
