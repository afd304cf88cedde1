"""One rank of the sharded-learner tests (launched by tests/test_fsdp.py with torchrun).

    torchrun --nproc_per_node N tests/_fsdp_worker.py OUT --updates K [--save-at S CKPT]
        [--resume CKPT] [--checkpointing] [--compute float32|bfloat16] [--offload]
    torchrun --nproc_per_node N tests/_fsdp_worker.py OUT --precision-check

Trains the tiny random model with :class:`~crl_bench.distributed.fsdp.ShardedLearner` on the
batches of :func:`batch` (update ``i`` trains on ``batch(i)``), optionally saves a sharded
checkpoint after update S (and goes on), or resumes one first; rank 0 writes the gathered weights,
AdamW state and per-update metrics to OUT.
"""

from __future__ import annotations

import argparse
import os
import random

SPEC = dict(model_name="tiny-random", seed=0, device="cpu")
CFG = dict(lr=1e-3, weight_decay=0.01, max_grad_norm=1.0, micro_batch_size=2,
           micro_batch_tokens=32)
KW = dict(loss="ppo_clip", loss_kwargs={"clip_eps": 0.2}, agg="token-mean", temperature=1.0)


def batch(i: int) -> list:
    """Update ``i``'s samples: 7 of uneven lengths (so ranks get different numbers of micro-
    batches), advantages of both signs and one zero, old log-probs near the random model's
    (about -log(vocab)) so that some ratios clip."""
    from crl_bench.training.role_trainer import TrainSample

    rng = random.Random(100 + i)
    out = []
    for k in range(7):
        prompt = [rng.randrange(1, 49000) for _ in range(rng.randint(4, 14))]
        completion = [rng.randrange(1, 49000) for _ in range(rng.randint(2, 12))]
        old = [-10.8 + rng.uniform(-0.3, 0.3) for _ in completion]
        adv = [1.0, -0.5, 0.0, 0.75, -1.0, 0.5, -0.25][k]
        out.append(TrainSample(prompt, completion, old, adv, 1.0 if k != 5 else 0.5))
    return out


def main() -> None:
    import torch
    import torch.distributed as dist

    from crl_bench.distributed.fsdp import ShardedLearner
    from crl_bench.config.schema import OptimConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--save-at", nargs=2, default=None)
    ap.add_argument("--resume", default=None)
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--compute", default="float32")
    ap.add_argument("--precision-check", action="store_true")
    ap.add_argument("--offload", action="store_true",
                    help="states to host memory before each update and back for it")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        if args.precision_check:
            precision_check(args.out)
            return
        cfg = OptimConfig(**CFG, activation_checkpointing=args.checkpointing)
        learner = ShardedLearner(dict(SPEC, dtype=args.compute), "actor", cfg, total_steps=10,
                                 seed=0)
        if args.resume:
            learner.load(args.resume)
        metrics, offloads = [], []
        while learner.updates < args.updates:
            if args.offload:  # as a colocated run: offloaded during the rollout
                offloads.append(offload_round_trip(learner))
            metrics.append(learner.update(batch(learner.updates), **KW))
            if args.save_at and learner.updates == int(args.save_at[0]):
                learner.save(args.save_at[1])  # a snapshot; this run goes on uninterrupted
        weights = learner.full_weights()
        optim = learner.full_optimizer_state()
        if dist.get_rank() == 0:
            torch.save({"weights": weights, "optim": optim, "metrics": metrics,
                        "updates": learner.updates, "world_size": dist.get_world_size(),
                        "pid": os.getpid(), "offloads": offloads,
                        "state_log": learner.state_log}, args.out)
    finally:
        dist.destroy_process_group()


def offload_round_trip(learner) -> dict:
    """The learner's states to host memory and back: what each storage held before, whether
    the offload emptied them all, and whether the reload gave every byte back."""
    import torch

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    states = learner.states()
    before = [local(t).detach().clone() for t in states]
    storages = [local(t).untyped_storage() for t in states]
    nbytes = sum({s.data_ptr(): s.nbytes() for s in storages}.values())
    learner.offload_states()
    emptied = all(local(t).untyped_storage().nbytes() == 0 for t in states)
    host = learner.host.host_bytes
    learner.load_states()
    same = all(torch.equal(local(t), b) and local(t).dtype == b.dtype
               for t, b in zip(states, before))
    return {"tensors": len(states), "bytes": nbytes, "host_bytes": host, "emptied": emptied,
            "restored": same}


def precision_check(out: str) -> None:
    """One update at lr 1e-6 of an fp32-compute and of a bf16-compute learner: the shards'
    dtypes, the weights before and after and the gradient each optimiser step used."""
    import torch

    from crl_bench.distributed.fsdp import ShardedLearner
    from crl_bench.config.schema import OptimConfig

    cfg = OptimConfig(**dict(CFG, lr=1e-6, max_grad_norm=1e9))
    result = {}
    for dtype in ("float32", "bfloat16"):
        learner = ShardedLearner(dict(SPEC, dtype=dtype), "actor", cfg, total_steps=1)
        before = learner.full_weights()
        step = learner.trainer.optimizer.step
        grads = []

        def capture(*a, step=step, grads=grads, learner=learner, **k):
            grads.append([p.grad.full_tensor().clone() for p in learner.trainer.params])
            return step(*a, **k)

        learner.trainer.optimizer.step = capture
        learner.update(batch(0), **KW)
        result[dtype] = {"dtypes": [str(p.dtype) for p in learner.trainer.params],
                         "before": before, "after": learner.full_weights(), "grads": grads[0]}
    if torch.distributed.get_rank() == 0:
        torch.save(result, out)


if __name__ == "__main__":
    main()
