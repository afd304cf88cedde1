"""`crl-bench plan` for any GPU count and for LoRA, and its step-time estimate per part.

FLOP figures are checked against values computed here by hand from the published Qwen2.5-7B
config.json (huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/config.json: num_hidden_layers 28,
hidden_size 3584, intermediate_size 18944, num_attention_heads 28, num_key_value_heads 4,
vocab_size 152064; head_dim = 3584 / 28 = 128) and the count of PaLM (Chowdhery et al. 2022,
appendix B: 6N + 12 L H Q T per trained token).
"""

from __future__ import annotations

import json

import pytest

from crl_bench.cli import main
from crl_bench.distributed.memory_plan import (QWEN25_7B, build_plan, forward_flops_per_token,
                                               lora_params, matmul_params, refusal, split_gpus,
                                               train_flops_per_token)
from crl_bench.config.schema import PRESETS, apply_overrides

L, H, Q, D, I, KV, V = 28, 28, 128, 3584, 18944, 4 * 128, 152064


def paper(**overrides):
    return apply_overrides(PRESETS["paper"](), overrides)


def test_flops_per_token_of_qwen25_7b_by_hand():
    # the matrix products: q (D x D), k and v (D x 512), o (D x D), gate/up/down (3 x D x I) per
    # layer, and the LM head (V x D); the embedding is a lookup, norms and biases elementwise
    n = L * (D * D + 2 * D * KV + D * D + 3 * D * I) + V * D
    assert matmul_params(QWEN25_7B) == n == 7_070_285_824
    t = 32768
    attn = 4 * L * H * Q * t  # QK^T and AV, a multiply-add each, per layer and head
    assert forward_flops_per_token(QWEN25_7B, t) == 2 * n + attn == 27_293_908_992
    # PaLM's 6N + 12LHQT, plus the recomputed forward with checkpointing (Megatron's 4 passes)
    assert train_flops_per_token(QWEN25_7B, t, checkpointing=False) == 6 * n + 12 * L * H * Q * t
    assert train_flops_per_token(QWEN25_7B, t) == 8 * n + 16 * L * H * Q * t == 109_175_635_968
    # LoRA: no weight gradients of the frozen base
    assert train_flops_per_token(QWEN25_7B, t, lora=True) == 6 * n + 16 * L * H * Q * t
    # attention at 32k tokens is nearly as large as the weights' share: leaving it out (8N only)
    # undercounts the update by ~48%
    assert 8 * n / train_flops_per_token(QWEN25_7B, t) == pytest.approx(0.518, abs=0.001)


def test_lora_adapter_parameters_by_hand():
    r = 16
    per_layer = r * ((D + D) + 2 * (D + KV) + (D + D) + 2 * (D + I) + (I + D))
    assert lora_params(QWEN25_7B, r) == L * per_layer == 40_370_176


@pytest.mark.parametrize("gpus,layout", [
    (1, {"actor_engine_gpus": 1, "actor_ranks": 1, "extractor_engine_gpus": 1,
         "extractor_ranks": 1, "all_colocated": True}),
    (2, {"actor_engine_gpus": 1, "actor_ranks": 1, "actor_colocated": True,
         "extractor_colocated": True}),
    (6, {"actor_engine_gpus": 1, "actor_ranks": 2, "extractor_engine_gpus": 1,
         "extractor_ranks": 2, "all_colocated": False}),
    (7, {"actor_engine_gpus": 2, "actor_ranks": 2, "extractor_engine_gpus": 1,
         "extractor_ranks": 2}),
    (16, {"actor_engine_gpus": 4, "actor_ranks": 4, "extractor_engine_gpus": 4,
          "extractor_ranks": 4, "all_colocated": False, "actor_colocated": False}),
])
def test_any_gpu_count_is_laid_out(gpus, layout):
    split = split_gpus(gpus)
    assert {k: split[k] for k in layout} == layout
    # every GPU is used: a role on one GPU shares it between its engine and its learner, and
    # with one GPU in all both roles share it
    per_role = [1 if split[f"{r}_colocated"] else split[f"{r}_engine_gpus"] + split[f"{r}_ranks"]
                for r in ("actor", "extractor")]
    assert (1 if split["all_colocated"] else sum(per_role)) == gpus


SPLIT = {"model.placement": "split"}
"""The layout with a role's engines and learner ranks on GPUs of their own (``paper16-split``)."""


