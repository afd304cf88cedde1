"""Play and actor-update cost with and without encoding a GRPO group's shared prompt once, on
the same batch, in one run.

    python benchmarks/shared_prefix_update.py [--model smollm2-135m] [--groups 8] [--group-size 8]
        [--micro-batch 8] [--repeats 2] [--threads 1] [--json out.json]

Play: the episodes are played three times: with the backend's prefix sharing off (every prompt
prefilled in full), batch-wide only (the common prefix of all 64 prompts once: what the backend
did before group prefixes), and by group (each group's prompt prefilled once, its KV repeated
for the group's rows, one batch decoded together); the last play is trained on.

Update: the batch is what a training step of the one-action MiniHack runs plays
(``crl/MiniHack-Room-Adjacent-3x3-Balanced-v0``, compact view, one action, the cpu preset's
small-model prompt with a random example answer, no history): ``--groups`` groups of
``--group-size`` episodes, one prompt per group, each sample one turn. The group's samples
differ only from the example answer on (drawn per episode), so most of each prompt is common.

One update (PPO-clip, token mean, every sample active: advantages drawn in [-1, 1]) runs with
``HFBackend.share_prompt_prefix`` on (a micro-batch's common prefix encoded once, its KV
repeated) and off (every row encoded in full), from the same weights (restored between runs).
It prints seconds, tokens run through the model, the ratio off / on, and the largest difference
between the two accumulated gradients (the two are the same computation). The fastest of
``--repeats`` runs of each mode counts.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

ENV_ID = "crl/MiniHack-Room-Adjacent-3x3-Balanced-v0"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: leave as is)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    for name in ("groups", "group_size", "micro_batch", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")

    import gymnasium
    import torch

    import crl_bench  # noqa: F401  (registers the envs)
    from crl_bench.training.precision import load_role_weights, role_weights
    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.llm.rollout import EpisodeSpec, PromptConfig, RolloutEngine
    from crl_bench.llm.types import LoraSpec, SamplingParams
    from crl_bench.config.schema import OptimConfig
    from crl_bench.training.role_trainer import RoleTrainer, TrainSample

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    backend = HFBackend(args.model, roles=("actor",), lora=LoraSpec(r=16, alpha=32),
                        seed=args.seed, dtype="float32", device="cpu")
    temperature = 0.99
    engine = RolloutEngine(backend, SamplingParams(temperature=temperature, max_new_tokens=16,
                                                   seed=args.seed),
                           PromptConfig.for_small_model(history=0, example_pick="random"))
    n = args.groups * args.group_size
    specs = [EpisodeSpec(env=gymnasium.make(ENV_ID, max_steps=1, view="compact"),
                         seed=1000 + i // args.group_size, group_id=i // args.group_size)
             for i in range(n)]
    play_s: dict[str, float] = {}
    prefilled: dict[str, int] = {}
    # none: every prompt prefilled in full; batch: the batch-wide common prefix once (what the
    # backend did before group batches); group: each group's prompt once (played last, trained on)
    for mode, share, saving in (("none", False, 0), ("batch", True, float("inf")),
                                ("group", True, backend.min_run_saving)):
        backend.share_prompt_prefix, backend.min_run_saving = share, saving
        before = backend.kv_stats["prefilled_tokens"]
        t = time.perf_counter()
        trajectories = engine.run(specs)
        play_s[mode] = time.perf_counter() - t
        prefilled[mode] = backend.kv_stats["prefilled_tokens"] - before
    gen = torch.Generator().manual_seed(args.seed)
    advantages = (torch.rand(n, generator=gen) * 2 - 1).tolist()
    samples = [TrainSample(u.prompt_ids, u.completion_ids, u.logprobs, a)
               for tr, a in zip(trajectories, advantages) for u in tr.turns]

    params = [p for p in backend.trainable_parameters("actor") if p.requires_grad]
    start = role_weights(backend, "actor")

    def restore() -> None:
        load_role_weights(backend, "actor", start)

    cfg = OptimConfig(lr=1e-4, micro_batch_size=args.micro_batch)
    results: dict[str, dict[str, float]] = {}
    after: dict[str, list] = {}
    for mode, share in (("shared", True), ("full", False)):
        backend.share_prompt_prefix = share
        times, metrics = [], {}
        for _ in range(args.repeats):
            restore()
            trainer = RoleTrainer(backend, "actor", cfg, total_steps=1)
            grads: dict[int, torch.Tensor] = {}  # the accumulated gradient, before the step
            hooks = [p.register_post_accumulate_grad_hook(
                lambda p, i=i: grads.__setitem__(i, p.grad.detach().clone()))
                for i, p in enumerate(params)]
            t0 = time.perf_counter()
            metrics = trainer.update(samples, loss="ppo_clip", loss_kwargs={"clip_eps": 0.2},
                                     agg="token-mean", temperature=temperature)
            times.append(time.perf_counter() - t0)
            for h in hooks:
                h.remove()
        after[mode] = [grads[i] for i in range(len(params))]
        best = min(times)
        results[mode] = {"seconds": best, "samples": len(samples),
                         "model_tokens": metrics["model_tokens"],
                         "encoded_tokens": metrics["encoded_tokens"],
                         "episodes_per_s": len(samples) / best}
    backend.share_prompt_prefix = True
    restore()
    scale = max(float(g.abs().max()) for g in after["full"])
    diff = max(float((a - b).abs().max()) for a, b in zip(after["shared"], after["full"]))
    ratio = results["full"]["seconds"] / results["shared"]["seconds"]
    prompt = sum(len(s.prompt_ids) for s in samples) / len(samples)
    completion = sum(len(s.completion_ids) for s in samples) / len(samples)
    print(f"model {args.model}, {ENV_ID}: {args.groups} groups x {args.group_size}, "
          f"prompt {prompt:.0f} + completion {completion:.1f} tokens per sample; micro-batch "
          f"{args.micro_batch}; torch threads {torch.get_num_threads()}, "
          f"{platform.processor() or platform.machine()}")
    print("play:   " + ", ".join(f"{m} {play_s[m]:.1f} s ({prefilled[m]} prompt tokens "
                                   f"prefilled)" for m in play_s)
          + f"; batch / group {play_s['batch'] / play_s['group']:.2f}x, none / group "
          f"{play_s['none'] / play_s['group']:.2f}x")
    print(f"{'mode':<7} {'samples':>7} {'tokens':>7} {'encoded':>8} {'seconds':>8} {'episodes/s':>10}")
    for name, r in results.items():
        print(f"{name:<7} {r['samples']:>7} {r['model_tokens']:>7.0f} {r['encoded_tokens']:>8.0f} "
              f"{r['seconds']:>8.2f} {r['episodes_per_s']:>10.2f}")
    print(f"update: full / shared (seconds): {ratio:.2f}x; largest gradient difference {diff:.2e} "
          f"(largest gradient entry {scale:.2e})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results, "ratio_full_vs_shared": ratio,
                       "max_grad_diff": diff, "max_grad": scale, "play_s": play_s,
                   "prefilled_tokens": prefilled}, f,
                      indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
