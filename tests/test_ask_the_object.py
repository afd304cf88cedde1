"""Generic code asks the object, never its name: an agent declares the roles it builds, an
evaluation setting turns SWE-bench Verified on, each env family registers its retrieval query,
and agents' labels live on the agent objects."""

from __future__ import annotations

import pytest

from crl_bench.config.errors import ConfigError
from crl_bench.config.schema import PRESETS, apply_overrides
from crl_bench.registry import AGENTS

# full fine-tuning on one vLLM base (the log-probs recomputed, as vLLM needs with truncation)
FULL_FT_ON_VLLM = {"model.lora_r": 0, "model.backend": "vllm",
                   "actor.recompute_old_logprobs": True, "extractor.recompute_old_logprobs": True}


def validated(agent: str, **overrides):
    """The tiny preset for ``agent`` with ``overrides``, validated (the GPU check of
    ``build_config`` is left out: validation alone decides)."""
    cfg = PRESETS["tiny"]()
    cfg.agent, cfg.tasks = agent, "minihack"
    apply_overrides(cfg, {**FULL_FT_ON_VLLM, **overrides})
    cfg.validate()
    return cfg


@pytest.fixture
def plugin_agents():
    """Plugin-style agents registered under names of their own, as an entry point would."""
    from crl_bench.baselines.comp_rl import AGENT as COMP_RL
    from crl_bench.baselines.grpo import GRPO

    class GRPOLoo(GRPO):
        """A plugin built on grpo (another advantage baseline): the actor only."""

    agents = {
        "grpo_loo": GRPOLoo("grpo_loo", label="GRPO, leave-one-out"),
        "my_comp_shared": COMP_RL.variant("my_comp_shared", shared_params=True),
        "my_comp": COMP_RL.variant("my_comp"),
    }
    for name, agent in agents.items():
        AGENTS.register(name, agent, source="entry-point:test")
    yield agents
    for name in agents:
        AGENTS.unregister(name)


def test_full_fine_tuning_on_vllm_asks_the_agents_roles(plugin_agents):
    """grpo_loo builds the actor only (one set of weights): accepted, as grpo is; a comp_rl
    variant with shared parameters too; one with its own extractor weights is refused. The old
    check went by name: grpo_loo and my_comp_shared were refused."""
    assert plugin_agents["grpo_loo"].roles == ("actor",)
    assert plugin_agents["my_comp"].roles == ("actor", "extractor")
    for name in ("grpo", "grpo_loo", "comp_rl_shared_params", "my_comp_shared"):
        assert validated(name).model.lora_r == 0
    for name in ("comp_rl", "my_comp"):
        with pytest.raises(ConfigError, match="actor and extractor apart"):
            validated(name)
    # the extractor on a base of its own: one set of weights per model
    validated("my_comp", **{"model.extractor": "smollm2-135m"})


def test_swe_verified_evaluation_is_a_setting_that_paper_sets(tmp_path, monkeypatch):
    """``eval.swe_verified`` turns SWE-bench Verified evaluation on, whatever the preset's name:
    paper sets it; tiny with ``--set eval.swe_verified=true`` evaluates on Verified too, and
    paper with it off on ``mini`` (the old code asked ``cfg.preset == "paper"``)."""
    from crl_bench.config.schema import build_config
    from crl_bench.envs.swe.verified import SWE_VERIFIED_ENV
    from crl_bench.mixes import SWE
    from crl_bench.records.files import RunDir
    from crl_bench.run.context import RunContext

    assert PRESETS["paper"]().eval.swe_verified and not PRESETS["tiny"]().eval.swe_verified
    verified = tmp_path / "swebench_verified.jsonl"
    verified.write_text("{}\n")
    monkeypatch.setenv(SWE_VERIFIED_ENV, str(verified))
    on_cpu = {"model.device": "cpu", "model.backend": "hf"}

    def eval_task_set(preset: str, run: str, **overrides) -> str:
        cfg = build_config(agent="grpo", tasks="swe", preset=preset, overrides=overrides)
        ctx = RunContext(cfg, RunDir(tmp_path / run))
        assert ctx.env_kwargs(SWE, "train")["task_set"] == "mini"  # training stays on mini
        return ctx.env_kwargs(SWE, "eval")["task_set"]

    assert eval_task_set("tiny", "a") == "mini"
    assert eval_task_set("tiny", "b", **{"eval.swe_verified": True}) == str(verified)
    assert eval_task_set("paper", "c", **on_cpu) == str(verified)
    assert eval_task_set("paper", "d", **on_cpu, **{"eval.swe_verified": False}) == "mini"


def test_a_family_registers_its_retrieval_query_with_its_envs():
    """The query of ``experience.query=family`` is the form the family registered with its envs
    (as its system prompt is): a plugin family's own form is used; a family without one gets
    the official default ``Goal: ...\\nObservation: ...``. The built-in forms are checked against
    the official code in tests/test_fidelity_third_read.py."""
    import gymnasium

    from crl_bench.experience.manager import retrieval_query
    from crl_bench.registry import ENVS, FAMILY_QUERIES, register_env

    register_env("crl/QueryPlugin-v0", "crl_bench.envs.swe.env:SWETextEnv", family="query_plugin",
                 source="entry-point:test",
                 retrieval_query=lambda goal, obs, raw: f"find: {goal} | {raw['level']}")
    try:
        assert retrieval_query("query_plugin", "the key", "a room", "family",
                               raw_obs={"level": 3}) == "find: the key | 3"
        assert retrieval_query("query_plugin", "the key", "a room") == "the key\na room"
        assert retrieval_query("no_form_family", "g", "o", "family") == "Goal: g\nObservation: o"
        assert set(FAMILY_QUERIES) >= {"minihack", "webshop", "alfworld", "swe"}
    finally:
        ENVS.unregister("crl/QueryPlugin-v0")
        FAMILY_QUERIES.pop("query_plugin", None)
        gymnasium.registry.pop("crl/QueryPlugin-v0", None)


def test_labels_are_the_agent_objects_and_families_have_one_list(plugin_agents, capsys):
    """An agent's label and description are the object's own (``crl_bench/baselines/*.py``); the
    registry, the report and ``crl-bench list agents`` read them there, for plugins too (their
    label was their name before). The report's single-family suites are the env families'
    one list (``crl_bench.envs.FAMILIES``)."""
    from crl_bench.agent import agent_label
    from crl_bench.baselines import BUILTIN_AGENTS
    from crl_bench.baselines.comp_rl import NO_MERGE
    from crl_bench.cli import main
    from crl_bench.envs import FAMILIES
    from crl_bench.report.suites import SINGLE_TASK_MIXES, SUITES

    assert all(isinstance(target, str) for target in BUILTIN_AGENTS.values())  # no copied labels
    assert agent_label("comp_rl_no_merge") == NO_MERGE.label == "Comp. RL, no periodic merge"
    assert agent_label("grpo_loo") == "GRPO, leave-one-out"
    assert agent_label("not_an_agent") == "not_an_agent"
    assert main(["list", "agents"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.split()[0] == "comp_rl_no_merge" and line.endswith(NO_MERGE.description)
               for line in lines)
    assert SINGLE_TASK_MIXES is FAMILIES
    assert tuple(mix for mix, _ in SUITES["single"]) == FAMILIES
