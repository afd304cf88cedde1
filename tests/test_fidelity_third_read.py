"""The `paper` preset against the official code as launched, third read.

Official: the ComplementaryRL fork of ROLL at ab2574f (``pUmpKin-Co/ComplementaryRL``); paths are
relative to ``roll/pipeline/agentic/`` unless they start with ``examples/``. ``pipeline.py`` is
``multi_agentic_pipeline.py``, ``mgr.py`` is ``memory/async_memory_manager.py``, ``mixin.py`` is
``env_manager/memory_integration_mixin.py``. Each test names the official lines its expected
value comes from (read in that snapshot).
"""

from __future__ import annotations

import pytest

from crl_bench.experience.manager import retrieval_query


# -- row 8b: the retrieval query per family --------------------------------------------------------

def test_retrieval_query_per_family_is_the_launched_managers():
    """MiniHack: ``env_manager/traj_env_manager.py:146-148`` ``f"Observation: {raw_obs}"`` with
    ``raw_obs`` the NLE observation dict (``env/minihack/env.py:325-329``); WebShop: the launched
    ``traj_env_manager_shop.py:40`` keeps ``base_env_manager.py:49-57``
    ``f"goal: {task_goal}, observation: {observation}"``; SWE: ``traj_env_manager_swe.py:150-164``
    ``self.env.problem_statement``; ALFWorld: ``traj_env_manager_alfworld.py:222-223``
    ``f"Goal: {task_goal}\\nObservation: {observation}"``. Nothing is cut."""
    import numpy as np

    raw = {"glyphs": np.arange(6).reshape(2, 3), "blstats": np.zeros(3, dtype=np.int64)}
    assert retrieval_query("minihack", "Reach the stairs.", "You see: a wall", "family",
                           raw_obs=raw) == f"Observation: {raw}"
    assert "glyphs" in retrieval_query("minihack", "g", "o", "family", raw_obs=raw)
    long_obs = "WebShop [SEP] Search " * 200
    assert retrieval_query("webshop", "buy red shoes", long_obs, "family") \
        == f"goal: buy red shoes, observation: {long_obs}"
    assert retrieval_query("swe", "Fix the off-by-one in range()", "repo listing ...", "family") \
        == "Fix the off-by-one in range()"
    assert retrieval_query("alfworld", "put a mug", "You are in a room", "family") \
        == "Goal: put a mug\nObservation: You are in a room"
    # the CPU presets' query is one --set away (experience.query=goal_observation)
    assert retrieval_query("webshop", "g", "o") == "g\no"


def test_paper_queries_minihack_with_the_printed_nle_observation(tmp_path):
    """The player hands the env's ``info["raw_obs"]`` to the query when the env gives one."""
    pytest.importorskip("nle")
    from tests.test_fidelity_launched import make_ctx

    ctx = make_ctx(tmp_path, **{"experience.query": "family"})
    try:
        specs = ctx.player.episode_specs("train", 1, ctx.plan(1, with_experience=1))
        spec = next(s for s in specs if s.with_experience)
        obs, info = spec.env.reset(seed=spec.seed)
        assert isinstance(info["raw_obs"], dict) and "glyphs" in info["raw_obs"]
        assert spec.meta["query"] == f"Observation: {info['raw_obs']}" != f"Observation: {obs}"
    finally:
        ctx.close()


def test_paper_embeds_the_whole_text():
    """``memory/embedding/embedding_worker.py:72-76``: ``tokenizer(texts, padding=True,
    truncation=True)`` with no ``max_length``: cut only at the model's own maximum. ``paper``:
    ``experience.embed_max_tokens=0``; the CPU presets keep 256."""
    pytest.importorskip("sentence_transformers")
    from crl_bench.experience.embedder import load_embedder
    from crl_bench.runner.config import PRESETS

    assert PRESETS["paper"]().experience.embed_max_tokens == 0
    assert PRESETS["cpu"]().experience.embed_max_tokens == 256
    cut, whole = load_embedder(max_tokens=256), load_embedder(max_tokens=0)
    assert cut._model.max_seq_length == 256
    assert whole._model.max_seq_length == 512  # MiniLM's position limit
    head = "word " * 300
    a, b = head + "the stairs are east", head + "a newt blocks the west door"
    # past 256 tokens the cut embedder cannot tell the texts apart; the whole-text one can
    assert float((cut.encode([a]) @ cut.encode([b]).T)[0, 0]) > 0.9999
    assert float((whole.encode([a]) @ whole.encode([b]).T)[0, 0]) < 0.9999
    with pytest.raises(ValueError, match="max_tokens"):
        load_embedder(max_tokens=-1)


# -- row 12: fencing -----------------------------------------------------------------------------

