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
    from crl_bench.config.schema import PRESETS

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
    from crl_bench.config.schema import ExtractorConfig
    from crl_bench.training.role_trainer import RoleTrainer
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
    from crl_bench.config.schema import PRESETS
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
    from crl_bench.config.schema import PRESETS

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


# -- row 13c: the merge window, merged entries' usage, the prompt, the merge credit ---------------

MERGED = ("<answer>\n<<<KNOWLEDGE_ITEM>>>\n<title>Stairs</title>\n<content>When the stairs are "
          "named in the observation, step toward them; otherwise explore.</content>\n"
          "<<<END_ITEM>>>\n{second}</answer>")
SECOND = ("<<<KNOWLEDGE_ITEM>>>\n<title>Walls</title>\n<content>When a wall blocks the way, "
          "go around it along the wall.</content>\n<<<END_ITEM>>>\n")


class _Items:
    """A merge model that returns ``n`` valid items for every window and records the windows."""

    def __init__(self, n: int):
        self.n, self.windows = n, []

    def __call__(self, messages, stop=()):
        from dataclasses import dataclass

        @dataclass
        class Gen:
            text: str
            finish_reason: str = "stop"
        out = []
        for m in messages:
            self.windows.append(m[1]["content"].count("--- Entry "))
            out.append(Gen(MERGED.format(second=SECOND if self.n == 2 else "")))
        return out


def _bank(tmp_path, n: int, times_retrieved: int = 0):
    from crl_bench.experience.bank import ExperienceBank
    from crl_bench.experience.embedder import load_embedder
    from crl_bench.experience.manager import ExperienceManager, Operation, RetrievalConfig

    emb = load_embedder()
    bank = ExperienceBank(tmp_path / "bank.sqlite", dim=emb.dim, embedder_name=emb.name)
    manager = ExperienceManager(bank, emb, RetrievalConfig(diversify=False))
    for i in range(n):
        manager.apply_operations([Operation("add", f"tip {i}", f"Advice number {i} about rooms.")],
                                 family="minihack", task_id="t", provenance={}, step=0)
    if times_retrieved:
        for _ in range(times_retrieved):
            manager.retrieve(["Advice about rooms"] * 1, family="minihack")
    return manager


@pytest.mark.parametrize("items, official, ours", [(1, [5, 6, 3], [5, 5, 4]),
                                                   (2, [5, 7, 4], [5, 5, 5, 3])])
def test_an_official_merge_window_is_five_fresh_entries_plus_all_carried(tmp_path, items,
                                                                        official, ours):
    """``async_memory_manager.py:2504-2506``: the scope is pre-cut into chunks of
    ``max_merging_item_per_call`` (yaml :235, 5); every item a chunk returns is appended to the
    next chunk (:2576-2578). 12 entries: 5, then 5 fresh + the carried, then the last 2 fresh +
    the carried; the last chunk's items are final (:2579-2581). Ours carries at most 4 and caps
    a window at 5; in both a window without a fresh entry is never sent."""
    from crl_bench.extractor.merge import merge_bank

    for style, want in (("official", official), ("ours", ours)):
        manager = _bank(tmp_path / style, 12)
        model = _Items(items)
        merge_bank(manager, model, step=5, chunk=5, fmt="items", style=style)
        assert model.windows == want, style
        manager.bank.close()


def test_official_merged_entries_start_with_fresh_usage(tmp_path):
    """``async_memory_manager.py:2447-2449`` deletes the merged entries' usage and :2456 adds
    the merged item as a new entry (never retrieved). Ours sums the parents' counts."""
    from crl_bench.extractor.merge import merge_bank

    for style in ("official", "ours"):
        manager = _bank(tmp_path / style, 3, times_retrieved=2)
        before = sum(e.times_retrieved for e in manager.bank.get(manager.bank.all_ids()))
        assert before > 0
        merge_bank(manager, _Items(1), step=5, chunk=5, fmt="items", style=style)
        (merged,) = manager.bank.get(manager.bank.all_ids())
        assert merged.times_retrieved == (0 if style == "official" else before)
        assert (merged.last_retrieved is None) == (style == "official")
        manager.bank.close()


