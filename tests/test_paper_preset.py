"""A `paper`-shaped run on the tiny model on CPU: ``--preset paper`` with overrides only of sizes
(model, embedder, G, K, steps, tokens), device (cpu) and warm-up, so that every `paper` code
path that needs no GPU runs end to end: full fine-tuning (lora_r=0) of both roles, the
accept / refine / reject gate, the freshness wait before each rollout, the official extractor
buffer, with-experience distillation, episode-start keys, replace updates, merge samples, and the
actor side's full conversation / trajectory-level training / recomputed old log-probs."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("nle")

from crl_bench.config.schema import PRESETS, build_config  # noqa: E402
from crl_bench.records.files import read_jsonl  # noqa: E402

pytestmark = pytest.mark.slow

# sizes only: everything else stays as `paper` sets it
TINY_PAPER = {
    "model.actor": "tiny-sft", "model.extractor": "tiny-sft", "model.device": "cpu",
    "model.backend": "hf",
    "model.dtype": "float32", "experience.embedder": "all-MiniLM-L6-v2",
    "rollout.groups": 1, "rollout.group_size": 4, "rollout.max_new_tokens": 24,
    "rollout.max_episode_tokens": 2048, "rollout.env_max_steps": {"minihack": 3},
    "extractor.max_new_tokens": 48, "extractor.buffer_size": 1,
    "actor.lr": 1e-4, "extractor.lr": 1e-4,
    "experience.bank_fill_steps": 1, "experience.merge_every": 2,
    "eval.every": 0, "eval.at_start": False, "eval.episodes_per_task": 1, "threads": 1,
    # the tiny model never solves MiniHack in 3 actions: without a format penalty every return is
    # 0 and the actor update has nothing to push (the tiny/cpu presets do the same)
    "rollout.format_penalty": 0.1,
    # the tiny model learnt its formats on the language view: from the official 9x9-crop
    # observations it writes no valid entry in step 1, and the gate would have nothing to judge
    # (the official view and layout are tested in tests/test_minihack_official_view.py)
    "rollout.env_kwargs": {"minihack": {"view": "full"}},
    # 3 steps: retrieval from the first (paper waits 5 warm-up steps), and the short extraction
    # prompt the tiny model learnt (under the launched one every tiny extraction is malformed, so
    # the bank would stay empty and no with-experience episode would get an entry)
    "experience.memory_warmup": 0, "extractor.extraction_style": "short",
}


def test_paper_needs_a_gpu_only_through_device_and_backend():
    """The GPU check applies because paper asks for device=cuda and the vllm backend; with
    device=cpu and the hf backend the same configuration builds, every other paper value
    unchanged."""
    cfg = build_config(agent="comp_rl", tasks="minihack", preset="paper",
                       overrides={"model.device": "cpu", "model.backend": "hf"})
    paper = PRESETS["paper"]()
    assert paper.model.backend == "vllm" and cfg.model.lora_r == 0
    assert cfg.extractor == paper.extractor and cfg.experience == paper.experience
    assert cfg.rollout == paper.rollout and cfg.actor == paper.actor


def test_paper_preset_extractor_and_experience_values():
    """The official values (single_task_complementaryrl.yaml at ab2574f; docs/fidelity.md)."""
    cfg = PRESETS["paper"]()
    m, e, x = cfg.model, cfg.extractor, cfg.experience
    assert (m.lora_r, cfg.actor.lr, e.lr) == (0, 1e-6, 1e-6)             # full fine-tuning, lr 1e-6
    assert (e.max_new_tokens, e.max_trajectory_chars, e.keep_reasoning) == (8192, 0, True)
    assert (e.distill, e.sample_policy, e.buffer_size, e.train_malformed) == (
        "with_experience", "buffer", 64, False)
    assert (e.update_mode, e.train_merges, e.wait_before_rollout) == ("replace", True, True)
    assert (e.cooldown, e.count_power) == (1, 0.5)
    assert (x.key, x.gate, x.ask_k, x.bank_fill_steps) == ("episode_start", True, 1, 6)
    assert cfg.rollout.env_max_steps["alfworld"] == 30


def test_shared_params_ablation_is_one_switch_under_paper(tmp_path):
    """comp_rl_shared_params under paper: no second override; the actor's model serves both."""
    from crl_bench.run.context import RunContext
    from crl_bench.records.files import RunDir

    cfg = build_config(agent="comp_rl_shared_params", tasks="minihack", preset="paper",
                       overrides={**TINY_PAPER, "model.extractor": "Qwen/Qwen3-4B-Thinking-2507"})
    ctx = RunContext(cfg, RunDir(tmp_path / "run"))
    ctx.build_models(extractor=True, shared_params=True)  # would need Qwen3 if it were used
    assert ctx.ext_raw is ctx.raw_backend and ctx.raw_backend.shared_adapter
    a = ctx.raw_backend.trainable_parameters("actor")
    assert [id(p) for p in a] == [id(p) for p in ctx.raw_backend.trainable_parameters("extractor")]
    assert len(a) == sum(1 for _ in ctx.raw_backend._models["shared"].parameters())  # full FT


