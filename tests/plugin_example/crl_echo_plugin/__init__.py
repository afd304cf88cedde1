"""An out-of-tree env plugin: the agent must repeat a secret word shown in the observation."""

from __future__ import annotations

from typing import Any

from crl_bench import TextEnv, register_env
from crl_bench.text_env import coerce_action, echo_text, reset_options

WORDS = ("apple", "river", "stone", "cloud", "ember", "maple")

SYSTEM_PROMPT = ("You play a word game. Each turn, answer with exactly one action from the list "
                 "you are given, like 'say apple'.")


def register_envs() -> None:
    """Entry point of group ``crl_bench.envs``: called once, on demand, by crl-bench."""
    register_env("crl/Echo-v0", "crl_echo_plugin:EchoEnv", family="echo",
                 description="repeat the secret word (plugin example)",
                 source="entry-point:crl-echo-plugin", system_prompt=SYSTEM_PROMPT)


class EchoEnv(TextEnv):
    family = "echo"

    def __init__(self, max_steps: int = 3, render_mode: str | None = None) -> None:
        super().__init__(max_steps=max_steps, render_mode=render_mode)
        self._word = ""
        self._steps = 0

    def _info(self, valid: bool, success: bool) -> dict[str, Any]:
        return self.make_info(goal="Say the secret word.", admissible_actions=[f"say {w}" for w in WORDS],
                              success=success, score=1.0 if success else 0.0, action_valid=valid,
                              task_id=self._word)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.start_episode()  # the episode has not ended (see step_after_end)
        self._word = reset_options(options).get("task_id") or WORDS[int(self.np_random.integers(len(WORDS)))]
        self._steps = 0
        self._last_observation = f"The secret word is {self._word}."
        return self._last_observation, self._info(True, False)

    def step(self, action: Any):
        after_end = self.step_after_end()  # a step after the end repeats the end, marked over
        if after_end is not None:
            return after_end
        text = coerce_action(action).strip().lower()
        self._steps += 1
        valid = text in {f"say {w}" for w in WORDS}
        success = text == f"say {self._word}"
        if not valid:
            obs = f"'{echo_text(text, 40)}' is not an action here. Say one word, like 'say apple'."
        else:
            obs = "Correct!" if success else "Wrong word."
        truncated = not success and self._steps >= self.max_steps
        # finish_step cleans the observation and remembers the episode's end
        return self.finish_step(obs, 1.0 if success else 0.0, success, truncated, self._info(valid, success))
