"""``ALFWorldTextEnv``: ALFWorld's TextWorld household games as a crl-bench text env.

One episode plays one ALFWorld game (a trial of a task) through TextWorld's PDDL engine:

* the observation is ALFWorld's text (the first one is the welcome banner, the room and
  ``"Your task is to: ..."``); ``info["goal"]`` is that task sentence;
* actions are ALFWorld's commands (``go to desk 1``, ``take mug 2 from desk 1``, ``move mug 2
  to shelf 1``, ``heat egg 1 with microwave 1``, ``use desklamp 1``, ``look``, ...);
  ``info["admissible_actions"]`` lists the game's admissible commands for the current state;
* a command that is not admissible changes nothing: the observation is ALFWorld's
  ``"Nothing happens."`` and ``info["action_valid"]`` is ``False``; commands are matched exactly
  after stripping surrounding white space, as ALFWorld does;
* ``terminated`` when the game is won (reward +1, ``success``, ``score`` 1.0); ``truncated``
  after ``max_steps`` actions (50 by default), with reward ``-timeout_penalty`` (0 by default);
  further steps follow the text-env convention (:mod:`crl_bench.text_env`): the final
  observation again, reward 0, the same end flags, ``action_valid=False``.

``info`` also has ``task_type`` (ALFWorld's name), ``task_type_id`` (1-6), ``split``,
``steps`` (actions taken) and ``walkthrough_length``.

Speed: a game's file is parsed and translated once per process (:mod:`.engine`'s shared
``GameStore``); on 2 busy cores a reset of a prepared game took 0.06-0.11 s against 3.6-7 s for
``textworld.start`` + ``reset``, a step 0.02-0.03 s against 0.14-0.24 s
(``benchmarks/alfworld_latency.py``). After each reset the env asks a background thread to
prepare the game its next unseeded reset will draw; :meth:`ALFWorldTextEnv.prefetch` names games
explicitly.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from crl_bench.envs.alfworld.games import GameRecord, load_split, normalize_task_types

from crl_bench.text_env import TextEnv, coerce_action, reset_options, safe_text

INVALID_FEEDBACK = "Nothing happens."  # ALFWorld's answer to a command it does not know
GOAL_PREFIX = "Your task is to: "


def goal_from_observation(observation: str) -> str:
    """The sentence after ``"Your task is to: "`` (``"put a clean plate in countertop."``)."""
    at = observation.rfind(GOAL_PREFIX)
    return observation[at + len(GOAL_PREFIX):].strip() if at >= 0 else ""


class ALFWorldTextEnv(TextEnv):
    """ALFWorld (Shridhar et al., 2021): household tasks in TextWorld, one game per episode.

    Args:
        split: "train" (3,553 games), "valid_seen" (140), "valid_unseen" (134, the usual
            evaluation set) or "valid_train" (200).
        task_types: keep only these task types: ALFWorld's names, numbers 1-6 or the aliases
            pick, look, clean, heat, cool, pick_two (one or a list); ``None`` keeps all six.
        data_dir: folder with the split archives (``<split>.tar.gz``) or an extracted
            ``json_2.1.1/<split>/`` tree; default ``$CRL_BENCH_ALFWORLD_DATA``,
            ``$CRL_BENCH_DATA/alfworld``, the cache, then ``$ALFWORLD_DATA`` (where
            ``alfworld-download`` puts ALFWorld's games). See :mod:`crl_bench.envs.alfworld.games`.
        max_steps: actions per episode (ALFWorld's usual 50).
        timeout_penalty: subtracted from the reward of the step that hits ``max_steps``
            without winning (>= 0; 0 is the paper's convention).
        prefetch: prepare the next games on a background thread.
        render_mode: None or "ansi" (the last observation).
    """

    family = "alfworld"

    def __init__(self, split: str = "train",
                 task_types: Iterable[str | int] | str | int | None = None,
                 data_dir: str | os.PathLike[str] | None = None, max_steps: int = 50,
                 timeout_penalty: float = 0.0, prefetch: bool = True,
                 render_mode: str | None = None) -> None:
        super().__init__(max_steps=max_steps, render_mode=render_mode)
        if not timeout_penalty >= 0.0:
            raise ValueError("timeout_penalty must be >= 0 (it is subtracted from the reward), "
                             f"got {timeout_penalty}.")
        self.split = split
        self.task_types = normalize_task_types(task_types)
        self.timeout_penalty = float(timeout_penalty)
        self.prefetch_enabled = bool(prefetch)
        self.games: list[GameRecord] = load_split(split, data_dir, self.task_types)
        self._by_id = {g.task_id: g for g in self.games}
        self._game: Any = None  # the engine's AlfredGame, made on the first reset
        self.record: GameRecord | None = None
        self._prepared: Any = None
        self._state: Any = None
        self._goal = ""
        self._admissible: list[str] = []
        self._steps = 0
        self._won = False
        self._finished = False

    # -- tasks ---------------------------------------------------------------------------------
    def task_ids(self) -> list[str]:
        """Task ids of this env's games (``"<split>/<task dir>/<trial>"``), sorted."""
        return [g.task_id for g in self.games]

    def _record_for(self, task_id: Any) -> GameRecord:
        key = str(task_id).strip().strip("/")
        record = self._by_id.get(key) or self._by_id.get(f"{self.split}/{key}")
        if record is None:
            raise ValueError(
                f"task_id {task_id!r} is not a game of split {self.split!r} with task types "
                f"{list(self.task_types)}; env.unwrapped.task_ids() lists the "
                f"{len(self.games)} ids (e.g. {self.games[0].task_id!r}).")
        return record

    def prefetch(self, task_ids: Iterable[str]) -> int:
        """Prepare these games on the background thread; returns how many were queued."""
        from crl_bench.envs.alfworld.engine import game_store

        return game_store().prefetch([str(self._record_for(t).path) for t in task_ids])

    def walkthrough(self) -> list[str]:
        """The current game's stored expert commands (empty before the first reset)."""
        return self._prepared.walkthrough if self._prepared is not None else []

    def planner_commands(self) -> list[str]:
        """TextWorld's planner (Fast Downward) plan from the current state (~0.5 s a call)."""
        if self._game is None or self._state is None:
            raise RuntimeError("Call reset() before planner_commands().")
        return list(self._game.planner_commands())

    # -- gymnasium API ---------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        from crl_bench.envs.alfworld.engine import game_store, new_alfred_game

        options = reset_options(options)
        super().reset(seed=seed)
        self.start_episode()
        task_id = options.get("task_id")
        if task_id is None:
            record = self.games[int(self.np_random.integers(len(self.games)))]
        else:
            record = self._record_for(task_id)
        store = game_store()
        self._prepared = store.get(str(record.path))
        if self._game is None:
            self._game = new_alfred_game()
        self._game.use(self._prepared)
        self._state = self._game.reset()
        self.record = record
        self._steps = 0
        self._won = bool(self._state["won"])
        self._finished = False
        observation = safe_text(self._state.feedback)
        self._goal = goal_from_observation(observation)
        self._admissible = list(self._state["admissible_commands"])
        self._last_observation = observation
        if self.prefetch_enabled:
            self._prefetch_next_draw()
        return observation, self._info(action_valid=True)

    def _prefetch_next_draw(self) -> None:
        """Queue the game the next unseeded reset will draw (the RNG state is put back)."""
        from crl_bench.envs.alfworld.engine import game_store

        generator = self.np_random.bit_generator
        saved = generator.state
        upcoming = self.games[int(self.np_random.integers(len(self.games)))]
        generator.state = saved
        game_store().prefetch([str(upcoming.path)])

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._state is None:
            raise RuntimeError("Call reset() before step().")
        text = coerce_action(action)
        after_end = self.step_after_end()
        if after_end is not None:
            return after_end
        self._steps += 1
        command = text.strip()
        valid = command in self._admissible
        if valid:
            self._state, _score, _done = self._game.step(command)
            observation = self._state.feedback
            self._admissible = list(self._state["admissible_commands"])
        else:  # TextWorld would answer the same and leave the state as it is
            observation = INVALID_FEEDBACK
        reward = 0.0
        terminated = truncated = False
        if valid and bool(self._state["won"]) and not self._won:
            self._won = True
            reward = 1.0
            terminated = True
        elif self._steps >= self.max_steps:
            truncated = True
            reward = 0.0 - self.timeout_penalty  # (0.0 - 0.0 is +0.0)
        self._finished = terminated or truncated
        return self.finish_step(observation, reward, terminated, truncated,
                                self._info(action_valid=valid))

    def _info(self, *, action_valid: bool) -> dict[str, Any]:
        assert self.record is not None
        return self.make_info(
            goal=self._goal, admissible_actions=self._admissible, success=self._won,
            score=1.0 if self._won else 0.0, action_valid=action_valid,
            task_id=self.record.task_id, task_type=self.record.task_type,
            task_type_id=self.record.task_type_id, split=self.split, steps=self._steps,
            walkthrough_length=len(self._prepared.walkthrough))

    def close(self) -> None:
        if self._game is not None:
            self._game.close()
            self._game = None
            self._state = None
        super().close()