@pytest.mark.parametrize("gate", [True, False])
def test_paper_shaped_run_on_the_tiny_model(tmp_path, gate):
    """gate on (paper): the tiny model's verdicts do not parse, so nothing is shown and the
    writers are credited with the plain episode score (official: ``critic_score is None`` -> no
    memory shown, writers still credited, memory_integration_mixin.py:108-129); gate off
    (``experience.gate=false``): the entries are shown and credited, and the extractor is trained
    from the official buffer."""
    from crl_bench.runner.api import run_experiment

    overrides = dict(TINY_PAPER) if gate else {**TINY_PAPER, "experience.gate": False}
    path = run_experiment("comp_rl", "minihack", "paper", 0, tmp_path / "run", steps=3,
                          progress=False, overrides=overrides)
    metrics = [m for m in read_jsonl(path / "metrics.jsonl") if "timing_s/rollout" in m]
    assert len(metrics) == 3
    # the freshness wait ran before every rollout but those right after an extractor update was
    # launched (official fence, multi_agentic_pipeline.py:1237-1239 with :1603-1604: no flush then)
    skipped = metrics[-1].get("extractor/flush_skipped", 0)
    assert sum("timing_s/bank_wait" in m for m in metrics) == len(metrics) - skipped
    assert "timing_s/bank_wait" in metrics[0]
    # warm-up step 1: no actor update; then updates of the fully trained actor
    assert "losses/actor_samples" not in metrics[0]
    assert all(m["losses/actor_samples"] > 0 for m in metrics[1:])
    assert any(m["losses/actor_grad_norm"] > 0 for m in metrics[1:])
    last = metrics[-1]
    # only the with-experience half (K/2 = 2 per step) is distilled; the freshness wait before
    # step 3's rollout guarantees that steps 1 and 2 were distilled when step 3's row is written
    assert last["extractor/extractions"] == last["extractor/not_distilled"]
    assert last["extractor/extractions"] in (4, 6)
    episodes = [e for e in read_jsonl(path / "episodes.jsonl") if e["phase"] == "train"]
    assert len(episodes) == 12 and sum(e["with_experience"] for e in episodes) == 6
    later = [e for e in episodes if e["with_experience"] and e["step"] > 1]
    judged = sum(v for k, v in last.items() if k.startswith("extractor/gate_"))
    if gate:
        assert "timing_s/gate" in metrics[1] and judged == len(later) == 4
        # an unparseable verdict drops the entry (nothing shown, nothing credited); a verdict keeps it
        verdicts = sum(last.get(f"extractor/gate_{v}", 0) for v in ("accept", "refine", "reject"))
        assert sum(1 for e in later if e["experience_ids"]) == verdicts
    else:
        assert judged == 0 and all(e["experience_ids"] for e in later)
        assert any(m.get("extractor/updates", 0) >= 1 for m in metrics)
        assert any(m.get("losses/extractor_samples", 0) == 1 for m in metrics)  # buffer of 1


def test_paper_evaluates_swe_on_verified_only_where_its_data_exists(tmp_path, monkeypatch):
    """SWE-bench Verified (the paper's SWE benchmark) where its data exists, `mini` otherwise."""
    from crl_bench.mixes import SWE
    from crl_bench.envs.swe.verified import SWE_VERIFIED_ENV
    from crl_bench.run.context import RunContext
    from crl_bench.records.files import RunDir

    paper = build_config(agent="grpo", tasks="swe", preset="paper",
                         overrides={"model.device": "cpu", "model.backend": "hf"})
    tiny = build_config(agent="grpo", tasks="swe", preset="tiny")
    monkeypatch.delenv(SWE_VERIFIED_ENV, raising=False)
    ctx = RunContext(paper, RunDir(tmp_path / "a"))
    assert ctx.env_kwargs(SWE, "eval")["task_set"] == "mini"
    monkeypatch.setenv(SWE_VERIFIED_ENV, str(tmp_path / "missing.jsonl"))
    assert ctx.env_kwargs(SWE, "eval")["task_set"] == "mini"           # no data: mini
    verified = tmp_path / "swebench_verified.jsonl"
    verified.write_text("{}\n")
    monkeypatch.setenv(SWE_VERIFIED_ENV, str(verified))
    assert ctx.env_kwargs(SWE, "eval")["task_set"] == str(verified)    # data: Verified
    assert ctx.env_kwargs(SWE, "train")["task_set"] == "mini"          # training stays on mini
    assert RunContext(tiny, RunDir(tmp_path / "b")).env_kwargs(SWE, "eval")["task_set"] == "mini"
