"""The text-env contract every crl-bench environment keeps (DESIGN §2).

A text env is a ``gymnasium.Env[str, str]``:

* ``reset(seed=None, options={"task_id": ...}) -> (observation, info)``
* ``step(action_text) -> (observation, reward, terminated, truncated, info)``

``info`` always carries the keys in :data:`INFO_KEYS`:

=====================  =========================================================================
``goal``               the task's goal sentence (str)
``admissible_actions`` list of valid action strings, or ``None`` for free-form envs (SWE)
``success``            whether the task is solved (bool; ``False`` until it is)
``score``              the task score in [0, 1] (WebShop's reward, SWE's fraction of tests, ...)
``action_valid``       whether the last action was understood and executed (``True`` after reset)
``task_id``            identifier of the task instance (str), usable as ``options["task_id"]``
=====================  =========================================================================

An invalid action is *feedback* (an observation saying so, ``action_valid=False``), never an
exception. ``terminated`` means the task ended (won or lost); ``truncated`` means the step cap
was hit. They are never merged into ``done``.
"""

from __future__ import annotations

import string
from typing import Any, Sequence

import gymnasium as gym
import numpy as np

INFO_KEYS: tuple[str, ...] = ("goal", "admissible_actions", "success", "score", "action_valid",
                              "task_id")

_PRINTABLE = string.ascii_letters + string.digits + string.punctuation + " "


class TextSpace(gym.spaces.Space[str]):
    """Any Python ``str`` of at most ``max_length`` characters.

    Unlike ``gymnasium.spaces.Text`` it accepts every character (observations contain non-ASCII
    text, action fuzzing sends control characters). ``sample()`` draws printable ASCII, spaces
    included, so sampled actions look like words.
    """

    def __init__(self, max_length: int = 1_000_000, seed: int | np.random.Generator | None = None,
                 samples: Sequence[str] | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)
        self.max_length = int(max_length)
        self._samples = list(samples) if samples else None

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        if self._samples:
            return self._samples[int(self.np_random.integers(len(self._samples)))]
        n = int(self.np_random.integers(1, 24))
        idx = self.np_random.integers(len(_PRINTABLE), size=n)
        return "".join(_PRINTABLE[i] for i in idx)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"TextSpace(max_length={self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, TextSpace) and other.max_length == self.max_length


class TextEnv(gym.Env[str, str]):
    """Base class for crl-bench text envs.

    Subclasses set :attr:`family` and implement ``reset``/``step`` (calling
    ``super().reset(seed=seed)`` first) and build ``info`` with :meth:`make_info`.
    :attr:`max_steps` is the episode's action cap (the step that reaches it returns
    ``truncated=True``).
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"]}
    family: str = "text"

    def __init__(self, max_steps: int = 30, render_mode: str | None = None) -> None:
        if max_steps <= 0:
            raise ValueError(f"max_steps must be positive, got {max_steps}.")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode {render_mode!r} is not supported; use one of "
                             f"{self.metadata['render_modes']} or None.")
        self.max_steps = int(max_steps)
        self.render_mode = render_mode
        self.observation_space = TextSpace()
        self.action_space = TextSpace()
        self._last_observation = ""

    @staticmethod
    def make_info(*, goal: str, admissible_actions: list[str] | None, success: bool,
                  score: float, action_valid: bool, task_id: str, **extra: Any) -> dict[str, Any]:
        """Build an ``info`` dict with every documented key (and family-specific extras)."""
        info: dict[str, Any] = {
            "goal": goal,
            "admissible_actions": list(admissible_actions) if admissible_actions is not None else None,
            "success": bool(success),
            "score": float(score),
            "action_valid": bool(action_valid),
            "task_id": str(task_id),
        }
        info.update(extra)
        return info

    def render(self) -> str | None:  # type: ignore[override]
        if self.render_mode == "ansi":
            return self._last_observation
        return None


def coerce_action(action: Any) -> str:
    """Turn whatever the caller passed into text; the env then judges it as feedback."""
    if isinstance(action, bytes):
        return action.decode("utf-8", errors="replace")
    if isinstance(action, np.ndarray) and action.shape == ():
        action = action.item()
    return action if isinstance(action, str) else str(action)