def test_the_official_merge_prompt_is_the_launched_one_verbatim():
    """yaml :236-237 launch ``MERGING_PROMPT_SYS_PROMPT_251207`` / ``MERGING_PROMPT_USE_PROMPT_251201``
    (``memory_prompts.yaml:873-922``, :698-709), filled by ``_call_merge_llm`` (:2655-2656)."""
    from crl_bench.experience.bank_schema import ExperienceEntry
    from crl_bench.extractor.merge import (OFFICIAL_MERGE_SYSTEM, OFFICIAL_MERGE_USER,
                                           build_item_merge_messages)

    assert OFFICIAL_MERGE_SYSTEM.startswith("You are a world-class knowledge specialist merging "
                                            "knowledge items from agent experiences.\n")
    assert "**Generalizability Level: 3+ (REQUIRED)**" in OFFICIAL_MERGE_SYSTEM
    assert OFFICIAL_MERGE_SYSTEM.endswith("<answer>\n    return\n    </answer>\n")
    assert "leave out" not in OFFICIAL_MERGE_SYSTEM and "deleted" not in OFFICIAL_MERGE_SYSTEM
    assert OFFICIAL_MERGE_USER == (
        "Knowledge items to merge:\n\n{entries}\n\nMerge related items and output using this "
        "EXACT format:\n<think>[your analysis]</think>\n<answer>\n<<<KNOWLEDGE_ITEM>>>\n"
        "[Your merged knowledge content]\n<<<END_ITEM>>>\n</answer>\n")
    e = [ExperienceEntry(id=i, title=f"t{i}", content=f"c{i}", family="minihack", task_ids=[],
                         run="", created_step=0, updated_step=0, source_trajectories=[],
                         times_retrieved=0, last_retrieved=None, times_trained=0, n_used=0,
                         mean_outcome=0.0) for i in (1, 2)]
    system, user = build_item_merge_messages(e, official=True)
    assert system["content"] == OFFICIAL_MERGE_SYSTEM
    assert user["content"] == OFFICIAL_MERGE_USER.format(
        entries="--- Entry 1 ---\n<title>t1</title><content>c1</content>\n\n"
                "--- Entry 2 ---\n<title>t2</title><content>c2</content>")
    assert "leave out" in build_item_merge_messages(e)[0]["content"]  # ours says so


def test_official_merge_credit_is_one_trained_call_per_scope_and_pass(tmp_path):
    """``async_memory_manager.py:2566``: the pass keeps the last successful call's output and
    every new entry of the scope carries it as ``triggered_interaction`` (:2600): one trained
    sample per scope and pass, credited by the entries the pass left."""
    pytest.importorskip("torch")
    from crl_bench.baselines.comp_rl import AGENT as COMP_RL
    from crl_bench.extractor.track import ExtractorTrack
    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.config.schema import ExtractorConfig

    backend = HFBackend("tiny-random", roles=("extractor",), seed=0)
    items = _Items(1)

    def generate(messages, stop=()):  # the items' text with the tiny model's own bookkeeping
        from crl_bench.llm.types import Generation
        out = []
        for g, m in zip(items(messages, stop), messages):
            prompt = backend.chat_prompt_ids(m)
            ids = backend.tokenizer(g.text, add_special_tokens=False)["input_ids"]
            out.append(Generation(prompt, ids, backend.logprobs([prompt], [ids], "extractor")[0],
                                  g.text, "stop"))
        return out
    for style, want in (("official", 1), ("ours", 3)):
        manager = _bank(tmp_path / style, 12)
        cfg = ExtractorConfig(merge_format="items", train_merges=True, merge_style=style)
        track = ExtractorTrack(manager, generate, None, cfg, temperature=1.0, merge_every=5,
                               merge_chunk=5, extractor_step=COMP_RL.extractor_step,
                               asynchronous=False, log=lambda m: None)
        track.merge(5)
        merges = [s for s in track.samples if s.kind == "merge"]
        assert len(merges) == want, style
        alive = set(manager.bank.all_ids())
        if style == "official":
            assert set(merges[0].entry_ids) == alive and len(alive) == 1
        manager.bank.close()


# -- row 13d: the extraction prompt sets no cap on the operations -------------------------------

def test_the_official_extraction_prompt_caps_no_operations():
    """The launched prompts (yaml :263-264: ``FUNCTIONAL_MEMORY_MODEL_USER_PROMPT_251223``,
    ``memory_prompts.yaml:235``, and ``FUNCTIONAL_MEMORY_MODEL_SYS_PROMPT_VOTING_251207``, :746)
    hold no ``{max_operations}`` field: ``memory_model_max_functional_operations: 3`` (:266) is
    passed to ``.format`` (``async_memory_manager.py:1392-1393``, :1408-1411) but appears
    nowhere in them. Ours (short) says at most ``max_ops`` twice."""
    from crl_bench.extractor.extraction import build_extraction_messages

    outcome = {"success": True, "score": 1.0, "n_actions": 2}
    system, user = build_extraction_messages("g", "t", outcome, [], style="official")
    assert "at most" not in system["content"] and "at most" not in user["content"]
    short = build_extraction_messages("g", "t", outcome, [], style="short")
    assert all("at most 3 operations" in m["content"] for m in short)


# -- actor log-probs on the raw logits -----------------------------------------------------------

