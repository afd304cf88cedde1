"""Throughput of the MiniHack text wrapper against raw NLE/MiniHack, in one run.

Both sides play the same task with the same action sequence (seeded random compass moves), the
same level seeds and the same episode cap, resetting at the same points; resets are included in
the timing. Three setups are timed, each best of ``--repeats`` rounds (interleaved, so that load
from other processes hits all of them alike):

* ``raw MiniHack (default keys)``: MiniHack as users make it, integer actions, its default
  observation dict (includes the 9x9 crops MiniHack computes every step);
* ``raw MiniHack (wrapper keys)``: MiniHack configured exactly as the wrapper configures it
  (observation keys glyphs, chars, blstats, message), integer actions;
* ``text wrapper``: ``MiniHackTextEnv``: words in, language observation out (info dict included).

Prints steps/s and the ratios text / raw; the target is >= 0.5x.

    .venv/bin/python benchmarks/env_throughput.py --task MiniHack-Room-Ultimate-5x5-v0 --steps 20000
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import numpy as np


def _action_plan(n_steps: int, seed: int) -> list[int]:
    return [int(a) for a in np.random.default_rng(seed).integers(0, 8, size=n_steps)]


def _raw_env(task: str, max_steps: int, wrapper_keys: bool) -> Any:
    from crl_bench.envs.minihack.env import _NEEDED_KEYS, _make_minihack

    kwargs: dict[str, Any] = {}
    if not wrapper_keys:
        from crl_bench.envs.minihack._nle_import import import_minihack

        kwargs["observation_keys"] = list(import_minihack().base.MH_DEFAULT_OBS_KEYS)
    env = _make_minihack(task, max_steps, kwargs)
    if wrapper_keys:
        assert list(env._minihack_obs_keys) == list(_NEEDED_KEYS)
    return env


def time_raw(env: Any, plan: list[int], max_steps: int, move_indices: list[int]
             ) -> tuple[float, int]:
    """(steps/s, episodes) of the raw MiniHack env over ``plan`` (indices into the 8 moves)."""
    from crl_bench.envs.minihack.env import nethack_seeds

    def reset(episode: int) -> None:
        # the seeds MiniHackTextEnv.reset(seed=episode) uses, so both play the same games
        level, core, disp = nethack_seeds(np.random.default_rng(episode), episode)
        env.seed(core, disp, reseed=False, lgen=level)
        env.reset()

    episode, t_in_episode = 0, 0
    reset(episode)
    start = time.perf_counter()
    for a in plan:
        _obs, _r, done, _trunc, _info = env.step(move_indices[a])
        t_in_episode += 1
        if done or t_in_episode >= max_steps:
            episode += 1
            t_in_episode = 0
            reset(episode)
    return len(plan) / (time.perf_counter() - start), episode


def time_text(env: Any, plan: list[int], words: list[str]) -> tuple[float, int]:
    """(steps/s, episodes) of the text env over the same plan (words for the same moves)."""
    episode = 0
    env.reset(seed=episode)
    start = time.perf_counter()
    for a in plan:
        _obs, _r, terminated, truncated, _info = env.step(words[a])
        if terminated or truncated:
            episode += 1
            env.reset(seed=episode)
    return len(plan) / (time.perf_counter() - start), episode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="MiniHack-Room-Ultimate-5x5-v0",
                        help="MiniHack gymnasium id (default: the paper's task)")
    parser.add_argument("--steps", type=int, default=20_000, help="actions per timed round")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; the best is reported")
    parser.add_argument("--max-steps", type=int, default=30, help="episode cap (actions)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the action sequence")
    args = parser.parse_args(argv)

    from crl_bench.envs.minihack.actions import MOVE_KEYS
    from crl_bench.envs.minihack.env import MiniHackTextEnv
    from crl_bench.envs.minihack.language import DIRECTIONS

    plan = _action_plan(args.steps, args.seed)
    text_env = MiniHackTextEnv(args.task, max_steps=args.max_steps)
    raw_default = _raw_env(args.task, args.max_steps, wrapper_keys=False)
    raw_same = _raw_env(args.task, args.max_steps, wrapper_keys=True)
    index_of_key = {int(a): i for i, a in enumerate(raw_same.actions)}
    move_indices = [index_of_key[MOVE_KEYS[d]] for d in DIRECTIONS]
    words = list(DIRECTIONS)
    assert all(w in text_env.admissible_actions for w in words)

    setups: dict[str, Callable[[], tuple[float, int]]] = {
        "raw MiniHack (default keys)": lambda: time_raw(raw_default, plan, args.max_steps,
                                                        move_indices),
        "raw MiniHack (wrapper keys)": lambda: time_raw(raw_same, plan, args.max_steps,
                                                        move_indices),
        "text wrapper": lambda: time_text(text_env, plan, words),
    }
    best = {name: 0.0 for name in setups}
    episodes = {name: 0 for name in setups}
    for _ in range(args.repeats):
        for name, run in setups.items():
            rate, episodes[name] = run()
            best[name] = max(best[name], rate)

    print(f"task {args.task}, {args.steps} actions per round, best of {args.repeats} rounds, "
          f"episode cap {args.max_steps}")
    for name, rate in best.items():
        print(f"  {name:<30s} {rate:10.0f} steps/s  ({episodes[name]} episodes ended)")
    text = best["text wrapper"]
    r_default = text / best["raw MiniHack (default keys)"]
    r_same = text / best["raw MiniHack (wrapper keys)"]
    if len(set(episodes.values())) != 1:
        print(f"warning: the setups ended different numbers of episodes: {episodes}")
    print(f"ratio text / raw (default keys): {r_default:.2f}x")
    print(f"ratio text / raw (wrapper keys): {r_same:.2f}x   (target >= 0.5x)")
    for env in (text_env, raw_default, raw_same):
        env.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
