"""The batched rollout engine on real envs (MiniHack) and real models.

* Control flow (asks, limits, penalties, history) is driven by *forced decoding*: a policy picks
  each completion's text, and the real tiny model scores those tokens, so the recorded ids and
  log-probs are still the model's own bookkeeping.
* Sampling runs use the real models: tiny-random (determinism, exact log-probs) and, in the
  integration test, the embedded SmolLM2-135M playing 8 MiniHack Room-5x5 episodes.
"""

from __future__ import annotations

import json
from typing import Any

import gymnasium
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("nle")  # the minihack extra (MiniHack is imported through our shim)

import crl_bench  # noqa: E402,F401  (registers the crl/ envs)
from crl_bench.llm.hf_backend import HFBackend  # noqa: E402
from crl_bench.llm.prompting import parse_completion  # noqa: E402
from crl_bench.llm.rollout import (EpisodeSpec, PromptConfig, RolloutEngine,  # noqa: E402
                                   Trajectory)
from crl_bench.llm.types import SamplingParams  # noqa: E402
from crl_bench.text_env import TextEnv  # noqa: E402
from _forced_backend import ForcedBackend  # noqa: E402

ROOM = "crl/MiniHack-Room-5x5-v0"


class Recorder(gymnasium.Wrapper):
    """Keeps every action the env received and the latest info."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self.received: list[str] = []
        self.last_info: dict = {}

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        self.received, self.last_info = [], info
        return obs, info

    def step(self, action: str):
        self.received.append(action)
        out = self.env.step(action)
        self.last_info = out[4]
        return out


class CountdownEnv(TextEnv):
    """A second env family: say 'down' three times to win; anything else is feedback."""

    family = "countdown"

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.left, self.steps = 3, 0
        return "Counter at 3.", self._info(True)

    def _info(self, valid: bool) -> dict:
        return self.make_info(goal="Bring the counter to 0.", admissible_actions=["down", "up"],
                              success=self.left == 0, score=float(self.left == 0),
                              action_valid=valid, task_id="countdown")

    def step(self, action):
        self.steps += 1
        valid = action in ("down", "up")
        self.left += -1 if action == "down" else (1 if action == "up" else 0)
        done = self.left == 0
        obs = f"Counter at {self.left}." if valid else f"Unknown action {action!r}."
        return (obs, 1.0 if done else 0.0, done, self.steps >= self.max_steps and not done,
                self._info(valid))


@pytest.fixture(scope="module")
def tiny():
    return HFBackend("tiny-random", roles=("actor",), seed=0)


def current_observation(prompt_text: str) -> str:
    return prompt_text.split("Current observation")[-1]


def test_forced_episode_steps_env_with_exact_actions_and_bookkeeping(tiny):
    def policy(prompt):
        now = current_observation(prompt)
        if "Advice for your question" in now:
            return "<think>the advice says east</think><answer>east</answer>"
        if "Invalid format" in now:
            return "<ask>where are the stairs?</ask>"
        return "I will go south."          # no answer block: invalid format

    asked = []

    def ask(query, spec, context):
        asked.append((query, spec.task_name, context["goal"], context["turn"]))
        return "The stairs are to the southeast."

    backend = ForcedBackend(tiny, policy)
    env = Recorder(gymnasium.make(ROOM))
    engine = RolloutEngine(backend, SamplingParams(max_new_tokens=64),
                           PromptConfig(max_turns=4, format_penalty=0.1), ask_callback=ask)
    [traj] = engine.run([EpisodeSpec(env=env, seed=0, task_name="room", group_id=3)])
    assert [t.kind for t in traj.turns] == ["invalid", "ask", "action", "invalid"]
    assert asked == [("where are the stairs?", "room", traj.goal, 1)]
    assert env.received == ["east"] and traj.n_actions == 1
    assert traj.n_invalid_format == 2 and traj.n_tool_calls == 1
    assert traj.turns[1].observation == "The stairs are to the southeast."
    assert "Advice for your question" in tiny.tokenizer.decode(traj.turns[2].prompt_ids)
    assert traj.reward == pytest.approx(sum(t.reward for t in traj.turns))
    assert traj.turns[0].reward == pytest.approx(-0.1)
    assert traj.truncated and traj.meta["end_reason"] == "max_turns"
    assert (traj.group_id, traj.task_id, traj.seed) == (3, "0", 0)
    assert traj.success == env.last_info["success"] and traj.score == env.last_info["score"]
    for turn in traj.turns:
        assert turn.completion_text == tiny.tokenizer.decode(turn.completion_ids,
                                                             skip_special_tokens=True)
        assert len(turn.logprobs) == len(turn.completion_ids) == len(turn.loss_mask)
    restored = Trajectory.from_json(json.loads(json.dumps(traj.to_json())))
    assert restored == traj


def test_asks_are_capped_and_tokens_are_limited(tiny):
    backend = ForcedBackend(tiny, lambda prompt: "<ask>help me</ask>")
    env = gymnasium.make(ROOM)
    engine = RolloutEngine(backend, SamplingParams(max_new_tokens=64),
                           PromptConfig(max_turns=5, max_asks=2),
                           ask_callback=lambda q, spec, ctx: "no idea")
    [traj] = engine.run([EpisodeSpec(env=env, seed=1)])
    assert [t.kind for t in traj.turns] == ["ask", "ask", "invalid", "invalid", "invalid"]
    assert "<ask>" not in tiny.tokenizer.decode(traj.turns[2].prompt_ids).split("Admissible")[-1]
    # token budget: each forced completion is 5 tokens; 12 tokens allow 2 full turns + 2 tokens
    n_tokens = len(tiny.tokenizer("<ask>help me</ask>", add_special_tokens=False)["input_ids"])
    engine = RolloutEngine(backend, SamplingParams(max_new_tokens=64),
                           PromptConfig(max_turns=10, max_episode_tokens=2 * n_tokens + 2),
                           ask_callback=lambda q, spec, ctx: "no idea")
    [traj] = engine.run([EpisodeSpec(env=gymnasium.make(ROOM), seed=1)])
    assert [len(t.completion_ids) for t in traj.turns] == [n_tokens, n_tokens, 2]
    assert traj.tokens == 2 * n_tokens + 2 and traj.meta["end_reason"] == "max_episode_tokens"


def test_mixed_families_share_one_generate_call_per_turn(tiny):
    seen_systems = set()

    def policy(prompt):
        seen_systems.add(prompt.split("<|im_end|>")[0])
        return "<answer>down</answer>" if "Counter" in prompt else "<answer>south</answer>"

    backend = ForcedBackend(tiny, policy)
    envs = [CountdownEnv(max_steps=10), Recorder(gymnasium.make(ROOM)), CountdownEnv(max_steps=10)]
    engine = RolloutEngine(backend, SamplingParams(), PromptConfig(max_turns=5, history=1))
    trajs = engine.run([EpisodeSpec(env=e, seed=i) for i, e in enumerate(envs)])
    assert backend.calls == [3, 3, 3, 1, 1]          # countdowns end after 3 turns
    assert [t.success for t in (trajs[0], trajs[2])] == [True, True]
    assert trajs[0].reward == 1.0 and trajs[0].n_actions == 3 and not trajs[0].truncated
    assert trajs[0].meta["end_reason"] == "terminated"
    assert trajs[1].env_id == ROOM and envs[1].received == ["south"] * trajs[1].n_actions
    assert len(seen_systems) == 2                    # one system prompt per family
    last_prompt = tiny.tokenizer.decode(trajs[0].turns[2].prompt_ids)
    assert "[Turn 2]" in last_prompt and "[Turn 1]" not in last_prompt   # history window of 1


def test_same_seed_same_trajectories_and_exact_logprobs_tiny(tiny):
    def run(seed):
        specs = [EpisodeSpec(env=gymnasium.make(ROOM), seed=s, group_id=s) for s in range(3)]
        engine = RolloutEngine(tiny, SamplingParams(temperature=0.9, max_new_tokens=12,
                                                    seed=seed), PromptConfig(max_turns=3))
        trajs = engine.run(specs)
        return trajs, [{**t.to_json(), "wall_s": 0, "meta": {}} for t in trajs]

    trajs, a = run(5)
    _, b = run(5)
    _, c = run(6)
    assert a == b
    assert [t["turns"][0]["completion_ids"] for t in a] != \
        [t["turns"][0]["completion_ids"] for t in c]
    for traj in trajs:
        assert len(traj.turns) == 3
        turns = traj.turns
        again = tiny.logprobs([t.prompt_ids for t in turns], [t.completion_ids for t in turns],
                              temperature=0.9)
        for turn, lps in zip(turns, again):
            assert turn.completion_text == tiny.tokenizer.decode(turn.completion_ids,
                                                                 skip_special_tokens=True)
            assert max(abs(x - y) for x, y in zip(lps, turn.logprobs)) <= 1e-3


def test_each_episode_needs_its_own_env(tiny):
    env = gymnasium.make(ROOM)
    with pytest.raises(ValueError, match="its own env instance"):
        RolloutEngine(tiny, SamplingParams()).run([EpisodeSpec(env=env, seed=0),
                                                   EpisodeSpec(env=env, seed=1)])


@pytest.mark.slow
def test_embedded_smollm2_plays_8_minihack_room_episodes():
    backend = HFBackend("smollm2-135m", roles=("actor",))
    # short prompts and completions keep this near 30 s on an idle 2-core machine
    prompt = PromptConfig.for_small_model(max_turns=6, history=1)
    envs = [Recorder(gymnasium.make(ROOM)) for _ in range(8)]
    engine = RolloutEngine(backend, SamplingParams(temperature=1.0, max_new_tokens=12, seed=0),
                           prompt)
    trajs = engine.run([EpisodeSpec(env=e, seed=100 + i, group_id=i // 4)
                        for i, e in enumerate(envs)])
    assert len(trajs) == 8 and engine.last_stats["generate_calls"] <= 6
    tok = backend.tokenizer
    for traj, env in zip(trajs, envs):
        assert 1 <= len(traj.turns) <= 6
        actions = [t.action for t in traj.turns if t.kind == "action"]
        assert env.received == actions and traj.n_actions == len(actions)
        for turn in traj.turns:
            assert turn.completion_text == tok.decode(turn.completion_ids, skip_special_tokens=True)
            parsed = parse_completion(prompt.response_prefix + turn.completion_text, prompt)
            assert parsed.action == turn.action
        assert traj.success == env.last_info["success"]
        assert traj.tokens == sum(len(t.completion_ids) for t in traj.turns)
    turns = [t for traj in trajs[:2] for t in traj.turns]   # recomputation is a full prefill
    again = backend.logprobs([t.prompt_ids for t in turns], [t.completion_ids for t in turns])
    gap = max(abs(x - y) for turn, lps in zip(turns, again) for x, y in zip(lps, turn.logprobs))
    assert gap <= 1e-3
    assert sum(t.n_actions for t in trajs) >= 8    # the real model does act, not only babble


# ---------------------------------------------------------------------------------------------
# an env that raises: the episode ends with the error recorded, the run goes on (issue 20)
# ---------------------------------------------------------------------------------------------

RAISING = "crl/TestRaising-v0"


class RaisingEnv(TextEnv):
    """'down' three times wins; ``open <path>`` opens a file for real (a path component over 255
    characters makes the OS raise ENAMETOOLONG out of ``step``, as SWE's ``view`` did); with
    ``raise_every_step`` every action raises; odd seeds with ``raise_on_odd_reset`` fail in
    ``reset``."""

    family = "raising"

    def __init__(self, max_steps: int = 6, raise_every_step: bool = False,
                 raise_on_odd_reset: bool = False) -> None:
        super().__init__(max_steps=max_steps)
        self.raise_every_step, self.raise_on_odd_reset = raise_every_step, raise_on_odd_reset

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.raise_on_odd_reset and seed is not None and seed % 2:
            raise RuntimeError(f"cannot build level {seed}")
        self.left, self.steps = 3, 0
        return "Counter at 3.", self._info(True)

    def _info(self, valid: bool) -> dict:
        return self.make_info(goal="Bring the counter to 0.", admissible_actions=None,
                              success=self.left == 0, score=float(self.left == 0),
                              action_valid=valid, task_id="raising")

    def step(self, action):
        self.steps += 1
        if self.raise_every_step:
            raise ValueError(f"step {self.steps} is broken")
        if action.startswith("open "):
            import tempfile

            with open(f"{tempfile.gettempdir()}/{action[5:]}"):  # the real OS error
                pass
        self.left -= action == "down"
        done = self.left == 0
        return (f"Counter at {self.left}.", 1.0 if done else 0.0, done,
                self.steps >= self.max_steps and not done, self._info(True))


@pytest.fixture
def raising_env_id():
    from crl_bench.registry import ENVS, register_env

    register_env(RAISING, f"{__name__}:RaisingEnv", family="raising",
                 description="test env that raises")
    yield RAISING
    ENVS.unregister(RAISING)
    gymnasium.registry.pop(RAISING, None)


def test_env_exception_ends_that_episode_with_the_error_and_others_go_on(tiny, raising_env_id):
    long_name = "x" * 300

    # episode 0 opens a path with a 300-character component on its second action; episode 1
    # (the same env class) only says 'down' and must finish its episode as if nothing happened
    plans = {0: ["down", f"open {long_name}", "down"], 1: ["down", "down", "down"]}
    played = {0: 0, 1: 0}

    def forced(prompt):
        ep = 0 if "EPISODE-A" in prompt else 1
        action = plans[ep][min(played[ep], 2)]
        played[ep] += 1
        return f"<answer>{action}</answer>"

    backend = ForcedBackend(tiny, forced)
    envs = [gymnasium.make(raising_env_id), gymnasium.make(raising_env_id)]
    engine = RolloutEngine(backend, SamplingParams(max_new_tokens=400), PromptConfig(max_turns=6))
    trajs = engine.run([EpisodeSpec(env=envs[0], seed=0, experience_text="EPISODE-A"),
                        EpisodeSpec(env=envs[1], seed=0, experience_text="EPISODE-B")])
    bad, good = trajs
    assert bad.error is not None and bad.error.startswith("OSError ENAMETOOLONG: [Errno 36]")
    assert len(bad.error) <= 500
    assert bad.meta["end_reason"] == "env_error" and not bad.truncated
    assert (bad.score, bad.success, bad.n_actions, len(bad.turns)) == (0.0, False, 2, 2)
    assert bad.turns[-1].action == f"open {long_name}" and bad.turns[-1].reward == 0.0
    assert "The environment failed on this action: OSError ENAMETOOLONG" in bad.turns[-1].observation
    assert good.error is None and good.success and good.n_actions == 3
    assert good.meta["end_reason"] == "terminated"
    assert backend.calls == [2, 2, 1]               # the failed episode left the batch
    # the record survives JSON (and records without the field still load)
    assert Trajectory.from_json(json.loads(json.dumps(bad.to_json()))).error == bad.error
    old = bad.to_json()
    del old["error"]
    assert Trajectory.from_json(old).error is None
    # the env can be reset and played again after the error
    [again] = engine.run([EpisodeSpec(env=envs[0], seed=1, experience_text="EPISODE-B")])
    assert again.error is None


def test_env_reset_exception_is_an_episode_error(tiny, raising_env_id):
    backend = ForcedBackend(tiny, lambda prompt: "<answer>down</answer>")
    env_ok = gymnasium.make(raising_env_id, raise_on_odd_reset=True)
    env_bad = gymnasium.make(raising_env_id, raise_on_odd_reset=True)
    engine = RolloutEngine(backend, SamplingParams(), PromptConfig(max_turns=5))
    ok, bad = engine.run([EpisodeSpec(env=env_ok, seed=2, task_name="t"),
                          EpisodeSpec(env=env_bad, seed=3, task_name="t")])
    assert bad.error == "reset: RuntimeError: cannot build level 3"
    assert (bad.turns, bad.score, bad.success, bad.n_actions) == ([], 0.0, False, 0)
    assert bad.env_id == raising_env_id and bad.meta["end_reason"] == "env_error"
    assert ok.error is None and ok.success
    assert backend.calls == [1, 1, 1]               # only the healthy episode was played
    with pytest.raises(KeyboardInterrupt):         # not every exception is an episode error
        class Interrupting(RaisingEnv):
            def step(self, action):
                raise KeyboardInterrupt
        engine.run([EpisodeSpec(env=Interrupting(), seed=0)])


def test_tiny_run_goes_on_when_the_env_raises_and_counts_the_errors(tmp_path, raising_env_id):
    """A real `tiny` run (grpo, 1 step) on an env whose every action raises and whose odd seeds
    fail at reset: the run ends `done`, each failed episode is recorded with its error, and the
    step's metrics count them in charts/env_errors."""
    from crl_bench.runner.api import run_experiment
    from crl_bench.records.files import read_jsonl

    raising_kwargs = {"raise_every_step": True, "raise_on_odd_reset": True}
    from crl_bench.registry import ENVS

    ENVS.unregister(raising_env_id)
    gymnasium.registry.pop(raising_env_id, None)
    from crl_bench.registry import register_env

    register_env(raising_env_id, f"{__name__}:RaisingEnv", family="raising", kwargs=raising_kwargs)
    out = tmp_path / "run"
    run_experiment("grpo", raising_env_id, "tiny", 0, out, steps=1, progress=False,
                   overrides={"threads": 1, "eval.at_start": False, "rollout.groups": 1,
                              "rollout.group_size": 4, "eval.episodes_per_task": 2})
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "done", status
    episodes = read_jsonl(out / "episodes.jsonl")
    train = [e for e in episodes if e["phase"] == "train"]
    evals = [e for e in episodes if e["phase"] == "eval"]
    # the step-1 group plays seed 1 (odd): its 4 episodes fail at reset
    assert [e["error"] for e in train] == ["reset: RuntimeError: cannot build level 1"] * 4
    assert all(e["score"] == 0.0 and not e["success"] for e in train)
    # eval seeds 1_000_000 and 1_000_001: the odd one fails at reset, the even one plays
    errors = {e["seed"]: e["error"] for e in evals}
    assert errors[1_000_001] == "reset: RuntimeError: cannot build level 1000001"
    if errors[1_000_000] is not None:             # it took an action: every action raises
        assert errors[1_000_000] == "ValueError: step 1 is broken"
    [m] = [m for m in read_jsonl(out / "metrics.jsonl") if m["step"] == 1]
    assert m["charts/env_errors"] == 4


def test_random_example_answers_differ_across_the_episodes_of_a_group(tiny):
    """A policy that copies the example answer walks randomly under example_pick="random" — the
    K rollouts of one task (same env seed) get different examples — and walks one fixed
    direction under "first" (the collapse seen in results/learning_minihack)."""
    import re

    def copy_example(prompt):
        return re.findall(r"e\.g\. <answer>(\w+)</answer>", prompt)[-1] + "</answer>"

    received = {}
    for pick in ("first", "random"):
        backend = ForcedBackend(tiny, copy_example)
        envs = [Recorder(gymnasium.make(ROOM)) for _ in range(4)]
        cfg = PromptConfig.for_small_model(max_turns=5, history=0, example_pick=pick)
        engine = RolloutEngine(backend, SamplingParams(seed=3), cfg)
        trajs = engine.run([EpisodeSpec(env=e, seed=0, group_id=0) for e in envs])
        assert all(t.turns and all(turn.kind == "action" for turn in t.turns) for t in trajs)
        received[pick] = [tuple(e.received) for e in envs]
    assert {a for walk in received["first"] for a in walk} == {"north"}
    assert len(set(received["random"])) == 4                       # four different walks
    assert len({a for walk in received["random"] for a in walk}) >= 4


def test_first_prompt_is_the_prompt_run_samples_the_first_turn_from(tiny):
    """``RolloutEngine.first_prompt(spec, i)`` (used by experiments/minihack_reading_sft.py) gives
    the ids episode ``i`` of a ``run`` call samples its first turn from — random example answer
    included — and the observation shown there."""
    cfg = PromptConfig.for_small_model(max_turns=1, history=0, example_pick="random")
    engine = RolloutEngine(tiny, SamplingParams(seed=3, max_new_tokens=4), cfg)
    trajs = engine.run([EpisodeSpec(env=gymnasium.make(ROOM), seed=s) for s in (5, 6, 7)])
    for i, (s, traj) in enumerate(zip((5, 6, 7), trajs)):
        prompt, observation = engine.first_prompt(EpisodeSpec(env=gymnasium.make(ROOM), seed=s), i)
        assert prompt == traj.turns[0].prompt_ids
        assert observation in tiny.tokenizer.decode(prompt)
    other, _ = engine.first_prompt(EpisodeSpec(env=gymnasium.make(ROOM), seed=5), 1)
    assert other != trajs[0].turns[0].prompt_ids  # another index, another example answer