def test_paper_takes_actor_log_probs_on_raw_logits(tmp_path):
    """``roll/distributed/strategy/megatron_strategy.py:238-263`` (``op_compute_log_probs``):
    log-probs of the logits as the model gives them; no temperature anywhere in that strategy.
    ``paper``: ``actor.logprob_temperature=1.0`` with the old log-probs recomputed; the CPU
    presets keep the sampling temperature (0.99), whose log-probs the sampler recorded."""
    from crl_bench.config.schema import PRESETS, ConfigError, build_config

    paper = PRESETS["paper"]().actor
    assert paper.logprob_temperature == 1.0 and paper.recompute_old_logprobs
    assert PRESETS["cpu"]().actor.logprob_temperature == 0.0
    with pytest.raises(ConfigError, match="recompute_old_logprobs"):
        build_config(agent="grpo", preset="tiny", overrides={"actor.logprob_temperature": 1.0})

    import torch

    from tests.test_fidelity_launched import make_ctx

    seen = []
    for n, overrides in enumerate(({}, {"actor.logprob_temperature": 1.0,
                                        "actor.recompute_old_logprobs": True})):
        ctx = make_ctx(tmp_path / str(n), **overrides)
        try:
            ctx.actor.host.update = lambda samples, **kw: (seen.append(kw["temperature"]), {})[1]
            ctx.actor.update([], torch.zeros(0))
        finally:
            ctx.close()
    assert seen == [pytest.approx(PRESETS["tiny"]().rollout.temperature), 1.0]


# -- Search-and-Ask: the tag, the answer's wording, ask before answer, the actor's stop strings --

def test_paper_search_and_ask_as_the_official_tool():
    """``tools/search_and_ask_tool.py:27``: the tool's pattern is
    ``<knowledge_search_and_ask>(.*?)</knowledge_search_and_ask>``; :102: its observation is
    ``f"Search results: {search_results}\\n"``; ``tool_env_wrapper.py:45-52``: every tool is tried
    on the whole reply before the env sees it, so a reply with an ask and an answer is an ask
    while tool uses are left (:45); yaml :101: the actor stops only at
    ``</knowledge_search_and_ask>``."""
    from crl_bench.llm.prompting import PromptConfig, parse_completion
    from crl_bench.config.schema import PRESETS

    cfg = PRESETS["paper"]()
    assert cfg.experience.ask_tag == "knowledge_search_and_ask" and cfg.experience.ask_wins
    assert not cfg.rollout.stop_at_answer
    official = PromptConfig(ask_tag="knowledge_search_and_ask", ask_wins=True, stop_at_answer=False)
    assert official.stop_strings() == ("</knowledge_search_and_ask>",)
    both = ("<answer>north</answer> <knowledge_search_and_ask>which rock?"
            "</knowledge_search_and_ask>")
    assert parse_completion(both, official, asks_left=1).kind == "ask"
    assert parse_completion(both, official, asks_left=0).action == "north"   # no tool use left
    ours = PromptConfig(ask_tag="knowledge_search_and_ask")
    assert parse_completion(both, ours, asks_left=1).action == "north"
    assert ours.stop_strings() == ("</answer>", "</knowledge_search_and_ask>")
    cpu = PRESETS["cpu"]()
    assert (cpu.experience.ask_tag, cpu.experience.ask_wins, cpu.rollout.stop_at_answer) == \
        ("ask", False, True)


# -- ALFWorld: reasoning in <think> before the <answer> ------------------------------------------

OFFICIAL_ALFWORLD_PATTERN = r"<think>(.*?)</think>\s*<answer>(.*?)</answer>($|\n)"
"""``examples/singletask-agentic/multitask_env_tool.yaml:365`` ``action_pattern``."""


@pytest.mark.parametrize("reply, valid", [
    ("<think>the rock north is the landmark's</think>\n<answer>north</answer>", True),
    ("<answer>north</answer>", False),
    ("<think>x</think><answer>north</answer> and more", False)])
def test_a_family_action_pattern_makes_other_replies_invalid(reply, valid):
    """``env/alfworld/env.py:384-395``: a reply the pattern does not match is "Format Invalid".
    ``paper`` sets ALFWorld's official pattern; the engine applies a family's pattern to the
    whole reply (here on a real MiniHack level, the pattern given for its family)."""
    pytest.importorskip("torch")
    pytest.importorskip("nle")
    import gymnasium

    import crl_bench  # noqa: F401
    from _forced_backend import ForcedBackend
    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.llm.rollout import EpisodeSpec, PromptConfig, RolloutEngine
    from crl_bench.llm.types import SamplingParams
    from crl_bench.config.schema import PRESETS

    assert PRESETS["paper"]().rollout.action_patterns == {"alfworld": OFFICIAL_ALFWORLD_PATTERN}
    assert PRESETS["cpu"]().rollout.action_patterns == {}
    backend = ForcedBackend(HFBackend("tiny-random", roles=("actor",), seed=0), lambda p: reply)
    env = gymnasium.make("crl/MiniHack-Room-Landmark-5x5-v0", max_steps=1, view="compact")
    engine = RolloutEngine(backend, SamplingParams(max_new_tokens=48, seed=0),
                           PromptConfig(history=0, stop_at_tags=False), adapter="actor",
                           action_patterns={"minihack": OFFICIAL_ALFWORLD_PATTERN})
    (traj,) = engine.run([EpisodeSpec(env=env, seed=3, options=None, group_id=0,
                                      task_name="landmark", with_experience=False,
                                      experience_ids=[], experience_text="", meta={})])
    env.close()
    assert (traj.n_actions, traj.n_invalid_format) == ((1, 0) if valid else (0, 1))


