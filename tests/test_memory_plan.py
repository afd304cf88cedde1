"""The memory plan (crl_bench/distributed/memory_plan.py, ``crl-bench plan``): figures derived by
hand, architecture numbers checked against the transformers models they describe, activation bytes
against what autograd really saves, the whole learner against a measured peak on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crl_bench.distributed.memory_plan import (BF16_FP32_MASTERS, FP32, FSDP2_MIXED, GB, QWEN3_4B,
                                               QWEN25_7B, TRAINER_MASTERS,
                                               build_plan, engine, learner_rank, micro_batch_tokens,
                                               refusal, shape_from_hf_config, split_gpus)
from crl_bench.distributed.plan import PLANS
from crl_bench.config.schema import PRESETS, apply_overrides

ROOT = Path(__file__).resolve().parents[1]


def _paper(**overrides):
    return apply_overrides(PRESETS["paper"](), overrides)


# -- hand figures ------------------------------------------------------------------------------
def test_parameter_counts_by_hand():
    # Qwen2.5-7B: embedding and LM head 152064 x 3584 each; per layer q (3584^2 + bias), k and v
    # (3584 x 512 + bias), o (3584^2), MLP 3 x 3584 x 18944, two norms; 28 layers; final norm
    layer = ((3584 * 3584 + 3584) + 2 * (3584 * 512 + 512) + 3584 * 3584 + 3 * 3584 * 18944
             + 2 * 3584)
    assert QWEN25_7B.params() == 2 * 152064 * 3584 + 28 * layer + 3584 == 7_615_616_512
    # Qwen3-4B: tied embedding; q 2560 x 4096, k, v 2560 x 1024, o 4096 x 2560, no biases, q/k norms
    layer = 2560 * 4096 + 2 * 2560 * 1024 + 4096 * 2560 + 3 * 2560 * 9728 + 2 * 2560 + 2 * 128
    assert QWEN3_4B.params() == 151936 * 2560 + 36 * layer + 2560 == 4_022_468_096


def test_sixteen_bytes_per_parameter_sharded_over_ranks():
    n = QWEN25_7B.params()
    # bf16 weights 2 + bf16 grads 2 + fp32 masters 4 + AdamW m, v 8; FSDP2's policy: fp32 sharded
    # params (the masters) 4 + fp32 grads 4 + 8; the one-process trainer: 2 + fp32 grads 4 + 4 + 8
    for precision, split in ((BF16_FP32_MASTERS, (2, 2, 4, 8)), (FSDP2_MIXED, (0, 4, 4, 8)),
                             (TRAINER_MASTERS, (2, 4, 4, 8)), (FP32, (4, 4, 0, 8))):
        for ranks in (1, 4, 8):
            lines = learner_rank(QWEN25_7B, ranks, tokens=1, scored=1, precision=precision)
            states = lines["weights"] + lines["grads"] + lines["masters"] + lines["optimizer"]
            assert states == pytest.approx(sum(split) * n / ranks)
            assert (lines["weights"], lines["grads"], lines["masters"], lines["optimizer"]) == \
                pytest.approx(tuple(b * n / ranks for b in split))
    # 7.6e9 x 16 B over the paper's 4 actor learner ranks: 30.46 GB each
    assert learner_rank(QWEN25_7B, 4, 1, 1)["optimizer"] * 2 / GB == pytest.approx(30.46, abs=0.01)
    assert BF16_FP32_MASTERS.state_bytes == FSDP2_MIXED.state_bytes == FP32.state_bytes == 16
    assert TRAINER_MASTERS.state_bytes == 18
    # one process holds nothing gathered; FSDP holds two bf16 layers and their gradients
    assert learner_rank(QWEN25_7B, 1, 1, 1)["fsdp_gather"] == 0
    assert learner_rank(QWEN25_7B, 4, 1, 1)["fsdp_gather"] == 2 * QWEN25_7B.layer_params() * 2 * 2


def test_kv_cache_bytes_per_token():
    # 2 (K and V) x layers x kv_heads x head_dim x 2 B
    assert QWEN25_7B.kv_bytes_per_token() == 2 * 28 * 4 * 128 * 2 == 57_344
    assert QWEN3_4B.kv_bytes_per_token() == 2 * 36 * 8 * 128 * 2 == 147_456
    e = engine(QWEN25_7B, 1, 80 * GB, 0.85, 32768, workspace=2 * GB)
    assert e["weights"] == QWEN25_7B.params() * 2
    assert e["kv_cache"] == pytest.approx(0.85 * 80 * GB - QWEN25_7B.params() * 2 - 2 * GB)
    assert e["kv_tokens"] == pytest.approx(e["kv_cache"] / 57_344)
    # tensor parallelism over 2 GPUs halves the weights per GPU and adds both GPUs' caches
    e2 = engine(QWEN25_7B, 2, 80 * GB, 0.85, 32768, workspace=2 * GB)
    assert e2["weights"] == e["weights"] / 2 and e2["kv_tokens"] > 2 * e["kv_tokens"]


def test_checkpointing_keeps_layer_inputs_and_one_layer():
    t = 1000
    lines = learner_rank(QWEN25_7B, 4, t, 0)
    per_layer = QWEN25_7B.activation_bytes_per_token(2)
    outside = (4 * 3584 + 4 * 3584) * t
    assert lines["activations_no_ckpt"] == 28 * per_layer * t + outside
    assert lines["activations_ckpt"] == 28 * 2 * 3584 * t + per_layer * t + outside
    assert lines["activations"] == lines["activations_ckpt"]
    assert learner_rank(QWEN25_7B, 4, t, 0, checkpointing=False)["activations"] == \
        lines["activations_no_ckpt"]
    # the total is the states plus the larger of (activations + logits) and the step temporaries
    states = sum(lines[k] for k in ("weights", "grads", "masters", "optimizer", "fsdp_gather"))
    peak = max(lines["activations"] + lines["logits"], lines["step_temp"])
    assert lines["total"] == states + peak
    assert learner_rank(QWEN25_7B, 4, t, 100)["logits"] == 16 * 152064 * 100


def test_micro_batch_tokens_follow_the_trainer():
    from crl_bench.training.role_trainer import TrainSample, micro_batches

    assert micro_batch_tokens(8, 0, 32768) == 8 * 32768  # no budget: the sample count alone
    assert micro_batch_tokens(8, 65536, 32768) == 65536
    assert micro_batch_tokens(8, 1000, 32768) == 32768  # a longer sample goes alone
    # the worst padded micro-batch the trainer's own cut makes, over every sample length up to
    # the longest (100 tokens here), is the plan's figure
    for size, budget in ((8, 0), (8, 250), (3, 0), (8, 50), (2, 1000)):
        worst = 0
        for length in range(1, 101):
            samples = [TrainSample([1], [2] * (length - 1), [0.0] * (length - 1), 1.0)
                       for _ in range(12)]
            worst = max(worst, *(len(c) * length for c in micro_batches(samples, size, budget)))
        assert micro_batch_tokens(size, budget, 100) == worst, (size, budget)


# -- against the models themselves --------------------------------------------------------------
def test_shapes_match_the_transformers_models():
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config

    import dataclasses

    for full, cls in ((QWEN25_7B, Qwen2Config), (QWEN3_4B, Qwen3Config)):
        shape = dataclasses.replace(full, layers=2, source="")  # 2 layers: the count per layer
        cfg = cls(hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                  num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                  num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
                  vocab_size=shape.vocab, tie_word_embeddings=shape.tie_embeddings)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
        assert sum(p.numel() for p in model.parameters()) == shape.params()
        assert shape_from_hf_config(cfg, shape.name) == shape


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float32"])
def test_activation_bytes_equal_what_autograd_saves(family, dtype_name):
    """The per-token, per-layer count equals the bytes of the tensors autograd saves in a real
    forward pass (difference between a 3-layer and a 1-layer model, parameters excluded)."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config

    dtype = getattr(torch, dtype_name)
    cls = Qwen2Config if family == "qwen2" else Qwen3Config
    b, s = 2, 64

    def saved_bytes(layers: int) -> tuple[int, object]:
        cfg = cls(hidden_size=128, intermediate_size=352, num_hidden_layers=layers,
                  num_attention_heads=8, num_key_value_heads=2, head_dim=24, vocab_size=512,
                  tie_word_embeddings=False)
        cfg._attn_implementation = "sdpa"
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        seen: dict[int, int] = {}

        def pack(t):
            st = t.untyped_storage()
            if st.data_ptr() not in params:
                seen[st.data_ptr()] = st.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=torch.randint(0, 512, (b, s)), use_cache=False, logits_to_keep=1)
        return sum(seen.values()), cfg

    one, _ = saved_bytes(1)
    three, cfg = saved_bytes(3)
    measured = (three - one) / 2 / (b * s)
    shape = shape_from_hf_config(cfg)
    assert measured == shape.activation_bytes_per_token(2 if dtype_name == "bfloat16" else 4)


