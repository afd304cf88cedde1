"""Issue 16, extractor / experience side: each mechanism the official implementation has (the
ComplementaryRL fork of ROLL at ab2574f), pinned on real parts: the real bank and embedder, the
real track, the tiny model for training. Expected numbers are computed by hand from the official
formulas cited in each test (``docs/fidelity.md`` lists them all)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from crl_bench.algorithms.credit import extractor_rewards, gate_credit
from crl_bench.experience.bank import ExperienceBank
from crl_bench.experience.manager import ExperienceManager, Operation, RetrievalConfig
from crl_bench.extractor.gate import gate_messages, parse_gate
from crl_bench.baselines.comp_rl import AGENT as COMP_RL
from crl_bench.extractor.track import ExtractorTrack
from crl_bench.llm.rollout import Trajectory, Turn
from crl_bench.config.schema import ExtractorConfig

from tests.test_extractor_track import FixedAnswers, ModelAnswers, embedder, tiny_extractor  # noqa: F401


def traj(goal="Reach the stairs down.", success=True, *, with_exp=False, ids=(), meta=None, turns=None):
    turn = Turn(prompt_ids=[1], completion_ids=[2], logprobs=[-0.1],
                completion_text="<think>the stairs are east, so east</think><answer>east</answer>",
                action="east", observation="The stairs down are 1 step to the east.",
                reward=float(success), format_valid=True, tool_query=None)
    return Trajectory(env_id="crl/MiniHack-Room-5x5-v0", task_name="room", task_id="room-5x5", seed=3,
                      goal=goal, group_id=0, with_experience=with_exp, experience_ids=list(ids),
                      experience_text="", turns=turns or [turn], reward=float(success),
                      score=float(success), success=success, n_actions=1, n_invalid_format=0,
                      n_tool_calls=0, truncated=False, tokens=1, wall_s=0.1,
                      meta={"family": "minihack", **(meta or {})})


def new_manager(tmp_path, embedder, sub=""):
    (tmp_path / sub).mkdir(exist_ok=True)
    bank = ExperienceBank(tmp_path / sub / "bank.sqlite", dim=embedder.dim, embedder_name=embedder.name)
    return ExperienceManager(bank, embedder, RetrievalConfig(diversify=False))


def new_track(manager, generate, trainer=None, *, merge_every=0, key=False, **cfg_kw):
    cfg = ExtractorConfig(**cfg_kw)
    return ExtractorTrack(manager, generate, trainer, cfg, temperature=1.0, merge_every=merge_every,
                          merge_chunk=5, extractor_step=COMP_RL.extractor_step, asynchronous=False, log=lambda m: None,
                          key_by_episode_start=key)


def add_answer(title, content="Walk towards the > sign."):
    return "<answer>" + json.dumps([{"op": "add", "title": title, "content": content}]) + "</answer>"


# -- item 7: the accept / refine / reject gate --------------------------------------------------

def test_gate_parses_the_official_answer_format():
    """``_parse_actor_critic_response`` (memory_integration_mixin.py:680-740): the last <answer>
    JSON decides; refine needs a non-empty refined_knowledge; anything else is no verdict."""
    k = "Walk east first."
    assert parse_gate('<think>x</think><answer>{"function_name": "accept", "parameters": {}}</answer>', k) \
        == parse_gate('<answer>{"function_name": "accept"}</answer>', k)
    d = parse_gate('<answer>{"function_name": "accept", "parameters": {}}</answer>', k)
    assert (d.verdict, d.knowledge) == ("accept", k)
    d = parse_gate('<answer>{"function_name": "reject", "parameters": {}}</answer>', k)
    assert (d.verdict, d.knowledge) == ("reject", "")
    d = parse_gate('<answer>{"function_name": "refine", "parameters": {"refined_knowledge": "Go east."}}</answer>', k)
    assert (d.verdict, d.knowledge) == ("refine", "Go east.")
    for bad in ("accept", '<answer>{"function_name": "refine", "parameters": {}}</answer>',
                '<answer>{"function_name": "maybe"}</answer>', "<answer>[1]</answer>",
                '<answer>{"function_name": "accept", "parameters": 3}</answer>'):
        assert parse_gate(bad, k).verdict is None and parse_gate(bad, k).knowledge == ""
    msgs = gate_messages("Goal: g\nObservation: o", k, 0.25, 8)
    assert "Average score on similar tasks: 0.25" in msgs[1]["content"] and k in msgs[1]["content"]


def test_gate_credit_is_the_official_formula():
    """add_memory_metadata (memory_integration_mixin.py:394-400): critic if critic < 1 else
    score + critic; then multi_agentic_pipeline.py:794-798 turns a score of 0 into -1."""
    assert gate_credit(1.0, "accept") == 2.0 and gate_credit(0.0, "accept") == 1.0
    assert gate_credit(0.6, "accept") == pytest.approx(1.6)
    assert gate_credit(1.0, "refine") == 0.5 and gate_credit(0.0, "refine") == 0.5
    assert gate_credit(1.0, "reject") == -1.0 and gate_credit(0.0, "reject") == -1.0
    assert gate_credit(0.0, None) == 0.0 and gate_credit(1.0, None) == 1.0
    # one sample used by four episodes: accept+solved 2, accept+failed 1, refine 0.5, reject -1;
    # and without the gate a failure (0) counts -1: means by hand
    r = extractor_rewards([[2.0, 1.0, 0.5, -1.0], [0.0, 1.0]], [False, False])
    assert r.tolist() == pytest.approx([(2 + 1 + 0.5 - 1) / 4, (-1 + 1) / 2])


def test_track_credits_entries_with_the_gate_verdict(tmp_path, embedder):
    manager = new_manager(tmp_path, embedder)
    track = new_track(manager, FixedAnswers([add_answer("Stairs east")]))
    track.submit(1, [traj()])
    (eid,) = manager.bank.all_ids()
    track.credit([traj(success=True, with_exp=True, ids=[eid], meta={"gate": "accept"}),
                  traj(success=False, with_exp=True, ids=[eid], meta={"gate": "accept"}),
                  traj(success=True, with_exp=True, ids=[eid], meta={"gate": "refine"}),
                  traj(success=True, with_exp=True, ids=[eid], meta={"gate": "reject"}),
                  traj(success=False, with_exp=True, ids=[eid])])
    assert track.samples[0].usage == [2.0, 1.0, 0.5, -1.0, 0.0]
    manager.bank.close()


# -- item 6: which episodes are distilled, the buffer, malformed outputs ------------------------

def test_only_the_with_experience_half_is_distilled(tmp_path, embedder):
    """Official: only episodes that evolve with memory update it (``_should_update_trajectory_
    memory``); "all" (our tiny/cpu default) distils every episode."""
    manager = new_manager(tmp_path, embedder)
    gen = FixedAnswers([add_answer("A"), add_answer("B")])
    track = new_track(manager, gen, distill="with_experience")
    track.submit(1, [traj(with_exp=True), traj(with_exp=False), traj(with_exp=False)])
    assert len(gen.calls[0][0]) == 1 and track.stats["extractions"] == 1
    assert track.stats["not_distilled"] == 2
    track2 = new_track(new_manager(tmp_path, embedder, "b"),
                       FixedAnswers([add_answer("A"), add_answer("B")]), distill="all")
    track2.submit(1, [traj(with_exp=True), traj(with_exp=False)])
    assert track2.stats["extractions"] == 2
    manager.bank.close()


def test_malformed_outputs_are_not_trained_when_off(tmp_path, embedder):
    manager = new_manager(tmp_path, embedder)
    track = new_track(manager, FixedAnswers(["no answer", add_answer("A")]), train_malformed=False)
    track.submit(1, [traj(), traj()])
    assert track.stats["malformed"] == 1
    assert [s.malformed for s in track.samples] == [False]
    on = new_track(manager, FixedAnswers(["no answer"]), train_malformed=True)
    on.submit(2, [traj()])
    assert [s.malformed for s in on.samples] == [True]
    manager.bank.close()


def test_buffer_pops_exactly_b_credited_samples_each_once_per_new_credit(tmp_path, embedder, tiny_extractor):
    """MemoryTrainingBuffer (multi_agentic_pipeline.py:55-108): FIFO of ``buffer_size`` samples
    entered when credited, the oldest evicted (its credit lost) when full; an update pops exactly
    ``buffer_size`` and trains each once on the credit gathered since it entered."""
    from crl_bench.training.role_trainer import RoleTrainer

    manager = new_manager(tmp_path, embedder)
    cfg_kw = dict(answer_template="content", buffer_size=2, micro_batch_size=2, lr=1e-2,
                  sample_policy="buffer", train_malformed=False)
    trainer = RoleTrainer(tiny_extractor, "extractor", ExtractorConfig(**cfg_kw), total_steps=4)
    logs: list[dict] = []
    track = new_track(manager, ModelAnswers(tiny_extractor, ['Go east."', 'Go north."', 'Go west."']),
                      trainer, **cfg_kw)
    track.log = logs.append
    track.submit(1, [traj("Reach A."), traj("Reach B."), traj("Reach C.")])
    e1, e2, e3 = manager.bank.all_ids()
    s1, s2, s3 = track.samples
    assert "extractor/updates" not in logs[-1] and len(track.buffer) == 0  # nothing credited yet
    track.record_usage([e1], 1.0)
    track.record_usage([e2], 0.0)
    track.record_usage([e3], 1.0)       # full: s1 evicted, its credit dropped
    assert list(track.buffer) == [s2.uid, s3.uid] and s1.usage == []
    assert track.stats["buffer_evicted"] == 1
    track.submit(2, [])
    m = logs[-1]
    # s2: -1 (a failure), s3: +1 -> mean 0, both active
    assert m["extractor/updates"] == 1 and m["extractor/batch"] == 2
    assert m["extractor/reward_mean"] == pytest.approx(0.0)
    assert m["losses/extractor_active_samples"] == 2
    assert len(track.buffer) == 0 and s2.usage == [] and s3.usage == []
    assert (s1.times_trained, s2.times_trained, s3.times_trained) == (0, 1, 1)
    track.submit(3, [])                 # no new credit: nothing is trained again (pool would)
    assert logs[-1].get("extractor/updates") is None and track.updates == 1
    track.record_usage([e2], 1.0)       # new credit for s2: it re-enters with only that credit
    track.record_usage([e1], 1.0)
    track.submit(4, [])
    assert logs[-1]["extractor/updates"] == 2 and logs[-1]["extractor/reward_mean"] == pytest.approx(1.0)
    assert (s1.times_trained, s2.times_trained) == (1, 2)
    manager.bank.close()


# -- item 4: the extractor sees the whole conversation -----------------------------------------

def test_extractor_sees_full_conversation_with_reasoning(tmp_path, embedder):
    manager = new_manager(tmp_path, embedder)
    long_obs = "wall " * 2000  # 10,000 characters: cut at 3,000 by default
    turn = Turn(prompt_ids=[1], completion_ids=[2], logprobs=[-0.1],
                completion_text="<think>the stairs must be east</think><answer>east</answer>",
                action="east", observation=long_obs, reward=0.0, format_valid=True, tool_query=None)
    gen = FixedAnswers([add_answer("A"), add_answer("B")])
    new_track(manager, gen, max_trajectory_chars=0, keep_reasoning=True).submit(1, [traj(turns=[turn] * 3)])
    user = gen.calls[0][0][0][1]["content"]
    assert user.count(long_obs.strip()) == 3 and user.count("<think>the stairs must be east</think>") == 3
    cut = FixedAnswers([add_answer("A")])
    new_track(manager, cut).submit(2, [traj(turns=[turn] * 3)])
    user = cut.calls[0][0][0][1]["content"]
    assert "<think>" not in user and long_obs.strip() not in user and len(user) < 5000
    manager.bank.close()


# -- item 8: entries keyed by the source episode's starting query -------------------------------

def test_entries_are_keyed_by_the_episode_start(tmp_path, embedder):
    manager = new_manager(tmp_path, embedder)
    query = "Reach the stairs down.\nYou are in a 5x5 room; the stairs are to the east."
    track = new_track(manager, FixedAnswers([add_answer("Unrelated title", "Totally other words.")]), key=True)
    track.submit(1, [traj(meta={"query": query})])
    (eid,) = manager.bank.all_ids()
    qv = embedder.encode([query])
    ((hit, sim),) = manager.bank.search(qv, 1)[0]
    assert hit == eid and sim == pytest.approx(1.0, abs=1e-4)   # embedded by the query itself
    off = new_manager(tmp_path, embedder, "x")
    new_track(off, FixedAnswers([add_answer("Unrelated title", "Totally other words.")])).submit(
        1, [traj(meta={"query": query})])
    ((_, sim_entry),) = off.bank.search(qv, 1)[0]
    assert sim_entry < 0.9                                      # by its own text: another vector
    manager.bank.close()


# -- item 13: an update replaces the entry and credits only its writer; merges are samples ------

@pytest.mark.parametrize("mode", ["in_place", "replace"])
def test_update_credit_goes_to_the_new_writer_only_when_replacing(tmp_path, embedder, mode):
    manager = new_manager(tmp_path, embedder)
    gen = FixedAnswers([add_answer("A")])
    track = new_track(manager, gen, update_mode=mode)
    track.submit(1, [traj()])
    (old,) = manager.bank.all_ids()
    gen.answers.append("<answer>" + json.dumps([{"op": "update", "target_ids": [old], "title": "A2",
                                                  "content": "Walk east, then down."}]) + "</answer>")
    track.submit(2, [traj(with_exp=True, ids=[old])])
    writer, updater = track.samples
    (now,) = manager.bank.all_ids()
    track.record_usage([now], 1.0)
    entry = manager.get([now])[0]
    if mode == "replace":   # official: a new uuid for the updated memory, the old one deleted
        assert now != old and entry.parent_ids == [old] and entry.origin == "update"
        assert writer.usage == [] and updater.usage == [1.0]
    else:                   # in place: the id stays and both writers are credited
        assert now == old and writer.usage == [1.0] and updater.usage == [1.0]
    manager.bank.close()


def test_merge_calls_become_samples_credited_like_adds(tmp_path, embedder):
    manager = new_manager(tmp_path, embedder)
    gen = FixedAnswers([add_answer("A", "Go east."), add_answer("B", "Walk east.")])
    track = new_track(manager, gen, merge_every=1, train_merges=True)
    a_b = []
    gen_merge = '<answer>[{"op": "merge", "ids": [IDS], "title": "East", "content": "Head east."}]</answer>'
    original = track.generate

    def generate(batch, stop=("</answer>",)):
        if "tidy" in batch[0][0]["content"]:  # the merge prompt
            return FixedAnswers([gen_merge.replace("IDS", ", ".join(map(str, a_b)))])(batch, stop)
        return original(batch, stop)
    track.generate = generate
    track.last_merge_step = 10  # no merge at step 1
    track.submit(1, [traj(), traj()])
    a_b.extend(manager.bank.all_ids())
    track.last_merge_step = 0
    track.submit(2, [])         # merge: A and B -> one new entry
    (merged,) = manager.bank.all_ids()
    (ms,) = [s for s in track.samples if s.kind == "merge"]
    assert ms.entry_ids == [merged] and not ms.malformed
    track.record_usage([merged], 1.0)
    assert ms.usage == [1.0]
    manager.bank.close()


# -- item 12: pending bank writes finish before a rollout -------------------------------------

def test_wait_writes_blocks_until_the_bank_has_the_submitted_entries(tmp_path, embedder):
    import threading
    import time

    manager = new_manager(tmp_path, embedder)
    release = threading.Event()
    fixed = FixedAnswers([add_answer("A")])

    def slow(batch, stop=("</answer>",)):
        release.wait(5)
        return fixed(batch, stop)
    cfg = ExtractorConfig()
    track = ExtractorTrack(manager, slow, None, cfg, temperature=1.0, merge_every=0, merge_chunk=5,
                           extractor_step=COMP_RL.extractor_step, asynchronous=True, log=lambda m: None)
    track.submit(1, [traj()])
    assert not track.wait_writes(timeout=0.2) and len(manager.bank) == 0
    threading.Timer(0.2, release.set).start()
    t0 = time.perf_counter()
    assert track.wait_writes(timeout=120) and len(manager.bank) == 1  # generous: loaded CI machines
    assert time.perf_counter() - t0 >= 0.1
    track.close()
    manager.bank.close()


# -- item 3: full fine-tuning trains every parameter -------------------------------------------

def test_lora_r_0_trains_every_parameter_of_two_separate_models():
    """``model.lora_r=0``: each role's model is fully trainable; one update moves every parameter
    tensor of the extractor's model (two backends, as for two base models) and not the actor's."""
    import torch

    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.training.role_trainer import RoleTrainer, TrainSample

    torch.set_num_threads(1)
    actor = HFBackend("tiny-random", roles=("actor",), lora=None, seed=0)
    ext = HFBackend("tiny-random", roles=("extractor",), lora=None, seed=0)
    params = ext.trainable_parameters("extractor")
    model = ext.trainable_model("extractor") if hasattr(ext, "trainable_model") else None
    n_all = sum(1 for _ in (model or ext._models["extractor"]).parameters())
    assert len(params) == n_all and all(p.requires_grad for p in params)
    before = [p.detach().clone() for p in params]
    actor_before = [p.detach().clone() for p in actor.trainable_parameters("actor")]
    cfg = ExtractorConfig(lr=1e-3, micro_batch_size=2)
    trainer = RoleTrainer(ext, "extractor", cfg, total_steps=1)
    prompt = ext.tokenizer.encode("Reach the stairs.", add_special_tokens=False)
    comp = ext.tokenizer.encode(" east north", add_special_tokens=False)
    (lp,) = ext.logprobs([prompt], [comp], "extractor", temperature=1.0)
    (lp2,) = ext.logprobs([prompt], [comp[:1]], "extractor", temperature=1.0)
    trainer.update([TrainSample(prompt, comp, lp, 1.0), TrainSample(prompt, comp[:1], lp2, -1.0)],
                   loss="cispo", loss_kwargs=cfg.loss_kwargs(), agg="token-mean", temperature=1.0)
    moved = [not torch.equal(a, p.detach()) for a, p in zip(before, params)]
    assert all(moved), f"{moved.count(False)} of {len(moved)} parameter tensors did not move"
    assert all(torch.equal(a, p.detach()) for a, p in zip(actor_before, actor.trainable_parameters("actor")))


def test_full_fine_tuning_with_vllm_is_refused_with_the_fix():
    from crl_bench.config.schema import ConfigError, build_config

    with pytest.raises(ConfigError, match="lora_r=0 .*hf backend"):
        build_config(agent="comp_rl", tasks="minihack", preset="tiny",
                     overrides={"model.lora_r": 0, "model.backend": "vllm", "model.device": "cpu"})
