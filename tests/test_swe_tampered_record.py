"""A graded SWE episode's ``tampered`` reaches the run's records.

The SWE env grades a submission and says in ``info["grading"]["tampered"]`` whether its
canaries caught the submission hooking the tests (``envs/swe/evaluation.py``). The rollout engine
puts it into the trajectory's meta and the loop into the episode record and a per-step count
(``charts/swe_tampered``), for graded episodes only: other families' records keep their keys
(``tests/golden/tiny_records.json``). The official code grades SWE without canaries, so there is
no official value to take; the expected ``tampered`` is the grader's own verdict on the planted
hack (``tests/test_swe_hacks.py::test_generic_hack_gets_reward_0_and_is_recorded``).

Real parts: the SWE env on the ``mini`` task set (a real sandbox and pytest), the rollout engine
with the tiny model whose completion text is forced (``tests/_forced_backend.py``) to plant
``always_equal_result`` (``tests/_swe_generic_hacks.py``) and submit.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from _forced_backend import ForcedBackend  # noqa: E402
from _swe_generic_hacks import HACKS  # noqa: E402
from crl_bench.llm.rollout import EpisodeSpec, PromptConfig, RolloutEngine  # noqa: E402
from crl_bench.llm.types import SamplingParams  # noqa: E402
from crl_bench.run.loop import episode_record, tampered_count  # noqa: E402

TASK = "handykit__handykit-101"


def test_a_hacked_swe_submission_is_recorded_as_tampered():
    from crl_bench.envs.swe.env import SWETextEnv
    from crl_bench.llm.hf_backend import HFBackend

    env = SWETextEnv(task_set="mini", split="all", command_timeout_s=30, eval_timeout_s=120)
    actions: list[str] = []

    def policy(prompt: str) -> str:
        if not actions:
            actions.extend(HACKS["always_equal_result"](env.task) + ["submit"])
        return f"<answer>{actions.pop(0)}</answer>"
    backend = ForcedBackend(HFBackend("tiny-random", roles=("actor",), seed=0), policy)
    engine = RolloutEngine(backend, SamplingParams(max_new_tokens=1024, seed=0),
                           PromptConfig(history=0, max_asks=0), adapter="actor")
    try:
        (traj,) = engine.run([EpisodeSpec(env=env, seed=0, options={"task_id": TASK},
                                          group_id=0, task_name="swe-mini",
                                          with_experience=False, experience_ids=[],
                                          experience_text="", meta={})])
    finally:
        env.close()
    assert traj.error is None and traj.n_actions == 2 and traj.score == 0.0, traj.turns[-1]
    assert traj.meta["tampered"] is True
    record = episode_record(traj, "train", 1)
    assert record["tampered"] is True
    assert tampered_count([traj]) == 1


def test_episodes_that_were_not_graded_keep_their_keys():
    from crl_bench.llm.rollout import Trajectory

    traj = Trajectory(env_id="crl/MiniHack-Room-5x5-v0", task_name="room", task_id="t", seed=0,
                      goal="g", group_id=0, with_experience=False, experience_ids=[],
                      experience_text="", turns=[], reward=0.0, score=0.0, success=False,
                      n_actions=0, n_invalid_format=0, n_tool_calls=0, truncated=False,
                      tokens=0, wall_s=0.0, meta={"family": "minihack"})
    assert "tampered" not in episode_record(traj, "train", 1)
    assert tampered_count([traj]) is None
