"""Bytes a full fine-tuning trainer holds per trainable parameter, fp32 vs bf16 with fp32 masters.

    python benchmarks/precision_memory.py [--model tiny-random] [--lr 1e-6]

For each setting, one ``RoleTrainer`` update on a few real samples, then the bytes of every
tensor the trainer keeps, counted by kind: the module's weights, fp32 masters, the gradient the
optimiser steps with (read just before the step: it is freed after), and AdamW's state; and the
share of weight entries one step at ``--lr`` moves (in what the optimiser steps; in what
generation reads, the module). Ratios are against the fp32 setting measured in the same run.
Expected: fp32 16 B/param (4 + 4 + 8); bf16 with masters 18 (2 + 4 + 4 + 8).
"""

from __future__ import annotations

import argparse


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def measure(model: str, dtype: str, lr: float) -> dict[str, float]:
    import torch

    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.llm.types import SamplingParams
    from crl_bench.config.schema import OptimConfig
    from crl_bench.training.role_trainer import RoleTrainer, TrainSample

    backend = HFBackend(model, roles=("actor",), lora=None, seed=0, dtype=dtype, device="cpu")
    prompts = [backend.chat_prompt_ids([{"role": "user", "content": q}])
               for q in ("Which way is north?", "Name a fruit.", "What is 2+2?")]
    gens = backend.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=8, seed=3))
    samples = [TrainSample(list(g.prompt_ids), list(g.completion_ids), list(g.logprobs), a)
               for g, a in zip(gens, (1.0, -1.0, 0.5))]
    trainer = RoleTrainer(backend, "actor", OptimConfig(lr=lr, max_grad_norm=1e9),
                          total_steps=1)
    stepped = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    before = [p.detach().clone() for p in stepped]
    module_before = [p.detach().clone() for p in trainer.params]
    grad_bytes = []
    step = trainer.optimizer.step
    trainer.optimizer.step = lambda *a, **k: (grad_bytes.append(
        nbytes([p.grad for p in stepped if p.grad is not None])), step(*a, **k))[1]
    trainer.update(samples, loss="ppo_clip", loss_kwargs={"clip_eps": 0.2}, temperature=1.0)
    n = sum(p.numel() for p in trainer.params)
    state = [v for s in trainer.optimizer.state.values() for v in s.values()
             if torch.is_tensor(v) and v.numel() > 1]

    def moved(now, then) -> float:
        changed = sum(int((a != b).sum()) for a, b in zip(now, then))
        return changed / sum(t.numel() for t in then)

    return {"weights": nbytes(trainer.params) / n, "masters": nbytes(trainer.precision.masters) / n,
            "grads": grad_bytes[0] / n, "adam": nbytes(state) / n,
            "moved_stepped": moved(stepped, before), "moved_module": moved(trainer.params, module_before)}


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--lr", type=float, default=1e-6)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = {dtype: measure(args.model, dtype, args.lr) for dtype in ("float32", "bfloat16")}
    base = sum(rows["float32"][k] for k in ("weights", "masters", "grads", "adam"))
    print(f"model {args.model}, one update at lr {args.lr:g}; bytes per trainable parameter")
    print("| setting | weights | fp32 masters | grads | AdamW | total | vs fp32 | entries moved (stepped / module) |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype, r in rows.items():
        total = r["weights"] + r["masters"] + r["grads"] + r["adam"]
        print(f"| {dtype} | {r['weights']:.1f} | {r['masters']:.1f} | {r['grads']:.1f} | "
              f"{r['adam']:.1f} | {total:.1f} | {total / base:.3f} | "
              f"{r['moved_stepped']:.2%} / {r['moved_module']:.2%} |")


if __name__ == "__main__":
    main()