def test_cpu_peak_within_20_percent_of_the_plan(tmp_path):
    """One update (2 micro-batches + AdamW) of an 8M-parameter Qwen2 on CPU, fp32 and bf16 with
    fp32 masters: the measured peak RSS is within 20% of the plan's learner total."""
    pytest.importorskip("transformers")
    out = tmp_path / "pm.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "plan_memory.py"), "--smoke",
                           "--json", str(out)], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads(out.read_text())
    assert {r["precision"] for r in results} == {"fp32", "bf16"}
    for r in results:
        assert 0.8 <= r["ratio"] <= 1.2, r


# -- the plan of a run -------------------------------------------------------------------------
def test_split_follows_the_paper16_ray_plan():
    split = split_gpus(16)
    paper16 = PLANS["paper16-split"]
    assert split["actor_engine_gpus"] == paper16.generation_engines == paper16.actor_generation_gpus
    assert split["actor_ranks"] == paper16.learner_ranks == paper16.actor_training_gpus
    assert split["extractor_engine_gpus"] + split["extractor_ranks"] == paper16.extractor_gpus
    gpus = sum(v for k, v in split.items() if k.endswith(("_engine_gpus", "_ranks")))
    assert gpus == paper16.required()["GPU"] == 16
    # colocated (paper's default, as officially): each role's 8 GPUs hold its engines and ranks
    both = split_gpus(16, "colocated")
    paper16 = PLANS["paper16"]
    assert both["actor_engine_gpus"] == both["actor_ranks"] == paper16.learner_ranks == 8
    assert both["extractor_gpus"] == paper16.extractor_gpus == paper16.extractor_ranks == 8
    assert both["sleep"] and paper16.required()["GPU"] == 16
    with pytest.raises(ValueError, match="1 or more"):
        split_gpus(0)


