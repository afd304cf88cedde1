"""The ALFWorld expert: each game's stored walkthrough, replayed through the env's text actions.

Every ``game.tw-pddl`` stores a ``walkthrough`` (3-10 commands, in the names the game shows).
:func:`replay_walkthrough` resets the env on a game and sends those commands through
``env.step`` exactly as an agent would, so a win checks the whole path: data, engine, entity
names, admissible commands and the reward. (alfworld's hand-coded expert is not used: it tracks
placements by ``"put"`` in the last command and loses ``pick_two`` games that use ``move X to Y``.)
:func:`replay_planner` follows TextWorld's planner instead, re-planning after every step.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from crl_bench.envs.alfworld.games import TASK_TYPES, GameRecord


@dataclass(frozen=True)
class ExpertEpisode:
    """Result of one expert episode (``seconds``: wall-clock for reset + all steps)."""

    task_id: str
    task_type: str
    won: bool
    steps: int
    invalid_actions: int
    total_reward: float
    seconds: float


def _play(env: Any, task_id: str, next_commands: Callable[[Any], list[str]],
          max_actions: int) -> ExpertEpisode:
    start = time.perf_counter()
    _obs, info = env.reset(options={"task_id": task_id})
    task_type = str(info["task_type"])
    steps = invalid = 0
    total = 0.0
    done = False
    while not done and steps < max_actions:
        commands = next_commands(env.unwrapped)
        if not commands:
            break
        for command in commands:
            _obs, reward, terminated, truncated, info = env.step(command)
            steps += 1
            total += float(reward)
            invalid += not info["action_valid"]
            done = terminated or truncated
            if done or steps >= max_actions:
                break
    return ExpertEpisode(task_id=str(info["task_id"]), task_type=task_type,
                         won=bool(info["success"]), steps=steps, invalid_actions=invalid,
                         total_reward=total, seconds=time.perf_counter() - start)


def replay_walkthrough(env: Any, task_id: str) -> ExpertEpisode:
    """Reset ``env`` on ``task_id`` and send the game's stored walkthrough, command by command."""
    sent: list[bool] = []

    def once(unwrapped: Any) -> list[str]:
        if sent:
            return []
        sent.append(True)
        return list(unwrapped.walkthrough())

    return _play(env, task_id, once, max_actions=10_000)


def replay_planner(env: Any, task_id: str, max_actions: int = 50) -> ExpertEpisode:
    """Follow TextWorld's planner: one command of a fresh plan per step (~0.5 s each)."""
    return _play(env, task_id, lambda unwrapped: unwrapped.planner_commands()[:1], max_actions)


def sample_per_task_type(games: Sequence[GameRecord], per_type: int, seed: int = 0) -> list[str]:
    """``per_type`` task ids of each task type present, drawn with ``random.Random(seed)``;
    the result is sorted, so the same data and seed always give the same sample."""
    by_type: dict[str, list[str]] = defaultdict(list)
    for game in games:
        by_type[game.task_type].append(game.task_id)
    rng = random.Random(seed)
    picked: list[str] = []
    for task_type in TASK_TYPES.values():
        ids = sorted(by_type.get(task_type, []))
        picked += rng.sample(ids, min(per_type, len(ids)))
    return sorted(picked)


def win_rates(episodes: Iterable[ExpertEpisode]) -> dict[str, tuple[int, int]]:
    """``{"all": (won, played), <task type>: (won, played), ...}``."""
    table: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for ep in episodes:
        for key in ("all", ep.task_type):
            table[key][0] += int(ep.won)
            table[key][1] += 1
    return {k: (v[0], v[1]) for k, v in table.items()}
