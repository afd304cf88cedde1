"""No Search-and-Ask offer on a turn whose answer could not be acted on.

The engine's turn cap counts every turn, asks included (as officially: each reply is one
``env.step`` of the tool wrapper and one ``rollout_cache.step``, ``traj_env_manager.py:282-291``),
so on an episode's last turn an ask ends the episode without an action. With one-action episodes
(``rollout.env_max_steps={"minihack": 1}``) every with-experience episode was offered asks that
could only end it, and the offer's sentence in the prompt made the 135M actor break the answer
format more often (measured, `cpu` preset, Landmark, one step of 4 x 8 episodes, seed 0:
``exp_only``, every episode offered asks, sent an action in 15 of 32 episodes, ``grpo`` in 25 of
32). ``experience.ask_on_last_turn=false`` (all presets but ``paper``) offers no ask there.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("nle")


def play(max_steps: int, ask_on_last_turn: bool):
    import gymnasium

    import crl_bench  # noqa: F401  (registers the crl/ envs)
    from _forced_backend import ForcedBackend
    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.llm.rollout import EpisodeSpec, PromptConfig, RolloutEngine
    from crl_bench.llm.types import SamplingParams

    prompts: list[str] = []

    def policy(prompt: str) -> str:
        prompts.append(prompt)
        return "<ask>which rock hides the stairs?</ask>" if "<ask>" in prompt.rsplit(
            "assistant", 1)[0] else "<answer>north</answer>"

    backend = ForcedBackend(HFBackend("tiny-random", roles=("actor",), seed=0), policy)
    env = gymnasium.make("crl/MiniHack-Room-Landmark-5x5-v0", max_steps=max_steps, view="compact")
    engine = RolloutEngine(backend, SamplingParams(max_new_tokens=16, seed=0),
                           PromptConfig(history=0, max_asks=2), adapter="actor",
                           ask_callback=lambda q, spec, ctx: "Try north.",
                           ask_requires_experience=True, ask_on_last_turn=ask_on_last_turn)
    spec = EpisodeSpec(env=env, seed=3, options=None, group_id=0, task_name="landmark",
                       with_experience=True, experience_ids=[], experience_text="", meta={})
    (traj,) = engine.run([spec])
    env.close()
    return traj, prompts


def test_a_one_action_episode_is_not_offered_an_ask_and_acts():
    traj, prompts = play(max_steps=1, ask_on_last_turn=False)
    assert "<ask>" not in prompts[0]
    assert traj.n_actions == 1 and traj.n_tool_calls == 0


def test_asking_on_the_last_turn_ends_the_episode_without_an_action_when_allowed():
    """The official behaviour (``paper``): the offer stands on the last turn and the ask takes
    the only turn."""
    traj, prompts = play(max_steps=1, ask_on_last_turn=True)
    assert "<ask>" in prompts[0]
    assert traj.n_actions == 0 and traj.n_tool_calls == 1


def test_longer_episodes_are_offered_asks_until_their_last_turn():
    traj, prompts = play(max_steps=3, ask_on_last_turn=False)
    # turns 1-2 offered (and used) asks, turn 3 (the last) was not offered one and acted
    assert [("<ask>" in p.rsplit("assistant", 1)[0]) for p in prompts] == [True, True, False]
    assert traj.n_tool_calls == 2 and traj.n_actions == 1
