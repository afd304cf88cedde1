"""The contract checker itself: it passes a good env and catches each kind of broken env."""

from __future__ import annotations

from typing import Any

import pytest

from crl_bench.env_check import TextEnvCheckError, check_text_env
from crl_bench.text_env import TextEnv, TextSpace, coerce_action


class Counter(TextEnv):
    """Say 'up' three times. Small, but a complete text env."""

    family = "test"

    def __init__(self, max_steps: int = 5, crash_on_garbage: bool = False, nondeterministic: bool = False,
                 drop_key: str | None = None):
        super().__init__(max_steps=max_steps)
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
        super().reset(seed=seed)
        self.n = int(self.np_random.integers(0, 2))
        self.t = 0
        return f"count {self.n}", self._info(True)

    def step(self, action):
        text = coerce_action(action).strip()
        self.t += 1
        self.calls += 1
        if text not in ("up", "down"):
            if self.crash_on_garbage:
                raise ValueError("bad action")
            obs, valid = f"unknown action; say up or down (count {self.n})", False
        else:
            self.n += 1 if text == "up" else -1
            obs, valid = f"count {self.n}", True
        if self.nondeterministic:
            obs += f" call {self.calls}"
        done = self.n >= 3
        return obs, float(done), done, (not done and self.t >= self.max_steps), self._info(valid)


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


def test_text_space_accepts_any_text_and_samples_words():
    space = TextSpace(seed=0)
    assert "go north" in space and "北 \x00" in space and 3 not in space
    assert all(isinstance(space.sample(), str) for _ in range(5))
