"""The official pipeline as it is launched (ComplementaryRL fork of ROLL at ab2574f: the README
launches ``FullyAsyncMemoryActorPipeline``, ``roll/pipeline/agentic/multi_agentic_pipeline.py``).

Each test pins one behaviour of that code, cited file:line (paths relative to the official
repository), and the switch that selects it; ``--preset paper`` selects every one of them.
Episodes are played by the real tiny model whose completion *text* is chosen by a policy
(``ForcedBackend``), so that asks and gate answers happen exactly.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from crl_bench.experience.bank import ExperienceBank  # noqa: E402
from crl_bench.experience.manager import (ExperienceManager, Operation, RetrievalConfig,  # noqa: E402
                                          retrieval_query)
from crl_bench.config.schema import PRESETS  # noqa: E402
from tests.test_extractor_track import embedder  # noqa: E402,F401

TASK = "crl/MiniHack-Room-Adjacent-3x3-Balanced-v0"
ASK_OFFERED = "If you need advice instead"
ADVICE = "Advice for your question"


def _right_move(prompt: str) -> str:
    from tests.test_ask_credit import stairs_direction   # the learning benchmark's own reader

    return stairs_direction(prompt)


def make_ctx(tmp_path, **overrides):
    pytest.importorskip("nle")
    import crl_bench  # noqa: F401  (registers the crl/ envs)
    from crl_bench.agent import load_agent
    from crl_bench.config.schema import build_config
    from crl_bench.run.context import RunContext
    from crl_bench.records.files import RunDir

    # groups of 2 are too small for split advantages (validation asks the agent): these contexts
    # are built for the parts, not trained with split GRPO
    cfg = build_config(agent="comp_rl", tasks=TASK, preset="tiny", overrides={
        "threads": 1, "extractor.runs": "inline", "rollout.groups": 2,
        "rollout.group_size": 2, "rollout.env_max_steps": {"minihack": 2},
        "method.split_advantages": False, **overrides})
    ctx = RunContext(cfg, RunDir(tmp_path / "run"))
    ctx.seed_everything()
    load_agent("comp_rl").build(ctx)
    ctx.manager.apply_operations(
        [Operation("add", "stairs", "Step once toward the staircase down named in the observation.")],
        family="minihack", task_id="seeded", provenance={}, step=0)
    return ctx


# -- Search-and-Ask for every episode ----------------------------------------------------------

def test_every_episode_is_offered_search_and_ask_and_only_with_experience_asks_are_trained(tmp_path):
    """Official: the tool wrapper is attached to every env that has a ``tool_wrapper`` config
    (``roll/pipeline/agentic/env_manager/traj_env_manager.py:96``,
    ``examples/singletask-agentic/multitask_env_tool.yaml:280-289``) and adds its instructions at
    reset (``roll/pipeline/agentic/tools/tool_env_wrapper.py:25-28``), without-memory episodes
    and evaluation included; only episodes that evolve with memory hand their triggered
    interactions (the asks) to training (``memory_integration_mixin.py:355``)."""
    from _forced_backend import ForcedBackend

    ctx = make_ctx(tmp_path, **{"experience.ask_offer": "all"})
    try:
        advised = []

        def policy(prompt: str) -> str:
            if ASK_OFFERED in prompt:
                return "<ask>where are the stairs?</ask>"
            if ADVICE in prompt:
                advised.append(prompt)
            return f"<answer>{_right_move(prompt)}</answer>"

        ctx.backend = ForcedBackend(ctx.backend, policy)
        ctx.step = 1
        trajs = ctx.play("train", 1, ctx.plan(1, with_experience=1), sampling_seed=1)
        assert [t.with_experience for t in trajs] == [True, False, True, False]
        assert [t.n_tool_calls for t in trajs] == [1, 1, 1, 1]   # offered to both halves
        assert len(advised) == 4                                 # and answered from the bank
        asks = [s for s in ctx.extractor.samples if s.kind == "ask"]
        assert len(asks) == 2                                    # only the with-experience asks
        # evaluation without experience is offered the tool too; nothing is trained from it
        evals = ctx.play("eval", 0, ctx.eval_plan(with_experience=False)[:2], sampling_seed=0)
        assert [t.n_tool_calls for t in evals] == [1, 1]
        assert len([s for s in ctx.extractor.samples if s.kind == "ask"]) == 2
    finally:
        ctx.close()


def test_ask_offer_with_experience_keeps_the_without_half_without_the_tool(tmp_path):
    from _forced_backend import ForcedBackend

    ctx = make_ctx(tmp_path, **{"experience.ask_offer": "with_experience"})
    try:
        def policy(prompt: str) -> str:
            return ("<ask>where?</ask>" if ASK_OFFERED in prompt
                    else f"<answer>{_right_move(prompt)}</answer>")

        ctx.backend = ForcedBackend(ctx.backend, policy)
        trajs = ctx.play("train", 1, ctx.plan(1, with_experience=1), sampling_seed=1)
        assert [t.n_tool_calls for t in trajs] == [1, 0, 1, 0]
    finally:
        ctx.close()


# -- the unparseable gate verdict ----------------------------------------------------------------

def test_unparseable_gate_verdict_still_credits_the_writer_with_the_episode_score(tmp_path):
    """Official: an unparseable verdict (``critic_score is None``) clears only the shown message
    and ``memory_uids`` (``memory_integration_mixin.py:108-111``); the triggered interactions
    are kept (:129) and credited with the plain episode score, since no critic score adjusts it
    (:355-403, the ``else`` branch at :401)."""
    from _forced_backend import ForcedBackend

    ctx = make_ctx(tmp_path, **{"experience.gate": True, "experience.gate_invalid_credit": True})
    try:
        (eid,) = ctx.manager.bank.all_ids()

        def policy(prompt: str) -> str:
            if "actor-critic agent" in prompt:               # the gate's prompt: no verdict
                return "I think this knowledge is fine."
            return f"<answer>{_right_move(prompt)}</answer>"

        ctx.backend = ForcedBackend(ctx.backend, policy)
        trajs = ctx.play("train", 1, ctx.plan(1, with_experience=1), sampling_seed=1)
        with_exp = [t for t in trajs if t.with_experience]
        assert len(with_exp) == 2
        for t in with_exp:                                   # nothing shown, no verdict
            assert t.experience_ids == [] and t.meta["gate"] is None
            assert "Step once toward" not in ctx.backend.tokenizer.decode(t.turns[0].prompt_ids)
        assert [t.score for t in with_exp] == [1.0, 1.0]
        ctx.extractor.credit(trajs)
        (entry,) = ctx.manager.bank.get([eid])
        assert entry.n_used == 2 and entry.mean_outcome == 1.0   # the plain score, twice
    finally:
        ctx.close()


def test_track_credits_the_writer_of_a_gate_dropped_entry(tmp_path, embedder):  # noqa: F811
    from tests.test_extractor_fidelity import add_answer, new_manager, new_track, traj
    from tests.test_extractor_track import FixedAnswers

    manager = new_manager(tmp_path, embedder)
    track = new_track(manager, FixedAnswers([add_answer("Stairs east")]))
    track.submit(1, [traj()])
    (eid,) = manager.bank.all_ids()
    track.credit([traj(success=True, with_exp=True, ids=[], meta={"gate": None, "credit_ids": [eid]}),
                  traj(success=False, with_exp=True, ids=[], meta={"gate": None, "credit_ids": [eid]})])
    assert track.samples[0].usage == [1.0, 0.0]
    manager.bank.close()


# -- count-aware weighting as launched -------------------------------------------------------------

def test_count_aware_weighting_is_not_in_effect_as_launched():
    """Official: ``_get_usage_stats`` looks usage up by request id
    (``multi_agentic_pipeline.py:889``) and ``record_training`` is never called in the launched
    pipeline, so ``(1 + 0)^-power`` = 1 for every sample. ``paper`` follows that;
    ``extractor.count_reweight=true`` is the paper's description (the ablation's comparison)."""
    paper = PRESETS["paper"]()
    assert paper.extractor.count_reweight is False
    assert PRESETS["cpu"]().extractor.count_reweight is True


@pytest.mark.parametrize("count_reweight", [True, False])
def test_count_reweight_switch_reaches_the_track(tmp_path, count_reweight):
    """Two credited samples, one trained at the last update (inside the cooldown of 1: count-aware
    weight 0) and one fresh (weight 1): with ``extractor.count_reweight=false`` (as launched)
    both are trained with weight 1, with it on the cooled-down one gets 0. The weights come from
    the official formula (``(1 + n)^-power``, 0 while steps since training < cooldown,
    ``async_memory_manager.py`` count-aware reweighting; pinned by tests/test_algorithms_credit.py):
    n=1, power 0.5 inside the cooldown -> 0; a fresh sample -> 1."""
    from crl_bench.extractor.track import ExtractorSample

    ctx = make_ctx(tmp_path, **{"extractor.count_reweight": count_reweight,
                                "extractor.buffer_size": 2, "extractor.cooldown": 1})
    try:
        track = ctx.extractor
        track.updates = 1
        ids = ctx.backend.tokenizer("a b c", add_special_tokens=False)["input_ids"]
        track.samples = [ExtractorSample(ids, ids, [-1.0] * len(ids), "extract", 0, usage=[1.0],
                                         times_trained=1, last_trained_step=1, uid=0),
                         ExtractorSample(ids, ids, [-1.0] * len(ids), "extract", 0, usage=[-1.0],
                                         uid=1)]
        seen = []
        update = track.trainer.update
        track.trainer.update = lambda batch, **kw: (seen.append([s.weight for s in batch]),
                                                    update(batch, **kw))[1]
        track.train(1, count_aware=True)
        assert seen == ([[0.0, 1.0]] if count_reweight else [[1.0, 1.0]])
    finally:
        ctx.close()


# -- the retrieval query -----------------------------------------------------------------------------

def test_retrieval_query_per_family_as_official():
    """``build_memory_query`` (``traj_env_manager.py:127-160``): MiniHack ``Observation:
    {raw_obs}`` without the goal; WebShop ``goal: ..., observation: ...``
    (``base_env_manager.py:49-57``); others ``Goal: ...\nObservation: ...``."""
    assert retrieval_query("minihack", "Reach the stairs.", "You see: a wall", "family") \
        == "Observation: You see: a wall"
    assert retrieval_query("webshop", "buy red shoes", "WebShop [SEP] Search", "family") \
        == "goal: buy red shoes, observation: WebShop [SEP] Search"  # base_env_manager.py:49-57
    assert retrieval_query("alfworld", "put a mug", "You are in a room", "family") \
        == "Goal: put a mug\nObservation: You are in a room"
    assert retrieval_query("minihack", "g", "o") == "g\no"


def test_minihack_query_contains_no_goal_text(tmp_path):
    ctx = make_ctx(tmp_path, **{"experience.query": "family"})
    try:
        specs = ctx.player.episode_specs("train", 1, ctx.plan(1, with_experience=1))
        with_exp = [s for s in specs if s.with_experience]
        goal = with_exp[0].env.reset(seed=with_exp[0].seed)[1]["goal"]
        assert goal and all(goal not in s.meta["query"] for s in with_exp)
        assert all(s.meta["query"].startswith("Observation: ") for s in with_exp)
    finally:
        ctx.close()


# -- retrieval usage recorded after the whole batch ------------------------------------------------

@pytest.mark.parametrize("usage_per, distinct", [("batch", 1), ("pick", 2)])
def test_a_fresh_groups_with_experience_rollouts_share_one_entry(tmp_path, embedder, usage_per,  # noqa: F811
                                                                 distinct):
    """Official: the retrieval batch records usage once, after every query of the batch was
    answered (``async_memory_manager.py:900-907`` ``_record_retrieval_uids`` after the loop), so
    the 4 with-experience rollouts of a group, one batch with the same query, rank a fresh bank
    the same way and share one entry. Per pick, the second query already sees the first use."""
    bank = ExperienceBank(tmp_path / "bank.sqlite", dim=embedder.dim, embedder_name=embedder.name)
    manager = ExperienceManager(bank, embedder, RetrievalConfig(usage_per=usage_per),
                                clock=lambda: 1000.0)
    for title in ("stairs east", "stairs to the east side", "go east to the stairs"):
        manager.apply_operations([Operation("add", title, "Walk east to the stairs down.")],
                                 family="minihack", task_id="t", provenance={}, step=0)
    got = manager.retrieve(["Observation: stairs east"] * 4, family="minihack")
    assert len({r[0].id for r in got}) == distinct
    bank.close()


# -- extractor sampling and evaluation ------------------------------------------------------------

def test_paper_extractor_sampling_and_evaluation_are_the_launched_ones():
    """yaml (``examples/singletask-agentic/single_task_complementaryrl.yaml``): extractor
    ``temperature: 1.0`` (:251), top-k 50 (ROLL's generating-args default, the yaml sets none);
    ``eval_steps: 1`` (:31), ``val_batch_size: 128`` (:35), evaluation with memory only."""
    paper = PRESETS["paper"]()
    assert (paper.extractor.temperature, paper.extractor.top_p, paper.extractor.top_k) == (1.0, 0.99, 50)
    assert (paper.eval.every, paper.eval.episodes_per_task, paper.eval.modes) == (1, 128, "with_experience")
    x = paper.experience
    assert (x.ask_offer, x.ask_style, x.gate_invalid_credit, x.query, paper.retrieval.usage_per) \
        == ("all", "official", True, "family", "batch")


def test_extractor_top_k_reaches_the_sampler_and_log_probs_use_the_sampling_temperature(tmp_path):
    ctx = make_ctx(tmp_path, **{"extractor.top_k": 50, "extractor.temperature": 1.0})
    try:
        assert ctx.extractor_sampling.top_k == 50 and ctx.extractor_sampling.temperature == 1.0
        assert ctx.extractor.temperature == 1.0     # training log-probs on the raw logits
    finally:
        ctx.close()


# -- Search-and-Ask answer: official prompt, no cap, unparseable answers handed on and trained ----

class _Answer:
    def __init__(self, text):
        self.text = text

    def __call__(self, message_lists, stop=()):
        self.messages = message_lists
        return [type("G", (), {"text": self.text})()]


@pytest.mark.parametrize("style", ["short", "official"])
def test_unparseable_ask_answer_is_handed_on_and_not_malformed_officially(tmp_path, embedder,  # noqa: F811
                                                                        style):
    """Official (``async_memory_manager.py:2822-2830``): without an ``<answer>`` match the whole
    response is the tool's answer, and the call is a triggered interaction like any other
    (trained); no length cap. Ours ("short"): malformed, the actor gets the entries."""
    from crl_bench.extractor.search_ask import SearchAndAsk

    bank = ExperienceBank(tmp_path / "bank.sqlite", dim=embedder.dim, embedder_name=embedder.name)
    manager = ExperienceManager(bank, embedder, RetrievalConfig(diversify=False))
    manager.apply_operations([Operation("add", "stairs", "Walk to the stairs.")],
                             family="minihack", task_id="t", provenance={}, step=0)
    long_text = "Go east along the corridor, then take the stairs down. " * 40   # > 1,500 chars
    saa = SearchAndAsk(manager, _Answer(long_text), k=1, style=style)
    guidance = saa("where are the stairs?", {"goal": "Reach the stairs.", "family": "minihack"})
    (sample,) = saa.samples
    if style == "official":
        # the tool's observation wraps it (tools/search_and_ask_tool.py:102)
        assert guidance == f"Search results: {long_text.strip()}\n" and not sample.malformed
        assert saa.generate.messages[0][1]["content"].startswith("**Query:**\nwhere are the stairs?")
    else:
        assert sample.malformed and guidance.startswith("Related experience:")
    bank.close()


# -- extraction: detailed entries, a parser that caps nothing, ops before a return apply ----------

def test_official_extraction_parser_accepts_what_the_official_parser_accepts():
    """``parse_functional_operations_from_response`` (``async_memory_manager.py:1172-1312``):
    a list or one object, no cap on operations or text length, official keys; and
    ``execute_functional_operations`` (:1788-1795) stops at ``return``, keeping what came
    before it."""
    from crl_bench.extractor.extraction import parse_operations, parse_operations_official

    long = "Step toward the stairs; if a wall blocks, go around it. " * 60        # > 2,000 chars
    adds = [{"op": "add", "title": f"t{i}", "content": long} for i in range(5)]  # > 3 operations
    answer = "<answer>" + __import__("json").dumps(adds + [{"op": "return"}, adds[0]]) + "</answer>"
    ops, bad = parse_operations_official(answer, set())
    assert not bad and [o.title for o in ops] == ["t0", "t1", "t2", "t3", "t4"]
    assert parse_operations(answer, set())[1]                     # ours: malformed
    official = ('<answer>{"function_name": "update", "parameters": {"idx": [7, 99], '
                '"updated_memory": "<title>Stairs</title><content>Walk east.</content>"}}</answer>')
    (op,), bad = parse_operations_official(official, {7})
    assert not bad and (op.kind, op.title, op.content, op.target_ids) == ("update", "Stairs", "Walk east.", [7])
    (vote,), bad = parse_operations_official('<answer>[{"function_name": "upvote", "parameters": '
                                             '{"idx": [1]}}]</answer>', set())
    assert not bad and (vote.kind, vote.target_ids) == ("upvote", [])  # id 1 was not shown
    for bad_answer in ("no block", "<answer>not json</answer>", '<answer>[{"op": "delete"}]</answer>',
                       '<answer>[{"op": "add", "title": "x"}]</answer>'):
        assert parse_operations_official(bad_answer, set())[1], bad_answer


def test_official_extraction_prompt_asks_for_detailed_step_by_step_entries():
    """``FUNCTIONAL_MEMORY_MODEL_SYS_PROMPT_VOTING_251207`` (``memory_prompts.yaml``, "MEMORY
    CONTENT REQUIREMENTS"): situation, step-by-step actions, if-then logic, what not to do."""
    from crl_bench.extractor.extraction import build_extraction_messages

    outcome = {"success": True, "score": 1.0, "n_actions": 3}
    short = build_extraction_messages("g", "t", outcome, [])[0]["content"]
    official = build_extraction_messages("g", "t", outcome, [], style="official")[0]["content"]
    assert "one to four sentences" in short and "one to four sentences" not in official
    assert "step-by-step" in official and "if-then" in official and "what not to do" in official


# -- fencing: no flush (and no merge) while an extractor update runs ------------------------------

def test_training_flag_is_up_exactly_while_the_extractor_update_runs(tmp_path, embedder):  # noqa: F811
    """``_has_pending_memory_train`` (``multi_agentic_pipeline.py:1237``) is what the official
    fence reads; ours is ``ExtractorTrack.training``, up during the real update only."""
    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.config.schema import ExtractorConfig
    from crl_bench.training.role_trainer import RoleTrainer
    from tests.test_extractor_fidelity import new_manager, new_track, traj
    from tests.test_extractor_track import ModelAnswers

    backend = HFBackend("tiny-random", roles=("extractor",), seed=0)
    manager = new_manager(tmp_path, embedder)
    cfg_kw = dict(answer_template="content", buffer_size=1, micro_batch_size=1, lr=1e-2,
                  sample_policy="buffer", train_malformed=False)
    trainer = RoleTrainer(backend, "extractor", ExtractorConfig(**cfg_kw), total_steps=2)
    track = new_track(manager, ModelAnswers(backend, ['Go east."']), trainer, **cfg_kw)
    seen = []
    update = trainer.update
    trainer.update = lambda *a, **k: (seen.append(track.training), update(*a, **k))[1]
    track.submit(1, [traj("Reach A.")])
    track.record_usage(manager.bank.all_ids(), 1.0)
    assert not track.training
    track.submit(2, [])
    assert seen == [True] and not track.training and track.updates == 1
    manager.bank.close()


def test_official_fence_skips_the_flush_while_training_and_merges_inside_the_flush(tmp_path):
    """``should_flush_pending_updates_before_rollout`` (``async_memory_fencing.py:4-5``) is
    False while an extractor update is pending: no flush (``multi_agentic_pipeline.py:1237``),
    and the every-``merging_interval`` merge sits inside the flush block (:1255-1261)."""
    import threading

    from tests.test_extractor_fidelity import add_answer, traj
    from tests.test_extractor_track import FixedAnswers

    ctx = make_ctx(tmp_path, **{"extractor.wait_before_rollout": True, "extractor.fence": "official",
                                "extractor.runs": "thread", "experience.merge_every": 2,
                                "extractor.merge_format": "items"})
    try:
        track = ctx.extractor
        assert track.fence_merges
        release = threading.Event()
        fixed = FixedAnswers([add_answer("A"), "<answer>return</answer>"])

        def slow(batch, stop=("</answer>",)):
            release.wait(30)
            return fixed(batch, stop)
        track.generate = slow
        track.submit(1, [traj()])                    # its bank write is pending (blocked)
        track._training_now = True                   # as during an update (flag: test above)
        ctx.step = 2
        ctx.wait_for_bank()                          # returns at once: no flush while training
        assert track.stats["flush_skipped"] == 1 and track.stats.get("merges", 0) == 0
        track._training_now = False
        release.set()
        ctx.wait_for_bank()                          # flushes, then merges (step 2 % 2 == 0)
        assert len(ctx.manager.bank) == 2 and track.stats["merges"] == 1
        track.wait_idle(30)
        assert track.stats["merges"] == 1            # the batch itself merged nothing
    finally:
        release.set()
        ctx.close()


# -- max tokens: prompt + generation, as the official sequence_length --------------------------------

def test_sequence_length_counts_prompt_and_generation(tmp_path):
    """``traj_env_manager.py:318-331``: a turn whose prompt reaches ``sequence_length`` ends
    the episode; otherwise ``max_new_tokens = min(max_tokens_per_step, sequence_length -
    prompt length)``."""
    from _forced_backend import ForcedBackend

    ctx = make_ctx(tmp_path)
    try:
        backend = ForcedBackend(ctx.backend, lambda p: "<answer>wait</answer>")
        import gymnasium

        from crl_bench.llm.rollout import EpisodeSpec, PromptConfig, RolloutEngine
        from crl_bench.llm.types import SamplingParams

        def run(seq):
            engine = RolloutEngine(backend, SamplingParams(temperature=1.0, max_new_tokens=24, seed=1),
                                   PromptConfig(max_turns=6, conversation="full", sequence_length=seq))
            return engine.run([EpisodeSpec(env=gymnasium.make(TASK), seed=0)])[0]

        free = run(None)
        first = len(free.turns[0].prompt_ids)
        capped = run(first + 5)              # the first turn may generate at most 5 tokens
        assert len(capped.turns[0].completion_ids) <= 5
        assert capped.truncated and len(capped.turns) == 1
        assert capped.meta["end_reason"] == "sequence_length"
        assert len(run(first).turns) == 0    # the first prompt already reaches it
    finally:
        ctx.close()


def test_official_ask_style_puts_the_long_tool_instruction_in_the_first_prompt():
    """``search_and_ask_tool.py:29-60``: the tool instruction (when to use it, how to build the
    query around state / blocker / what was tried / what is needed, the usage limit) is added to
    the observation at reset (``tool_env_wrapper.py:25-28``); ours: ``ask_style=official``."""
    from crl_bench.llm.prompting import PromptConfig, build_messages

    def user(style, asks_left):
        cfg = PromptConfig(max_asks=2, ask_style=style)
        return build_messages(cfg, family="minihack", goal="g", observation="o", history=[],
                              admissible_actions=None, asks_left=asks_left)[1]["content"]

    official = user("official", 2)
    assert "at most 2 times" in official and "What have I tried" in official and "<ask>" in official
    assert "What have I tried" not in user("short", 2)
    assert "What have I tried" not in user("official", 0)      # no asks left: not offered
