"""The contract checker itself: it passes a good env and catches each kind of broken env."""

from __future__ import annotations

from typing import Any

import pytest

from crl_bench.env_check import TextEnvCheckError, check_text_env
from crl_bench.text_env import (
    EPISODE_OVER_NOTE,
    TextEnv,
    TextSpace,
    coerce_action,
    echo_text,
    is_safe_text,
    reset_options,
    safe_text,
)


class Counter(TextEnv):
    """Say 'up' three times. Small, but a complete text env."""

    family = "test"

    def __init__(self, max_steps: int = 5, crash_on_garbage: bool = False, nondeterministic: bool = False,
                 drop_key: str | None = None, echo_raw: bool = False, steps_after_end: str = "keep",
                 options_unchecked: bool = False):
        super().__init__(max_steps=max_steps)
        self.echo_raw = echo_raw
        self.steps_after_end = steps_after_end  # "keep" (the convention), "silent" or "raise"
        self.options_unchecked = options_unchecked
        self.crash_on_garbage = crash_on_garbage
        self.nondeterministic = nondeterministic
        self.drop_key = drop_key
        self.n = 0
        self.t = 0
        self.calls = 0

    def _info(self, valid: bool) -> dict[str, Any]:
        info = self.make_info(goal="reach 3", admissible_actions=["up", "down"], success=self.n >= 3,
                              score=1.0 if self.n >= 3 else 0.0, action_valid=valid, task_id="counter")
        if self.drop_key:
            info.pop(self.drop_key)
        return info

    def reset(self, *, seed=None, options=None):
        if self.options_unchecked:
            (options or {}).get("task_id")  # AttributeError on a str, as the envs used to
        else:
            reset_options(options)
        super().reset(seed=seed)
        self.start_episode()
        self.n = int(self.np_random.integers(0, 2))
        self.t = 0
        return f"count {self.n}", self._info(True)

    def step(self, action):
        text = coerce_action(action).strip()
        if self.episode_over:
            if self.steps_after_end == "raise":
                raise RuntimeError("episode over")
            if self.steps_after_end == "keep":
                return self.step_after_end()
            # "silent", as WebShop and ALFWorld used to: a note, but both flags False
            return "the episode is over", 0.0, False, False, self._info(False)
        self.t += 1
        self.calls += 1
        if text not in ("up", "down"):
            if self.crash_on_garbage:
                raise ValueError("bad action")
            shown = text[:40] if self.echo_raw else echo_text(text, 40)
            obs, valid = f"unknown action {shown}; say up or down (count {self.n})", False
        else:
            self.n += 1 if text == "up" else -1
            obs, valid = f"count {self.n}", True
        if self.nondeterministic:
            obs += f" call {self.calls}"
        done = self.n >= 3
        result = (obs, float(done), done, (not done and self.t >= self.max_steps), self._info(valid))
        if self.echo_raw:
            if done or result[3]:
                self._episode_end = (obs, done, result[3], result[4])
            return result
        return self.finish_step(*result)


def test_good_env_passes():
    report = check_text_env(Counter())
    assert any("fuzzed" in c for c in report.checks)
    assert any("identical" in c for c in report.checks)


def test_exception_on_invalid_action_is_caught():
    with pytest.raises(TextEnvCheckError, match="raised ValueError"):
        check_text_env(Counter(crash_on_garbage=True), skip_gym_check=True)


def test_nondeterminism_is_caught():
    with pytest.raises(TextEnvCheckError, match="different results"):
        check_text_env(Counter(nondeterministic=True), skip_gym_check=True)


def test_missing_info_key_is_caught():
    with pytest.raises(TextEnvCheckError, match="action_valid"):
        check_text_env(Counter(drop_key="action_valid"), skip_gym_check=True)


@pytest.mark.parametrize("raw", ["click[\ud800]", "look\x1b[31mred", "\x00\x07bell"])
def test_env_echoing_raw_text_fails(raw, monkeypatch):
    # the env quotes the action unescaped: a lone surrogate (not UTF-8) or an ANSI escape
    from crl_bench import env_check

    monkeypatch.setattr(env_check, "FUZZ_ACTIONS", ("nothing", raw))
    with pytest.raises(TextEnvCheckError, match="observation (is not valid UTF-8|holds control)"):
        check_text_env(Counter(echo_raw=True), skip_gym_check=True)


def test_env_echoing_raw_text_fails_on_the_default_fuzz():
    with pytest.raises(TextEnvCheckError, match="observation"):
        check_text_env(Counter(echo_raw=True), skip_gym_check=True)


def test_env_stepping_on_silently_after_the_end_fails():
    with pytest.raises(TextEnvCheckError, match="after the episode ended returned terminated=False"):
        check_text_env(Counter(steps_after_end="silent"), skip_gym_check=True)


def test_env_raising_after_the_end_fails():
    with pytest.raises(TextEnvCheckError, match="after the episode ended raised RuntimeError"):
        check_text_env(Counter(steps_after_end="raise"), skip_gym_check=True)


def test_options_not_a_dict_must_be_a_clear_error():
    with pytest.raises(TextEnvCheckError, match="notadict.*AttributeError"):
        check_text_env(Counter(options_unchecked=True), skip_gym_check=True)
    with pytest.raises(TypeError, match="must be a dict"):
        reset_options("notadict")
    assert reset_options(None) == {} and reset_options({"task_id": 1}) == {"task_id": 1}


def test_step_after_end_keeps_the_end():
    env = Counter(max_steps=2)
    env.reset(seed=0)
    env.step("down")
    final = env.step("down")
    assert final[3] is True and final[2] is False
    for _ in range(2):
        obs, reward, terminated, truncated, info = env.step("up")
        assert (reward, terminated, truncated, info["action_valid"]) == (0.0, False, True, False)
        assert obs == final[0] + "\n" + EPISODE_OVER_NOTE
    env.reset(seed=0)
    assert env.step("up")[4]["action_valid"] is True


def test_safe_text_escapes_surrogates_and_controls_but_keeps_newlines():
    text = "a\x1b[31mb\ud800c\n\td\x7f\x9b\r"
    assert safe_text(text) == "a\\x1b[31mb\\ud800c\n\td\\x7f\\x9b\\x0d"
    assert is_safe_text(safe_text(text)) and not is_safe_text(text)
    safe_text(text).encode("utf-8")
    assert echo_text("x\ny" * 40, limit=10) == "x yx yx yx..."
    assert safe_text("nörd 北 🚀") == "nörd 北 🚀"


def test_text_space_accepts_any_text_and_samples_words():
    space = TextSpace(seed=0)
    assert "go north" in space and "北 \x00" in space and 3 not in space
    assert all(isinstance(space.sample(), str) for _ in range(5))