def test_a_launched_update_stays_pending_until_the_actor_loop_collects_it(tmp_path):
    """``_has_pending_memory_train`` (``pipeline.py:1603-1604``) is set when the update is
    launched (:1690) and cleared only by ``_maybe_finish_pending_memory_train`` (:1274, via
    :1609-1631, only once its refs are ready), which runs after the flush decision (:1237): a
    finished but uncollected update still fences."""
    pytest.importorskip("torch")
    from crl_bench.experience.embedder import load_embedder
    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.runner.config import ExtractorConfig
    from crl_bench.runner.trainer import RoleTrainer
    from tests.test_extractor_fidelity import new_manager, new_track, traj
    from tests.test_extractor_track import ModelAnswers

    backend = HFBackend("tiny-random", roles=("extractor",), seed=0)
    manager = new_manager(tmp_path, load_embedder())
    cfg_kw = dict(answer_template="content", buffer_size=1, micro_batch_size=1, lr=1e-2,
                  sample_policy="buffer", train_malformed=False)
    trainer = RoleTrainer(backend, "extractor", ExtractorConfig(**cfg_kw), total_steps=2)
    track = new_track(manager, ModelAnswers(backend, ['Go east."']), trainer, **cfg_kw)
    try:
        track.submit(1, [traj("Reach A.")])
        track.record_usage(manager.bank.all_ids(), 1.0)
        assert not track.update_pending()
        track.submit(2, [])                          # launches (and here finishes) an update
        assert track.updates == 1 and not track.training
        assert track.update_pending()                # finished, not collected: still fenced
        assert track.collect_update() and not track.update_pending()
        assert not track.collect_update()            # nothing left to collect
    finally:
        manager.bank.close()


def test_the_step_after_a_launch_skips_the_flush_and_its_merge(tmp_path):
    """``pipeline.py:1237-1261``: with an update launched at step s and finished before step
    s+1, step s+1 still skips the flush and the merge inside it (the decision at :1237 precedes
    the collection at :1274); step s+2 flushes and merges. ``extractor.fence=always`` (the CPU
    presets' setting when they wait) is not fenced at all."""
    from tests.test_fidelity_launched import make_ctx

    ctx = make_ctx(tmp_path, **{"extractor.wait_before_rollout": True, "extractor.fence": "official",
                                "experience.merge_every": 1, "extractor.merge_format": "items"})
    try:
        track = ctx.extractor
        merges = []
        track.merge = lambda step: (merges.append(step), {})[1]
        track._uncollected = True                    # as train() leaves it when the update ends
        ctx.step = 2
        ctx.wait_for_bank()
        assert track.stats["flush_skipped"] == 1 and merges == []
        assert not track.update_pending()            # collected after the decision
        ctx.experience.wait_for_bank(merge=False)    # the step's evaluation: never a merge
        assert merges == []
        ctx.step = 3
        ctx.wait_for_bank()
        assert merges == [3] and track.stats["flush_skipped"] == 1
    finally:
        ctx.close()


# -- row 16: the memory warm-up ------------------------------------------------------------------

def test_no_memory_before_the_warm_up_notifications(tmp_path):
    """``mgr.py:3168-3174``: ``begin_interaction`` once ``notify_memory_warmup`` was called
    ``memory_warmup_interval`` (yaml :198, 5) times; the pipeline notifies once at the end of
    every warm-up step (``pipeline.py:1499-1502``); retrieval needs it (``mixin.py:740-747``).
    Official steps 0-4 (ours 1-5) play without memory; the evaluation after ours 5 has it."""
    from crl_bench.runner.config import PRESETS
    from tests.test_fidelity_launched import make_ctx

    assert PRESETS["paper"]().experience.memory_warmup == 5
    assert PRESETS["cpu"]().experience.memory_warmup == 0
    ctx = make_ctx(tmp_path, **{"experience.memory_warmup": 5})
    try:
        def shown(phase, step):
            plan = ctx.plan(step, with_experience=1) if phase == "train" else ctx.eval_plan(True)
            specs = ctx.player.episode_specs(phase, step, plan)
            with_exp = [s for s in specs if s.with_experience]
            assert with_exp
            return sum(bool(s.experience_ids) for s in with_exp)
        assert shown("train", 5) == 0 and shown("eval", 4) == 0
        assert shown("train", 6) > 0 and shown("eval", 5) > 0
    finally:
        ctx.close()


# -- observations are never cut ------------------------------------------------------------------

def test_paper_never_cuts_an_observation():
    """``traj_env_manager.py:390-406``: the observation goes into the turn template as the env
    gave it (no length cut anywhere on that path). ``paper``: ``rollout.max_observation_chars=0``;
    the CPU presets keep the 6,000-character cut."""
    from crl_bench.llm.prompting import PromptConfig, build_followup_message
    from crl_bench.runner.config import PRESETS

    assert PRESETS["paper"]().rollout.max_observation_chars == 0
    assert PRESETS["cpu"]().rollout.max_observation_chars == 6000
    obs = "x" * 9000 + "THE END"
    whole = build_followup_message(PromptConfig(max_observation_chars=None), observation=obs,
                                   admissible_actions=None)
    cut = build_followup_message(PromptConfig(max_observation_chars=6000), observation=obs,
                                   admissible_actions=None)
    assert obs in whole and obs not in cut


def test_the_player_hands_the_observation_cap_to_the_prompt(tmp_path):
    from tests.test_fidelity_launched import make_ctx

    ctx = make_ctx(tmp_path, **{"rollout.max_observation_chars": 0})
    try:
        assert ctx.player.prompt_config().max_observation_chars is None
    finally:
        ctx.close()
    ctx = make_ctx(tmp_path / "b")
    try:
        assert ctx.player.prompt_config().max_observation_chars == 6000
    finally:
        ctx.close()