# -- row 13d: votes ------------------------------------------------------------------------------

def test_a_downvote_takes_a_vote_off_and_deletes_below_zero(tmp_path):
    """``async_memory_manager.py:1796-1869``: ``upvote`` adds one to the entry's
    ``votes_count``, ``downvote`` takes one off and deletes the entry when the count falls below
    0; a new entry starts at 0 (:1876). Parsed from the official form (``function_name`` /
    ``parameters.idx``) and ours (``op`` / ``target_ids``); ids not shown are dropped."""
    from crl_bench.experience.manager import Operation
    from crl_bench.extractor.extraction import parse_operations_official

    manager = _bank(tmp_path, 2)
    a, b = manager.bank.all_ids()
    try:
        ops, bad = parse_operations_official(
            '<answer>[{"function_name": "upvote", "parameters": {"idx": [%d, 999]}}, '
            '{"op": "downvote", "target_ids": [%d]}]</answer>' % (a, b), {a, b})
        assert not bad and [(o.kind, o.target_ids) for o in ops] == [("upvote", [a]),
                                                                     ("downvote", [b])]
        manager.apply_operations(ops, family="minihack", task_id="t", provenance={}, step=1)
        assert set(manager.bank.all_ids()) == {a}          # b: 0 - 1 < 0, deleted
        assert manager.votes(a) == 1
        for _ in range(2):
            manager.apply_operations([Operation("downvote", target_ids=[a])], family="minihack",
                                     task_id="t", provenance={}, step=2)
        assert manager.votes(a) == 0 and manager.bank.all_ids() == []   # 1 -> 0 -> -1: deleted
        assert manager.state()["votes"] == {}
    finally:
        manager.bank.close()


def test_an_official_ask_answer_is_the_tools_observation_alone():
    """``tool_env_wrapper.py:52-57``: a parsed tool call's observation is the tool's output (here
    ``Search results: ...``, ``search_and_ask_tool.py:102``), the env's observation not repeated,
    and the last allowed use adds "Reached the maximum number of tool use. Please do not use any
    tools anymore."; ours (short) wraps the advice and repeats the env's observation."""
    pytest.importorskip("torch")
    pytest.importorskip("nle")
    import gymnasium

    import crl_bench  # noqa: F401
    from _forced_backend import ForcedBackend
    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.llm.rollout import TOOL_LIMIT_LINE, EpisodeSpec, PromptConfig, RolloutEngine
    from crl_bench.llm.types import SamplingParams

    for style in ("official", "short"):
        prompts: list[str] = []

        def policy(prompt: str) -> str:
            prompts.append(prompt)
            return "<answer>north</answer>" if len(prompts) == 3 else "<ask>which rock?</ask>"
        backend = ForcedBackend(HFBackend("tiny-random", roles=("actor",), seed=0), policy)
        env = gymnasium.make("crl/MiniHack-Room-Landmark-5x5-v0", max_steps=3, view="compact")
        engine = RolloutEngine(backend, SamplingParams(max_new_tokens=16, seed=0),
                               PromptConfig(history=0, max_asks=2, ask_style=style),
                               adapter="actor",
                               ask_callback=lambda q, spec, ctx: "Search results: go north\n")
        (traj,) = engine.run([EpisodeSpec(env=env, seed=3, options=None, group_id=0,
                                          task_name="landmark", with_experience=True,
                                          experience_ids=[], experience_text="", meta={})])
        env.close()
        assert traj.n_tool_calls == 2 and traj.n_actions == 1
        user = [p.rsplit("<|im_start|>user", 1)[-1] for p in prompts]
        if style == "official":
            assert "Search results: go north" in user[1] and "rock (object)" not in user[1]
            assert TOOL_LIMIT_LINE not in user[1] and TOOL_LIMIT_LINE in user[2]
        else:
            assert "Advice for your question" in user[1] and "rock (object)" in user[1]
            assert TOOL_LIMIT_LINE not in user[2]
