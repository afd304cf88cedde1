"""The sharded learner (FSDP2, ``crl_bench.distributed.fsdp``) on CPU with gloo, launched with
torchrun on the tiny random model, full fine-tuning:

- 2 sharded ranks (with activation checkpointing, micro-batches cut by a token budget so the
  ranks run different numbers of them) give the parameters and metrics that ``RoleTrainer``
  gives on one process after 3 updates, within fp32 tolerance (rtol 1e-5, atol 1e-6);
- a sharded checkpoint saved at 2 ranks after update 2, resumed by a fresh 2-rank launch that
  then does update 3, equals the uninterrupted run: weights and AdamW state.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _fsdp_worker import CFG, KW, SPEC, batch  # noqa: E402

WORKER = Path(__file__).with_name("_fsdp_worker.py")


def torchrun(out: Path, *args: str, nproc: int = 2) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", str(WORKER), str(out), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp")
    ckpt = tmp / "ckpt_update2"
    whole = torchrun(tmp / "whole.pt", "--updates", "3", "--checkpointing",
                     "--save-at", "2", str(ckpt))
    resumed = torchrun(tmp / "resumed.pt", "--updates", "3", "--checkpointing",
                       "--resume", str(ckpt))
    return whole, resumed, ckpt


def test_two_sharded_ranks_equal_one_process(runs):
    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.config.schema import OptimConfig
    from crl_bench.training.role_trainer import RoleTrainer

    import random

    from crl_bench.distributed.learner import plan_update

    whole, _, _ = runs
    assert whole["world_size"] == 2 and whole["updates"] == 3
    # what this test covers: the token budget cuts micro-batches below micro_batch_size, and
    # the ranks run different numbers of them (the short one pads)
    rng = random.Random(0)
    plans = [plan_update(batch(i), OptimConfig(**CFG), rng, by_prompt=False, n_ranks=2)[0]
             for i in range(3)]
    assert any(len(chunk) < CFG["micro_batch_size"] for p in plans for r in p for chunk in r)
    assert any(len(p[0]) != len(p[1]) for p in plans)
    torch.set_num_threads(1)
    backend = HFBackend(**SPEC, roles=("actor",), lora=None, dtype="float32",
                        share_prompt_prefix=False)
    trainer = RoleTrainer(backend, "actor", OptimConfig(**CFG), total_steps=10, seed=0)
    start = [p.detach().clone() for p in trainer.params]
    metrics = [trainer.update(batch(i), **KW) for i in range(3)]
    for m, got in zip(metrics, whole["metrics"]):
        for k in ("loss", "grad_norm", "clip_frac", "ratio_mean", "tokens", "model_tokens",
                  "samples", "active_samples"):
            assert got[k] == pytest.approx(m[k], rel=1e-5, abs=1e-7), k
    moved = 0.0
    assert len(whole["weights"]) == len(trainer.params)
    for p, w, s in zip(trainer.params, whole["weights"], start):
        torch.testing.assert_close(w, p.detach(), rtol=1e-5, atol=1e-6)
        moved = max(moved, float((p.detach() - s).abs().max()))
    assert moved > 1e-3  # three real steps (lr 1e-3)


def test_a_sharded_checkpoint_resumes_exactly(runs):
    whole, resumed, ckpt = runs
    assert (ckpt / ".metadata").is_file()  # torch.distributed.checkpoint's sharded format
    assert resumed["updates"] == 3 and len(resumed["metrics"]) == 1  # only update 3 ran
    torch.testing.assert_close(resumed["metrics"][0], whole["metrics"][2], rtol=0, atol=0)
    for a, b in zip(resumed["weights"], whole["weights"]):
        assert torch.equal(a, b)
    want, got = whole["optim"]["state"], resumed["optim"]["state"]
    assert sorted(want) == sorted(got) and want
    for name in want:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(torch.as_tensor(got[name][key]), torch.as_tensor(want[name][key])), (name, key)


def test_states_offloaded_to_host_memory_come_back_bitwise_and_train_the_same(runs, tmp_path):
    """Colocated, the learner's training states live in host memory while the engines roll
    out, as the official pipeline's ``offload_states`` before each rollout
    (roll/pipeline/agentic/agentic_pipeline.py:193 of pUmpKin-Co/ComplementaryRL; ROLL's
    strategy moves every state, pinned: roll/distributed/strategy/megatron_strategy.py:537-550).
    Before each of 3 updates both ranks offload their states (fp32 shards, then AdamW's m, v and
    step too): every storage is emptied, host memory holds every byte, and the reload gives
    them back bitwise; the run equals the one that never offloaded, exactly."""
    whole, _, _ = runs
    got = torchrun(tmp_path / "offload.pt", "--updates", "3", "--checkpointing", "--offload")
    n_params = len(got["weights"])
    assert [o["tensors"] for o in got["offloads"]] == [n_params] + [4 * n_params] * 2
    for o in got["offloads"]:
        assert o["emptied"] and o["restored"] and o["host_bytes"] == o["bytes"] > 0, o
    assert [k for k, _ in got["state_log"]] == ["offload", "reload"] * 3
    assert len(got["metrics"]) == 3
    for a, b in zip(got["metrics"], whole["metrics"]):
        assert a == b
    for a, b in zip(got["weights"], whole["weights"]):
        assert torch.equal(a, b)
    want, have = whole["optim"]["state"], got["optim"]["state"]
    assert sorted(want) == sorted(have)
    for name in want:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(torch.as_tensor(have[name][key]), torch.as_tensor(want[name][key]))


def test_bf16_compute_keeps_fp32_shards_that_take_the_whole_small_step(tmp_path):
    """bf16 ``dtype``: FSDP2 computes in bf16 (the gradient differs from the fp32 one, within
    2%) while the shards, the optimiser's weights, stay fp32: a step at lr 1e-6 is the fp32
    AdamW step from that gradient (the bounds of tests/test_mixed_precision.py). One rank."""
    got = torchrun(tmp_path / "precision.pt", "--precision-check", nproc=1)
    for dtype in ("float32", "bfloat16"):
        assert set(got[dtype]["dtypes"]) == {"torch.float32"}
    flat16 = torch.cat([g.flatten() for g in got["bfloat16"]["grads"]])
    flat32 = torch.cat([g.flatten() for g in got["float32"]["grads"]])
    rel = float((flat16 - flat32).norm() / flat32.norm())
    assert 0 < rel <= 2e-2, rel
    before, after = got["bfloat16"]["before"], got["bfloat16"]["after"]
    ref = [torch.nn.Parameter(w.clone()) for w in before]
    for w, g in zip(ref, got["bfloat16"]["grads"]):
        w.grad = g.clone()
    torch.optim.AdamW(ref, lr=1e-6, weight_decay=CFG["weight_decay"]).step()
    delta = torch.cat([(a - b).flatten().double() for a, b in zip(after, before)])
    want = torch.cat([(r.detach() - b).flatten().double() for r, b in zip(ref, before)])
    assert float((delta - want).norm() / want.norm()) <= 1e-2
    assert float((delta[want != 0] != 0).double().mean()) >= 0.99


def test_lora_and_a_missing_process_group_are_refused_by_name():
    """LoRA keeps the replicated learner; outside torchrun the learner says how to launch."""
    from crl_bench.distributed.fsdp import ShardedLearner
    from crl_bench.llm.types import LoraSpec
    from crl_bench.config.schema import ConfigError, OptimConfig

    with pytest.raises(ConfigError, match="full fine-tuning"):
        ShardedLearner(dict(SPEC, lora=LoraSpec()), "actor", OptimConfig(), total_steps=1)
    with pytest.raises(RuntimeError, match="torchrun"):
        ShardedLearner(SPEC, "actor", OptimConfig(), total_steps=1)