UNBOUNDED = {"actor.micro_batch_tokens": 0, "extractor.micro_batch_tokens": 0,
             "actor.logprob_chunk_tokens": 0, "extractor.logprob_chunk_tokens": 0}
"""The paper preset without its memory settings (token budgets, chunked log-probs): the
official micro-batch of 8 full-length trajectories, every logit at once."""


def test_the_paper_preset_fits_16x80_and_8x141():
    assert build_plan(_paper(), 16, 80).fits, refusal(build_plan(_paper(), 16, 80))
    split = {"model.placement": "split"}
    assert build_plan(_paper(**split), 8, 141).fits, refusal(build_plan(_paper(**split), 8, 141))
    # colocated on 8 GPUs: the actor's 4 ranks' 22.8 GB of states are in host memory during
    # the rollout (model.offload_learner_states, the default); kept on the GPUs beside an engine
    # at 0.85 of it, the plan names the share that fits, and it does
    assert build_plan(_paper(), 8, 141).fits, refusal(build_plan(_paper(), 8, 141))
    kept = {"model.offload_learner_states": False}
    plan = build_plan(_paper(**kept), 8, 141)
    assert not plan.fits
    fix = "--set model.actor_gpu_memory_utilization=0.81"
    assert fix in refusal(plan)
    assert build_plan(_paper(**kept, **{"model.actor_gpu_memory_utilization": 0.81}), 8,
                      141).fits


def test_colocated_rollout_counts_no_learner_states_when_they_are_offloaded():
    """The official pipeline moves the training states to host memory before each rollout
    (``self.actor_train.offload_states``: roll/pipeline/agentic/agentic_pipeline.py:193 of
    pUmpKin-Co/ComplementaryRL at ab2574f; with no ``include`` ROLL's Megatron strategy offloads
    the parameters, other states and the optimizer's, pinned: roll/distributed/strategy/
    megatron_strategy.py:537-548): a colocated GPU's rollout holds the engine's
    ``gpu_memory_utilization`` only (actor 0.85 x 80 = 68.0 GB on the paper's 16 x 80), where
    kept on the GPU the 7B's 8 ranks add their 11.4 GB of fp32 masters and AdamW moments
    (12 B x 7.6B / 8). The update phase is the same either way."""
    import re

    def phases(**over):
        plan = build_plan(_paper(**over), 16, 80)
        note = next(n for r in plan.roles if (r.role, r.part) == ("actor", "learner")
                    for n in r.notes if "rollout" in n)
        rollout, update = re.search(r"rollout ([\d.]+) GB of 80.*update ([\d.]+) GB", note).groups()
        return float(rollout), float(update), note

    rollout, update, note = phases()
    assert rollout == pytest.approx(0.85 * 80, abs=0.05)
    assert "learner states in host memory: 11.4 GB per rank" in note
    kept_rollout, kept_update, _ = phases(**{"model.offload_learner_states": False})
    assert kept_rollout == pytest.approx(0.85 * 80 + 12 * 7_615_616_512 / 8 / 1e9, abs=0.05)
    assert update == kept_update
    # LoRA (the replicated learner: no offload built) keeps its states on the GPUs
    lora = build_plan(_paper(**{"model.lora_r": 16}), 16, 80)
    note = next(n for r in lora.roles if r.part == "learner" for n in r.notes if "rollout" in n)
    assert "host memory:" not in note


