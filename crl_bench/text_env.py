"""The text-env contract every crl-bench environment keeps.

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

**Observations are clean text**: they encode as UTF-8 and hold no control characters other than
``"\n"`` and ``"\t"``. Text that comes from the caller (an invalid action quoted back) is shown
through :func:`echo_text`, which escapes lone surrogates, control characters and ANSI escape
sequences (``"\x1b[31m"`` reads as those characters) and clips it; :func:`safe_text` does the
same for whole observations.

**After an episode ends** (a step returned ``terminated`` or ``truncated``), every further
``step()`` until ``reset()`` changes nothing and returns the episode's final observation followed
by :data:`EPISODE_OVER_NOTE`, reward ``0.0``, the same ``terminated``/``truncated`` flags as the
step that ended it, and the final ``info`` with ``action_valid=False``. It does not raise: an RL
loop that steps once too often gets a harmless no-op. :class:`TextEnv` implements this
(:meth:`TextEnv.finish_step` records the end, :meth:`TextEnv.step_after_end` answers), and
``check-env`` enforces it.

``reset(options=...)`` takes ``None`` or a dict; anything else is a ``TypeError`` that says so
(:func:`reset_options`).
"""

from __future__ import annotations

import re
import string
from typing import Any, Mapping, Sequence

import gymnasium as gym
import numpy as np

INFO_KEYS: tuple[str, ...] = ("goal", "admissible_actions", "success", "score", "action_valid",
                              "task_id")

EPISODE_OVER_NOTE = "The episode is over; call reset() to start a new one."

# C0 controls except \t and \n, DEL, C1 controls, and the UTF-16 surrogates (never valid alone)
_UNSAFE_CHARS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def _escape_char(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe_text(text: str) -> str:
    """``text`` with every control character but ``\\n``/``\\t`` and every lone surrogate
    replaced by its escape (``"\\x1b"``, ``"\\ud800"``): valid UTF-8, no terminal control."""
    return _UNSAFE_CHARS.sub(_escape_char, text)


def is_safe_text(text: Any) -> bool:
    """Whether ``text`` is a str that :func:`safe_text` leaves unchanged."""
    return isinstance(text, str) and _UNSAFE_CHARS.search(text) is None


def echo_text(text: str, limit: int = 60) -> str:
    """Caller text to quote in an observation: newlines and tabs as spaces, at most ``limit``
    characters (then ``"..."``), unsafe characters escaped (:func:`safe_text`)."""
    text = text.replace("\n", " ").replace("\t", " ")
    clipped = text if len(text) <= limit else text[:limit] + "..."
    return safe_text(clipped)


def reset_options(options: Any) -> dict[str, Any]:
    """``reset``'s ``options`` as a dict (``None`` -> ``{}``); a non-dict is a ``TypeError``."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(f"reset(options=...) must be a dict such as {{'task_id': ...}} or None; "
                        f"got {type(options).__name__} {echo_text(repr(options))}.")
    return dict(options)


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
        self._episode_end: tuple[str, bool, bool, dict[str, Any]] | None = None

    # -- the episode-end convention (see the module docstring) ---------------------------------
    def start_episode(self) -> None:
        """Call from ``reset``: the new episode has not ended."""
        self._episode_end = None

    @property
    def episode_over(self) -> bool:
        """Whether the current episode has ended (a step returned terminated or truncated)."""
        return self._episode_end is not None

    def finish_step(self, observation: str, reward: float, terminated: bool, truncated: bool,
                    info: dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Return a step's result with a clean observation, remembering the end of the episode."""
        observation = safe_text(observation)
        self._last_observation = observation
        if terminated or truncated:
            self._episode_end = (observation, bool(terminated), bool(truncated), dict(info))
        return observation, reward, bool(terminated), bool(truncated), info

    def step_after_end(self) -> tuple[str, float, bool, bool, dict[str, Any]] | None:
        """The answer to a ``step`` after the episode ended, or ``None`` while it runs."""
        if self._episode_end is None:
            return None
        observation, terminated, truncated, info = self._episode_end
        observation = f"{observation}\n{EPISODE_OVER_NOTE}"
        self._last_observation = observation
        return observation, 0.0, terminated, truncated, {**info, "action_valid": False}

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