def test_plan_16_gpus_estimates_each_part(capsys):
    assert main(["plan", "--gpus", "16", "--gpu-memory", "80", "--set", "model.placement=split"]) == 0
    out = capsys.readouterr().out
    # official yaml (ComplementaryRL, examples/singletask-agentic/single_task_complementaryrl.yaml):
    # actor_train and actor_infer on GPUs 0-7 (:87, :111), the memory model on 8-15 (:247, :291),
    # its vLLM engine at tensor_parallel_size 4 (:261)
    assert "extractor: 1 vLLM engine x 4 GPU + 4 learner ranks" in out
    for part in ("actor generation", "actor old log-probs", "actor update", "actor weight sync",
                 "extractor generation", "extractor update", "extractor weight sync"):
        assert f"  {part} " in out
    assert "an estimate" in out and "not a measurement" in out and "PaLM" in out
    plan = build_plan(paper(**SPLIT), 16, 80)
    parts = {p["part"]: p for p in plan.step["parts"]}
    cfg = paper(**SPLIT)
    seq, episodes = 32768, cfg.rollout.groups * cfg.rollout.group_size
    tokens = episodes * seq
    # the actor update, by hand: tokens x (8N + 16 LHQT) + the chunks' vocabulary projection
    # again, over 4 ranks at MFU 0.4 of 989 TFLOP/s
    flops = tokens * 109_175_635_968 + 2 * V * D * tokens
    assert parts["actor update"]["flops"] == flops
    assert parts["actor update"]["seconds"] == pytest.approx(flops / (4 * 989e12 * 0.4))
    assert parts["actor old log-probs"]["flops"] == tokens * 27_293_908_992
    # decoding is bound by HBM: each decode step reads the bf16 weights and the running
    # sequences' KV cache (half full on average); 27 sequences fit an engine's KV cache at once
    gen = parts["actor generation"]
    kv_tokens = plan.roles[0].lines["kv_tokens"]
    at_once = int(kv_tokens // seq)
    waves = -(-(episodes // 4) // at_once)
    step_bytes = 2 * QWEN25_7B.params() + at_once * seq / 2 * 2 * L * KV * 2
    assert gen["bound"] == "memory bandwidth"
    assert gen["seconds"] == pytest.approx(waves * seq * step_bytes / 3.35e12)
    assert parts["actor weight sync"]["seconds"] == pytest.approx(2 * QWEN25_7B.params() / 50e9)
    actor = sum(p["seconds"] for p in plan.step["parts"] if p["role"] == "actor")
    assert plan.step["step_s"] == pytest.approx(max(actor, plan.step["extractor_s"]))


def test_plan_6_gpus(capsys):
    # 3 GPUs per role: one engine GPU, two learner ranks; the extractor's tensor parallel 4
    # shrinks to the one engine GPU it has, and the plan says so
    assert main(["plan", "--gpus", "6", "--gpu-memory", "141", "--set",
                 "model.placement=split"]) == 0
    out = capsys.readouterr().out
    assert "actor: 1 vLLM engine x 1 GPU + 2 learner ranks x 1 GPU, on 3 GPUs of its own" in out
    assert "tensor parallel 1 instead of the configured 4" in out
    # on 80 GB the actor's states over 2 ranks do not fit: refused, naming fixes that do fit
    plan = build_plan(paper(**SPLIT), 6, 80)
    assert not plan.fits
    text = refusal(plan)
    assert "--gpus 9" in text and "--lora" in text
    assert build_plan(paper(**SPLIT), 9, 80).fits
    assert build_plan(paper(**{"model.lora_r": 16}, **SPLIT), 6, 80).fits


def test_plan_1_gpu_full_fine_tuning_is_refused_with_fixes(capsys):
    assert main(["plan", "--gpus", "1", "--gpu-memory", "80"]) == 1
    captured = capsys.readouterr()
    assert "on the run's one GPU, shared with the other role" in captured.out
    assert "refused" in captured.err and "--lora" in captured.err
    assert "actor + extractor" in captured.out  # the roles take turns on one GPU


def test_plan_lora_on_one_gpu_names_the_utilizations_that_fit(capsys):
    assert main(["plan", "--gpus", "1", "--gpu-memory", "141", "--lora", "--json"]) == 1
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["lora_r"] == 16 and doc["fits"] is False
    learner = [r for r in doc["roles"] if (r["role"], r["part"]) == ("actor", "learner")][0]
    # the frozen bf16 base on the rank, the adapters' fp32 states
    assert learner["lines"]["weights"] == 2 * QWEN25_7B.params() + 4 * lora_params(QWEN25_7B, 16)
    assert learner["lines"]["optimizer"] == 8 * lora_params(QWEN25_7B, 16)
    fix = learner["fixes"][0]
    sets = [a for a in fix.split("(")[1].rstrip(")").split() if a != "--set"]
    assert sets and all(s.startswith("model.") for s in sets)
    # the utilizations it names do fit
    fixed = paper(**{"model.lora_r": 16}, **{k: float(v) for k, v in (s.split("=") for s in sets)})
    assert build_plan(fixed, 1, 141).fits
    assert main(["plan", "--gpus", "1", "--gpu-memory", "141", "--lora",
                 *(x for s in sets for x in ("--set", s))]) == 0
    out = capsys.readouterr().out
    assert "LoRA adapters (r=16)" in out and "0.08 GB of bf16 adapters" in out
    assert main(["plan", "--lora", "0"]) == 2


def test_the_docs_step_table_is_the_plans():
    """docs/scaling.md's estimated step of the paper preset on 16 x 80 GB, recomputed."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "scaling.md").read_text()
    plan = build_plan(paper(), 16, 80)
    parts = {p["part"]: p for p in plan.step["parts"]}
    names = {"actor rollout generation": "actor generation"}
    rows = re.findall(r"^\| ((?:actor|extractor) [a-z -]+?)(?: \(.*?\))? \| ([\d,-]+) \| [\d-]+ \| "
                      r"([\d.,]+) \|", text, flags=re.M)
    assert len(rows) == 8
    for name, tflop, seconds in rows:
        p = parts[names.get(name, name)]
        if tflop != "-":
            assert int(tflop.replace(",", "")) == round(p["flops"] / 1e12)
        assert float(seconds.replace(",", "")) == pytest.approx(p["seconds"], abs=0.5)
    step = re.search(r"\*\*step\*\* .*?\*\*([\d,]+)\*\*", text).group(1)
    assert int(step.replace(",", "")) == round(plan.step["step_s"])
