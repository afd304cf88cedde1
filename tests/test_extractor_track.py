"""The extractor track's extraction pass on a real bank with the real embedder; a fixed-answer
generator stands in for the LLM (it returns real Generation objects with the script's text).

The training tests use :class:`ModelAnswers`: the scripted answer is tokenised with SmolLM2's
tokenizer and its log-probs are the tiny model's own, recorded at generation time exactly as a
sampler records them (the model's distribution at temperature 1 on those tokens). So the CISPO
ratio of the first update is 1 and no weight is clipped, as in a real on-policy step."""

from __future__ import annotations

import json

import pytest

from crl_bench.experience.bank import ExperienceBank
from crl_bench.experience.embedder import load_embedder
from crl_bench.extractor.extraction import ContentTemplate, parse_operations
from crl_bench.experience.manager import ExperienceManager, RetrievalConfig
from crl_bench.llm.rollout import Trajectory, Turn
from crl_bench.llm.types import Generation
from crl_bench.config.schema import ExtractorConfig
from crl_bench.baselines.comp_rl import AGENT as COMP_RL
from crl_bench.extractor.track import ExtractorTrack


class FixedAnswers:
    """generate(messages, stop=...) -> Generations whose text is the next scripted answer, cut
    after the first stop string as a backend cuts it. Records every call."""

    def __init__(self, answers: list[str]) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[list, tuple]] = []

    def __call__(self, batch, stop=("</answer>",)):
        self.calls.append((batch, tuple(stop)))
        out = []
        for _ in batch:
            text = self.answers.pop(0)
            cuts = [text.find(s) + len(s) for s in stop if s in text]
            text = text[: min(cuts)] if cuts else text
            out.append(Generation(prompt_ids=[1, 2], completion_ids=[3] * max(1, len(text) // 4),
                                  logprobs=[-0.5] * max(1, len(text) // 4), text=text,
                                  finish_reason="stop" if cuts else "length"))
        return out


def trajectory(goal: str, success: bool) -> Trajectory:
    turn = Turn(prompt_ids=[1], completion_ids=[2], logprobs=[-0.1], completion_text="east</answer>",
                action="east", observation="The stairs down are 1 step to the east.", reward=float(success),
                format_valid=True, tool_query=None)
    return Trajectory(env_id="crl/MiniHack-Room-5x5-v0", task_name="room", task_id="room-5x5", seed=3,
                      goal=goal, group_id=0, with_experience=False, experience_ids=[], experience_text="",
                      turns=[turn], reward=float(success), score=float(success), success=success,
                      n_actions=1, n_invalid_format=0, n_tool_calls=0, truncated=False, tokens=1, wall_s=0.1,
                      meta={"family": "minihack"})


@pytest.fixture(scope="module")
def embedder():
    import torch

    torch.set_num_threads(1)
    return load_embedder()


def make_track(tmp_path, embedder, generate, template: str) -> ExtractorTrack:
    bank = ExperienceBank(tmp_path / "bank.sqlite", dim=embedder.dim, embedder_name=embedder.name)
    manager = ExperienceManager(bank, embedder, RetrievalConfig())
    cfg = ExtractorConfig(answer_template=template)
    return ExtractorTrack(manager, generate, None, cfg, temperature=1.0, merge_every=0, merge_chunk=5,
                          extractor_step=COMP_RL.extractor_step, asynchronous=False, log=lambda m: None)


def test_content_template_rebuilds_a_valid_add():
    t = ContentTemplate()
    pre = t.prefill("Reach the stairs down.", True)
    assert pre == '<answer>[{"op": "add", "title": "Reach the stairs down: what worked", "content": "'
    ops, malformed = parse_operations(t.answer(pre, 'Walk east\\ then "north".'), set())
    assert not malformed
    assert ops[0].kind == "add" and ops[0].title == "Reach the stairs down: what worked"
    assert ops[0].content == "Walk east\\ then"  # the content ends at the first quote, escaped
    # a newline inside the content is escaped, not a JSON error
    assert parse_operations(t.answer(pre, 'line one\nline two"'), set())[0][0].content == "line one\nline two"
    # never closed (token cap) or empty -> malformed
    assert parse_operations(t.answer(pre, "walk east and keep going"), set()) == ([], True)
    assert parse_operations(t.answer(pre, '   ",'), set()) == ([], True)
    failed = t.prefill("x" * 200, False)
    title = json.loads(failed[len('<answer>[{"op": "add", "title": '):-len(', "content": "')])
    assert title.endswith("...: what went wrong") and len(title) <= 80 + len(": what went wrong")


def test_track_with_content_template_prefills_and_applies(tmp_path, embedder):
    gen = FixedAnswers(['Step east until you stand on the stairs." trailing', "never closes the content"])
    track = make_track(tmp_path, embedder, gen, "content")
    track.submit(1, [trajectory("Reach the stairs down.", True), trajectory("Reach the stairs down.", False)])
    (batch, stop), = gen.calls
    assert stop == ('"',)
    assert [m[-1]["role"] for m in batch] == ["assistant", "assistant"]
    assert batch[0][-1]["content"].endswith('"title": "Reach the stairs down: what worked", "content": "')
    assert batch[1][-1]["content"].endswith('what went wrong", "content": "')
    entries = track.manager.bank.get(track.manager.bank.all_ids())
    assert [(e.title, e.content) for e in entries] == [
        ("Reach the stairs down: what worked", "Step east until you stand on the stairs.")]
    assert track.stats["extractions"] == 2 and track.stats["malformed"] == 1
    assert sorted(s.malformed for s in track.samples) == [False, True]


def test_track_free_format_is_unchanged(tmp_path, embedder):
    answer = '<answer>[{"op": "add", "title": "Stairs", "content": "Walk to the stairs."}]</answer>'
    gen = FixedAnswers([answer + " extra"])
    track = make_track(tmp_path, embedder, gen, "free")
    track.submit(1, [trajectory("Reach the stairs down.", True)])
    (batch, stop), = gen.calls
    assert stop == ("</answer>",) and batch[0][-1]["role"] == "user"
    assert [e.title for e in track.manager.bank.get(track.manager.bank.all_ids())] == ["Stairs"]
    assert track.stats["malformed"] == 0


class ModelAnswers(FixedAnswers):
    """Like FixedAnswers, but the Generation carries the tiny model's real token ids for the
    prompt (chat template) and the answer, and the model's real log-probs of those tokens."""

    def __init__(self, backend, answers: list[str]) -> None:
        super().__init__(answers)
        self.backend = backend

    def __call__(self, batch, stop=("</answer>",)):
        out = []
        for msgs, g in zip(batch, super().__call__(batch, stop)):
            prompt = self.backend.chat_prompt_ids(msgs)
            completion = self.backend.tokenizer.encode(g.text, add_special_tokens=False)
            (logprobs,) = self.backend.logprobs([prompt], [completion], "extractor", temperature=1.0)
            out.append(Generation(prompt_ids=prompt, completion_ids=completion, logprobs=logprobs,
                                  text=g.text, finish_reason=g.finish_reason))
        return out


@pytest.fixture()
def tiny_extractor():
    import torch

    from crl_bench.llm.hf_backend import HFBackend

    torch.set_num_threads(1)
    return HFBackend("tiny-random", roles=("extractor",), seed=0)


def trained_track(tmp_path, embedder, backend, answers, **cfg_kw):
    from crl_bench.training.role_trainer import RoleTrainer

    cfg = ExtractorConfig(answer_template="content", buffer_size=2, micro_batch_size=2, lr=1e-2,
                          **cfg_kw)
    trainer = RoleTrainer(backend, "extractor", cfg, total_steps=4)
    bank = ExperienceBank(tmp_path / "bank.sqlite", dim=embedder.dim, embedder_name=embedder.name)
    manager = ExperienceManager(bank, embedder, RetrievalConfig())
    logs: list[dict] = []
    track = ExtractorTrack(manager, ModelAnswers(backend, answers), trainer, cfg, temperature=1.0,
                           merge_every=0, merge_chunk=5, extractor_step=COMP_RL.extractor_step, asynchronous=False,
                           log=logs.append)
    return track, bank, logs


def lora_weights(backend):
    return [p.detach().clone() for p in backend.trainable_parameters("extractor")]


def test_extractor_update_marks_the_entries_it_trained_on(tmp_path, embedder, tiny_extractor):
    """Credit arrives (a trajectory used the entry), the buffer fills, the extractor is updated
    with CISPO on the tiny-random model with its own token ids and log-probs: ratio 1, no weight
    clipped, a non-zero gradient, the weights move, and the bank counts the entry as trained."""
    track, bank, logs = trained_track(tmp_path, embedder, tiny_extractor,
                                      ['Step east onto the stairs."', "no closing quote"])
    before = lora_weights(tiny_extractor)
    track.submit(1, [trajectory("Reach the stairs down.", True), trajectory("Reach the stairs down.", False)])
    (entry_id,) = bank.all_ids()
    assert "extractor/updates" not in logs[-1]  # the added entry has no credit yet: 1 ready sample
    track.record_usage([entry_id], 1.0)  # a later episode used it and succeeded
    track.submit(2, [])
    m = logs[-1]
    assert m["extractor/updates"] == 1 and track.updates == 1
    # rewards: +1 (used by a success) and -1 (malformed): advantages +1 and -1 around the mean 0
    assert m["extractor/reward_mean"] == pytest.approx(0.0)
    assert m["losses/extractor_active_samples"] == 2 and m["losses/extractor_skipped"] == 0
    assert m["losses/extractor_ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert m["losses/extractor_clip_frac"] == 0.0
    assert m["losses/extractor_grad_norm"] > 0
    after = lora_weights(tiny_extractor)
    assert any(not torch_equal(a, b) for a, b in zip(before, after)), "the update moved nothing"
    trained = bank.get([entry_id])[0]
    assert (trained.times_trained, trained.last_trained_step) == (1, 2)
    assert sorted((s.times_trained, s.last_trained_step) for s in track.samples) == [(1, 0), (1, 0)]
    bank.close()


def torch_equal(a, b):
    import torch

    return torch.equal(a, b)


def test_equal_rewards_give_no_update_the_baseline_is_subtracted(tmp_path, embedder, tiny_extractor):
    """Two samples both credited +1: advantage = reward - mean reward = 0 for both, so nothing
    is learnt (without the baseline both would be pushed up)."""
    track, bank, logs = trained_track(tmp_path, embedder, tiny_extractor,
                                      ['Step east onto the stairs."', 'Walk east twice."'])
    before = lora_weights(tiny_extractor)
    track.submit(1, [trajectory("Reach the stairs down.", True), trajectory("Find the stairs.", True)])
    ids = bank.all_ids()
    assert len(ids) == 2
    for eid in ids:
        track.record_usage([eid], 1.0)
    track.submit(2, [])
    m = logs[-1]
    assert m["extractor/reward_mean"] == pytest.approx(1.0)
    assert m["losses/extractor_active_samples"] == 0 and m["losses/extractor_skipped"] == 1
    assert m["losses/extractor_grad_norm"] == 0.0
    assert all(torch_equal(a, b) for a, b in zip(before, lora_weights(tiny_extractor)))
    bank.close()


def test_cooldown_and_count_weights_in_the_track(tmp_path, embedder, tiny_extractor):
    """cooldown 2: samples trained at update 0 sit out update 1 (weight 0: skipped, not counted
    as trained) and are trained again at update 2 with weight (1 + 1)^-1/2."""
    track, bank, logs = trained_track(tmp_path, embedder, tiny_extractor,
                                      ['Step east onto the stairs."', "no closing quote"], cooldown=2)
    track.submit(1, [trajectory("Reach the stairs down.", True), trajectory("Reach the stairs down.", False)])
    (entry_id,) = bank.all_ids()
    track.record_usage([entry_id], 1.0)
    track.submit(2, [])
    assert logs[-1]["losses/extractor_active_samples"] == 2
    track.submit(3, [])   # update 1: 1 - 0 < 2 -> weight 0
    assert logs[-1]["losses/extractor_active_samples"] == 0 and logs[-1]["losses/extractor_skipped"] == 1
    assert sorted(s.times_trained for s in track.samples) == [1, 1]
    track.submit(4, [])   # update 2: 2 - 0 = 2, not < 2 -> trained again
    assert logs[-1]["losses/extractor_active_samples"] == 2
    assert sorted((s.times_trained, s.last_trained_step) for s in track.samples) == [(2, 2), (2, 2)]
    assert bank.get([entry_id])[0].times_trained == 2
    bank.close()


def test_uncredited_samples_are_dropped_after_the_credit_horizon(tmp_path, embedder):
    gen = FixedAnswers(['Step east onto the stairs."'])
    bank = ExperienceBank(tmp_path / "bank.sqlite", dim=embedder.dim, embedder_name=embedder.name)
    manager = ExperienceManager(bank, embedder, RetrievalConfig())
    cfg = ExtractorConfig(answer_template="content", credit_horizon=2)
    track = ExtractorTrack(manager, gen, None, cfg, temperature=1.0, merge_every=0, merge_chunk=5,
                           extractor_step=COMP_RL.extractor_step, asynchronous=False, log=lambda m: None)
    track.submit(1, [trajectory("Reach the stairs down.", True)])
    assert len(track.samples) == 1 and not track.samples[0].resolved
    track.submit(3, [])  # 3 - 1 = 2: still within the horizon
    assert len(track.samples) == 1 and track.stats["dropped_uncredited"] == 0
    track.submit(4, [])  # 4 - 1 = 3 > 2: dropped
    assert track.samples == [] and track.stats["dropped_uncredited"] == 1
    bank.close()


def test_the_extraction_prompt_shows_the_first_observation_of_a_one_action_landmark_episode(
        tmp_path, embedder):
    """The track renders each turn after the observation it answered and the last observation
    after it, as the official extraction prompt does: it renders every message of the actor's
    conversation, the first environment message included (ComplementaryRL
    ``roll/pipeline/agentic/memory/async_memory_manager.py:1339-1356``, "Environment: ..." /
    "Agent: ..." in order), built from the full rollout history "(includes terminal observation)"
    (``roll/pipeline/agentic/env_manager/memory_integration_mixin.py:306-309``). Before, each turn
    showed the observation *after* its action, so in a one-action Landmark episode the extractor
    never saw the landmark, the one thing that says where the stairs are. Real episodes: the
    tiny actor plays the real env through the rollout engine."""
    pytest.importorskip("nle")
    import gymnasium
    import torch

    import crl_bench  # noqa: F401  (registers the crl/ envs)
    from crl_bench.envs.minihack.landmark import LANDMARKS
    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.llm.rollout import EpisodeSpec, PromptConfig, RolloutEngine
    from crl_bench.llm.types import SamplingParams

    torch.set_num_threads(1)
    backend = HFBackend("tiny-sft", roles=("actor",), lora=None, seed=0, dtype="float32", device="cpu")
    engine = RolloutEngine(backend, SamplingParams(temperature=1.0, max_new_tokens=24, seed=0),
                           PromptConfig.for_small_model(max_turns=1))
    specs = [EpisodeSpec(env=gymnasium.make("crl/MiniHack-Room-Landmark-5x5-v0", max_steps=1,
                                            view="compact"), seed=s, group_id=s) for s in range(8)]
    played = [t for t in engine.run(specs) if t.n_actions == 1 and len(t.turns) == 1]
    assert played, "the tiny actor sent no valid move in 8 episodes"
    gen = FixedAnswers(["<answer>[]</answer>"] * len(played))
    make_track(tmp_path, embedder, gen, "free").distil(1, played)
    prompts = [m[-1]["content"] for m in gen.calls[0][0]]
    names = [name for _, _, name in LANDMARKS]
    only_at_start = 0
    for traj, prompt in zip(played, prompts):
        line = next(ln for ln in traj.first_observation.splitlines()
                    if any(ln.startswith((f"- {n}:", f"- {n} (")) for n in names))  # "- grave: near ..."
        # after a move the landmark lies elsewhere (or the outcome line replaces the room), so
        # the old rendering (only the observation after the move) lacked it
        only_at_start += line not in traj.turns[0].observation
        first, move, after = (prompt.index(line), prompt.index(f"> {traj.turns[0].action}"),
                              prompt.rindex(traj.turns[0].observation.strip()))
        assert first < move < after, prompt  # start, move, what came of it
    assert only_at_start, "no episode whose start alone names the landmark: nothing tested"


def test_trajectory_pairs_put_each_turn_after_the_observation_it_answered():
    """Two turns: an invalid one (no action: its completion is shown) and a move. The first
    answers the reset observation, the second the feedback, and the env's last observation
    closes the text; when the text is cut, the end (what came of the last move) stays."""
    from crl_bench.extractor.extraction import trajectory_pairs, trajectory_to_text

    bad = Turn(prompt_ids=[1], completion_ids=[2], logprobs=[-0.1], completion_text="go somewhere",
               action=None, observation="Invalid format.", reward=-0.1, format_valid=False,
               tool_query=None, kind="invalid")
    traj = trajectory("Reach the stairs down.", True)
    traj.turns.insert(0, bad)
    traj.first_observation = "A fountain to the northwest."
    pairs, final = trajectory_pairs(traj)
    assert pairs == [("A fountain to the northwest.", "go somewhere"), ("Invalid format.", "east")]
    assert final == "The stairs down are 1 step to the east."
    text = trajectory_to_text(pairs, final_observation=final)
    assert text == ("[step 1]\nA fountain to the northwest.\n> go somewhere\n\n[step 2]\n"
                    "Invalid format.\n> east\n\n[after step 2]\nThe stairs down are 1 step to the east.")
    long = [(f"room {i} " + "x" * 300, "north") for i in range(30)]
    cut = trajectory_to_text(long, max_chars=1500, final_observation="Outcome: task complete.")
    assert len(cut) <= 1500 and cut.startswith("[step 1]\nroom 0 ")
    assert cut.endswith("[after step 30]\nOutcome: task complete.") and "steps omitted" in cut


class HeldAnswers(FixedAnswers):
    """FixedAnswers whose calls wait until ``release`` is set: an extractor that falls behind."""

    def __init__(self, answers: list[str]) -> None:
        super().__init__(answers)
        import threading

        self.release = threading.Event()

    def __call__(self, batch, stop=("</answer>",)):
        assert self.release.wait(timeout=60), "never released"
        return super().__call__(batch, stop)


def test_bank_lag_counts_the_steps_whose_writes_have_not_landed(tmp_path, embedder):
    """An asynchronous track that has not written steps 1 and 2 when step 3's rollout starts is 2
    steps behind; once their writes land, 0 (what the official flush before a rollout ensures)."""
    answer = '<answer>[{"op": "add", "title": "Stairs", "content": "Walk to the stairs."}]</answer>'
    gen = HeldAnswers([answer, answer])
    bank = ExperienceBank(tmp_path / "bank.sqlite", dim=embedder.dim, embedder_name=embedder.name)
    track = ExtractorTrack(ExperienceManager(bank, embedder, RetrievalConfig()), gen, None,
                           ExtractorConfig(answer_template="free"), temperature=1.0, merge_every=0,
                           merge_chunk=5, extractor_step=COMP_RL.extractor_step, asynchronous=True,
                           log=lambda m: None)
    try:
        assert track.bank_lag(1) == 0  # nothing submitted yet
        track.submit(1, [trajectory("Reach the stairs down.", True)])
        track.submit(2, [trajectory("Reach the stairs down.", False)])
        assert track.bank_lag(3) == 2 and track.backlog == 2
        gen.release.set()
        assert track.wait_writes(timeout=60)
        assert track.bank_lag(3) == 0
        assert len(bank.all_ids()) >= 1  # the writes did land
    finally:
        gen.release.set()
        track.close()