def test_paper_without_budgets_on_16x80_is_refused_with_fixes_that_fit():
    plan = build_plan(_paper(**UNBOUNDED), 16, 80)
    assert not plan.fits
    by = {(r.role, r.part): r for r in plan.roles}
    assert by["actor", "engine"].fits and by["extractor", "engine"].fits  # 7B and 4B fit one GPU
    learner = by["actor", "learner"]
    assert not learner.fits
    # the worst micro-batch: 8 trajectories of 32,768 tokens, every token scored
    assert learner.lines["tokens"] == 8 * 32768
    text = refusal(plan)
    assert "actor learner" in text and "micro_batch_tokens" in text and "max_episode_tokens" in text
    # the fix it names does fit
    fixed = build_plan(_paper(**{**UNBOUNDED, "rollout.max_episode_tokens": 16384,
                                 "rollout.sequence_length": 16384,
                                 "actor.micro_batch_tokens": 16384,
                                 "extractor.micro_batch_tokens": 24576}), 16, 80)
    assert fixed.fits, refusal(fixed)


def test_checkpointing_off_is_named_as_the_fix():
    cfg = _paper(**{"rollout.max_episode_tokens": 4096, "rollout.sequence_length": 4096,
                    "actor.micro_batch_tokens": 4096,
                    "extractor.micro_batch_tokens": 4096 + 8192})
    assert build_plan(cfg, 16, 80).fits
    off = build_plan(cfg, 16, 80, checkpointing=False)
    assert not off.fits
    assert "checkpointing" in refusal(off)


def test_unknown_models_are_refused_clearly():
    with pytest.raises(ValueError, match="no architecture numbers"):
        build_plan(_paper(**{"model.actor": "tiny-sft"}), 16, 80)


def test_cli_prints_the_table_and_refuses(tmp_path):
    from crl_bench.cli import main

    def run(*args):
        proc = subprocess.run([sys.executable, "-m", "crl_bench.cli", "plan", *args],
                              capture_output=True, text=True, timeout=120, cwd=str(ROOT))
        return proc.returncode, proc.stdout, proc.stderr

    unbounded = [a for k, v in UNBOUNDED.items() for a in ("--set", f"{k}={v}")]
    rc, out, err = run("--preset", "paper", "--gpus", "16", "--gpu-memory", "80", *unbounded)
    assert rc == 1 and "refused" in err and "actor learner" in err
    for row in ("fp32 grads (4 B/param)", "fp32 masters (4 B/param)", "AdamW m, v (8 B/param)",
                "activations, no checkpointing", "activations, checkpointing", "KV cache", "total"):
        assert row in out
    rc, out, err = run("--gpus", "16", "--gpu-memory", "141",
                       "--set", "rollout.max_episode_tokens=16384",
                       "--set", "rollout.sequence_length=16384",
                       "--set", "actor.micro_batch_tokens=16384",
                       "--set", "extractor.micro_batch_tokens=24576", "--json")
    assert rc == 0, err
    assert json.loads(out)["fits"] is True
    rc, out, err = run("--precision", "bf16-masters")
    assert "bf16 weights (2 B/param)" in out and "bf16 grads (2 B/param)" in out
    assert main(["plan", "--gpus", "0"]) == 2  # one error line naming the fix


def test_chunked_logprobs_bound_the_logits_and_let_32k_trajectories_fit_on_80gb():
    """``logprob_chunk_tokens``: the logits line is one chunk's (16 B x vocab x chunk) and the
    output layer's gradient summed over chunks, not every scored token's logits; the paper's 32k-token trajectories, one per micro-batch, then fit 16 x 80 GB,
    and without chunks the plan names the chunk size as the fix."""
    t = 8 * 32768
    # one chunk's logits + the output layer's gradient twice (bf16) while the chunks' sum
    assert learner_rank(QWEN25_7B, 4, t, t, logprob_chunk=4096)["logits"] == (
        16 * 152064 * 4096 + 2 * 152064 * 3584 * 2)
    assert learner_rank(QWEN25_7B, 4, t, 100, logprob_chunk=4096)["logits"] == 16 * 152064 * 100
    one_seq = {"actor.micro_batch_tokens": 32768, "extractor.micro_batch_tokens": 40960}
    assert PRESETS["paper"]().actor.logprob_chunk_tokens == 4096
    assert build_plan(_paper(**one_seq), 16, 80).fits
    unchunked = build_plan(_paper(**one_seq, **{"actor.logprob_chunk_tokens": 0}), 16, 80)
    assert not unchunked.fits
    assert "--set actor.logprob_chunk_tokens=4096" in refusal(unchunked)
