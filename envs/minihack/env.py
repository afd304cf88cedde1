"""``MiniHackTextEnv``: a MiniHack task on the real NLE, played through words.

Observation: the language description of :mod:`crl_bench.envs.minihack.language` (features with
distance words and compass directions, open directions, health, the game message, optionally a
cropped ASCII map). When our step cap ends the episode an ``Outcome:`` line follows it; when the
game itself ends (goal reached, death) NLE has already closed the game and the observation is
the ``Outcome:`` line alone.

``view="official"`` (the ``paper`` preset) shows instead what the official MiniHack env shows
(:mod:`crl_bench.envs.minihack.official`): the game message, MiniHack's 9 x 9 ASCII crop around
the agent, the legend of the symbols on the screen, and after each action the official action
list; an action that is not one of the names repeats the last observation with the official
``At turn 0, you did not provide a valid action.``; no ``Outcome:`` line (the official env has
none). ``info["official_prompt"]`` then carries the official env instruction and
the env manager's templates for the prompt builder.

Actions: the words of :mod:`crl_bench.envs.minihack.actions` (``north`` ... ``northwest`` and the
task's other actions); ``info["admissible_actions"]`` lists them. Case and extra spaces are
ignored. Anything else is *feedback*: the observation says the action was not understood and
repeats the current description, ``info["action_valid"]`` is False, the reward is 0 and NetHack
is not stepped, but the action still counts towards ``max_steps`` (an agent that keeps writing
nonsense uses up its episode, as it would in the paper's 30-turn budget).

Reward: MiniHack's own, summed over the NLE key presses of the action: +1 when the task is
solved (``reward_win``), 0 on death (``reward_lose``), and -0.01 for an action that did not
advance the game clock (e.g. walking into solid rock; NLE's ``penalty_step``). ``success`` is
MiniHack's end status ``TASK_SUCCESSFUL``; ``score`` is 1.0 on success, else 0.0.

Episode end: ``terminated`` when MiniHack ends the game (solved or died); ``truncated`` when
``max_steps`` actions have been taken (or MiniHack's own step limit, set above ours by default,
was hit). Further steps follow the text-env convention (:mod:`crl_bench.text_env`): the final
observation again with a note, reward 0, the same end flags, ``action_valid=False``. After
``close()``, ``reset``/``step`` raise a ``RuntimeError`` saying to make a new env.

Seeding and task ids: a task id is a *level seed*, the decimal string of NetHack's level-generator
seed (NLE's ``lgen``), so the same task id always gives the same level layout.
``reset(seed=s)`` uses level seed ``s`` (disjoint seed ranges are therefore disjoint level sets)
and draws NetHack's ``core`` and ``disp`` seeds from the env's seeded ``np_random``;
``options={"task_id": "123"}`` picks the level explicitly; with neither, the level seed is drawn
from ``np_random``. NetHack's reseeding is off and the moon phase is fixed, so the same seed and
actions give identical observations and rewards.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from crl_bench.envs.minihack.actions import ActionWord, build_action_words, normalise_action
from crl_bench.envs.minihack import official
from crl_bench.envs.minihack.language import VIEWS, describe
from crl_bench.envs.minihack.tasks import PAPER_MAX_STEPS, des_file_for, des_for_seed, goal_for
from crl_bench.text_env import TextEnv, coerce_action, reset_options, safe_text

LEVEL_SEED_LIMIT = 2**63  # NLE seeds are C unsigned longs; we keep them in int64 range
_NEEDED_KEYS = ("glyphs", "chars", "blstats", "message")
OFFICIAL_KEYS = ("glyphs", "message", "chars_crop", "glyphs_crop", "screen_descriptions", "chars")
"""The NLE observation keys under ``view="official"``, in the official order: the launched
config's (``multitask_env_tool.yaml:275``) with ``chars`` appended (``env.py:156-164``), so the
observation dict (``info["raw_obs"]``, which the official retrieval query prints) has the same
keys in the same order."""
ENV_VIEWS: tuple[str, ...] = VIEWS + ("official",)
"""``view=`` values: the language views of :mod:`crl_bench.envs.minihack.language` and
``"official"`` (:mod:`crl_bench.envs.minihack.official`)."""
_DIRECTION_PROMPT = b"In what direction?"
_SHOWN_ACTION_CHARS = 40


def parse_task_id(task_id: Any) -> int:
    """A MiniHack task id (level seed) as an int.

    Raises:
        ValueError: not a non-negative integer (or its decimal string) below 2**63.
    """
    if isinstance(task_id, (bool, float)) or not isinstance(task_id, (int, str, np.integer)):
        raise ValueError(f"options['task_id'] must be a level seed, a non-negative integer or its "
                         f"decimal string (e.g. '42'); got {task_id!r}.")
    text = str(task_id).strip()
    if not text.isdigit() or int(text) >= LEVEL_SEED_LIMIT:
        raise ValueError(f"options['task_id'] must be a level seed, a non-negative integer below "
                         f"2**63 or its decimal string (e.g. '42'); got {task_id!r}.")
    return int(text)


def nethack_seeds(np_random: np.random.Generator, seed: int | None,
                  task_id: Any = None) -> tuple[int, int, int]:
    """NetHack's (level, core, disp) seeds for a reset (see the module docstring).

    Args:
        np_random: the env's generator, already seeded with ``seed`` when one was given.
        seed: the ``reset`` seed, or None.
        task_id: ``options["task_id"]``, or None.
    """
    if task_id is not None:
        level_seed = parse_task_id(task_id)
    elif seed is not None:
        level_seed = int(seed) % LEVEL_SEED_LIMIT
    else:
        level_seed = int(np_random.integers(0, 2**31))
    core, disp = (int(v) for v in np_random.integers(0, LEVEL_SEED_LIMIT - 1, size=2))
    return level_seed, core, disp


class MiniHackTextEnv(TextEnv):
    """A MiniHack task as a text env (see the module docstring for the full contract).

    Args:
        task: a MiniHack gymnasium id, e.g. ``"MiniHack-Room-Ultimate-5x5-v0"``.
        max_steps: actions per episode before ``truncated`` (the paper uses 30).
        show_map: append a cropped ASCII map (11 x 21 squares around the agent).
        view: ``"full"`` (every feature, open directions, health) or ``"compact"`` (single
            features and the message only), see :mod:`crl_bench.envs.minihack.language`; or
            ``"official"``: the official env's text (:mod:`crl_bench.envs.minihack.official`).
        render_mode: ``"ansi"`` (``render()`` returns the last observation) or None.
        **minihack_kwargs: passed to the MiniHack env (e.g. ``reward_win``, ``penalty_step``,
            ``max_episode_steps``, ``actions``). Defaults set here: ``fix_moon_phase=True`` and
            ``max_episode_steps = 3 * max_steps + 10`` (so our cap, not MiniHack's, ends episodes).
    """

    family = "minihack"
    metadata: dict[str, Any] = {"render_modes": ["ansi"]}

    def __init__(self, task: str = "MiniHack-Room-5x5-v0", max_steps: int = PAPER_MAX_STEPS,
                 show_map: bool = False, view: str = "full", render_mode: str | None = None,
                 **minihack_kwargs: Any) -> None:
        if view not in ENV_VIEWS:
            raise ValueError(f"view={view!r}: use one of {', '.join(ENV_VIEWS)} (e.g. "
                             "gymnasium.make(env_id, view=\"compact\")).")
        if view == "official" and "observation_keys" in minihack_kwargs:
            raise ValueError("view='official' reads the official observation keys "
                             f"({', '.join(OFFICIAL_KEYS)}); drop observation_keys=.")
        super().__init__(max_steps=max_steps, render_mode=render_mode)
        self.task = task
        self.show_map = bool(show_map)
        self.view = view
        self.goal = goal_for(task)
        self._nle = _make_minihack(task, max_steps, minihack_kwargs,
                                   keys=OFFICIAL_KEYS if view == "official" else None)
        self._des_for_seed = des_for_seed(task)
        self._des = des_file_for(task)  # the level description the game holds now
        self._words: tuple[ActionWord, ...] = build_action_words(self._nle.actions)
        self._word_by_text = {w.text: w for w in self._words}
        self.admissible_actions: list[str] = [w.text for w in self._words]
        if view == "official":  # the official names, in MiniHack's action order
            self._official_names = _official_names(self._nle.actions, self._words)
            for name, word in self._official_names:
                self._word_by_text.setdefault(name, word)
            self.admissible_actions = [name for name, _ in self._official_names]
            self._official_prompt = official.prompt_info(self.admissible_actions)
        self._steps = 0
        self._task_id = ""
        self._description = ""
        self._done: tuple[bool, bool] | None = None  # (terminated, truncated) once over
        self._success = False
        self._end_status = "RUNNING"
        self._started = False

    @property
    def nle_env(self) -> Any:
        """The wrapped MiniHack env (for benchmarks and debugging, not for agents)."""
        return self._nle

    # -- gymnasium API ---------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        options = reset_options(options)
        self._require_open("reset")
        super().reset(seed=seed)
        self.start_episode()
        level_seed, core, disp = nethack_seeds(self.np_random, seed, options.get("task_id"))
        if self._des_for_seed is not None:  # a level of ours whose layout the seed sets
            des = self._des_for_seed(level_seed)
            if des != self._des:
                self._nle.update(des)  # MiniHack compiles it into the game's level file
                self._des = des
        self._nle.seed(core, disp, reseed=False, lgen=level_seed)
        nle_obs, _nle_info = self._nle.reset()
        self._task_id = str(level_seed)
        self._steps = 0
        self._done = None
        self._success = False
        self._end_status = "RUNNING"
        self._started = True
        self._description = safe_text(self._describe(nle_obs))
        self._last_observation = self._description
        info = self._info(action_valid=True)
        # the NLE observation dict itself: the official MiniHack retrieval query prints it
        # (env/minihack/env.py:325-329, traj_env_manager.py:146-148; experience.query=family)
        # (copied: NLE writes later steps into the same arrays)
        info["raw_obs"] = {k: (v.copy() if hasattr(v, "copy") else v) for k, v in nle_obs.items()}
        return self._description, info

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not self._started:
            raise RuntimeError("Call reset() before step() on MiniHackTextEnv.")
        self._require_open("step")
        text = coerce_action(action)
        after_end = self.step_after_end()
        if after_end is not None:
            return after_end
        self._steps += 1
        word = self._word_by_text.get(normalise_action(text))
        if word is None and self.view == "official":  # env.py:349-353
            obs = self._description + official.INVALID_ACTION
            truncated = self._steps >= self.max_steps
            if truncated:
                self._done = (False, True)
            return self.finish_step(obs, 0.0, False, truncated, self._info(action_valid=False))
        if word is None:
            obs = (f"Unknown action {_shown(text)}: nothing happened. Valid actions: "
                   f"{', '.join(self.admissible_actions)}.\n{self._description}")
            truncated = self._steps >= self.max_steps
            if truncated:
                obs += f"\n{self._outcome(truncated_by_cap=True)}"
                self._done = (False, True)
            return self.finish_step(obs, 0.0, False, truncated, self._info(action_valid=False))

        reward, terminated, nle_truncated = 0.0, False, False
        nle_obs: dict[str, np.ndarray] | None = None
        for i, index in enumerate(word.steps):
            if i > 0 and _DIRECTION_PROMPT not in nle_obs["message"].tobytes():  # type: ignore
                break  # the command did not ask for a direction
            nle_obs, r, done, nle_truncated, nle_info = self._nle.step(index)
            reward += float(r)
            if done:
                status = nle_info["end_status"]
                self._end_status = status.name
                self._success = status == self._nle.StepStatus.TASK_SUCCESSFUL
                terminated = not nle_truncated
                break
        assert nle_obs is not None
        truncated = nle_truncated or (not terminated and self._steps >= self.max_steps)
        if self.view == "official":  # env.py:379-394: NLE's last screen and the action list
            self._description = safe_text(self._describe(nle_obs))
            obs = self._description + official.action_list(self.admissible_actions)
        elif terminated or nle_truncated:
            # NLE has ended the game and its buffers now hold a blank screen: the outcome is
            # all there is to say (the last description would be out of date).
            obs = self._outcome(truncated_by_cap=False)
        else:
            self._description = self._describe(nle_obs)
            obs = self._description
            if truncated:
                obs += "\n" + self._outcome(truncated_by_cap=True)
        if terminated or truncated:
            self._done = (terminated, truncated)
        return self.finish_step(obs, reward, terminated, truncated, self._info(action_valid=True))

    def _require_open(self, what: str) -> None:
        if getattr(self, "_nle", None) is None:
            raise RuntimeError(f"MiniHackTextEnv.{what}() after close(): the NetHack process is "
                               "gone; make a new env (gymnasium.make(...)) instead.")

    def close(self) -> None:
        nle = getattr(self, "_nle", None)
        if nle is not None:
            nle.close()
            self._nle = None
        super().close()

    # -- helpers ---------------------------------------------------------------------------------
    def _describe(self, nle_obs: dict[str, np.ndarray]) -> str:
        if self.view == "official":
            return official.render_observation(nle_obs)
        return describe(nle_obs["glyphs"], nle_obs["blstats"], nle_obs["message"],
                        nle_obs["chars"], show_map=self.show_map, view=self.view)

    def _outcome(self, truncated_by_cap: bool) -> str:
        if self._success:
            return "Outcome: you reached the goal. Task complete."
        if self._end_status == "DEATH":
            return "Outcome: you died. Task failed."
        if truncated_by_cap:
            return f"Outcome: you used all {self.max_steps} actions. Task failed."
        return "Outcome: the game's own step limit was reached. Task failed."

    def _info(self, action_valid: bool) -> dict[str, Any]:
        extra = {}
        if self.view == "official":  # the prompt builder's official pieces (every info)
            extra["official_prompt"] = self._official_prompt
        return self.make_info(**extra, goal=self.goal, admissible_actions=self.admissible_actions,
                              success=self._success, score=1.0 if self._success else 0.0,
                              action_valid=action_valid, task_id=self._task_id,
                              end_status=self._end_status, steps=self._steps)


def _shown(text: str) -> str:
    short = text[:_SHOWN_ACTION_CHARS]
    return repr(short) + ("..." if len(text) > _SHOWN_ACTION_CHARS else "")


def _official_names(nle_actions: Any, words: tuple[ActionWord, ...]) -> list[tuple[str, ActionWord]]:
    """The official action names of ``nle_actions`` in their order, each with the word it
    presses (:func:`crl_bench.envs.minihack.official.official_action_name`); a command with no
    official name here keeps its words."""
    by_index = {w.steps[0]: w for w in words if len(w.steps) == 1}
    names: list[tuple[str, ActionWord]] = []
    listed: set[str] = set()
    for index, action in enumerate(nle_actions):
        name = official.official_action_name(action)
        if name is not None and index in by_index:
            names.append((name, by_index[index]))
            listed.add(by_index[index].text)
    for w in words:
        if w.text not in listed and all(n != w.text for n, _ in names):
            names.append((w.text, w))
    return names


def _make_minihack(task: str, max_steps: int, minihack_kwargs: dict[str, Any],
                   keys: tuple[str, ...] | None = None) -> Any:
    """Instantiate MiniHack's class for ``task`` directly (no gymnasium wrappers around it);
    ``keys``: exactly these observation keys (else the task's own and those we read)."""
    from crl_bench.envs.minihack._nle_import import import_minihack

    import_minihack()
    import gymnasium
    from gymnasium.envs.registration import load_env_creator

    des_file = des_file_for(task)
    known = sorted(k for k in gymnasium.registry if k.startswith("MiniHack-"))
    if des_file is not None:  # a level of our own: MiniHack's custom navigation class runs it
        if "des_file" in minihack_kwargs:
            raise ValueError(f"{task} has its own level; drop des_file= (or use "
                             "'MiniHack-Navigation-Custom-v0' with your des_file).")
        minihack_kwargs = {**minihack_kwargs, "des_file": des_file}
        task = "MiniHack-Navigation-Custom-v0"
    if task not in known:
        raise ValueError(f"Unknown MiniHack task {task!r}. Use a MiniHack gymnasium id, e.g. "
                         f"'MiniHack-Room-5x5-v0'; MiniHack registers: {', '.join(known)}.")
    spec = gymnasium.spec(task)
    kwargs = dict(spec.kwargs)
    kwargs.update(minihack_kwargs)
    kwargs.setdefault("fix_moon_phase", True)
    kwargs.setdefault("max_episode_steps", 3 * max_steps + 10)
    own = list(kwargs.pop("observation_keys", ()))
    kwargs["observation_keys"] = list(keys) if keys is not None else \
        own + [k for k in _NEEDED_KEYS if k not in own]
    return load_env_creator(spec.entry_point)(**kwargs)
