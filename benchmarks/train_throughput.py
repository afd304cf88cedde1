"""Actor-update throughput: per-turn samples vs trajectory-level samples vs a hand-written
transformers + PEFT loop, on the same model and the same recorded episodes, in one run.

    python benchmarks/train_throughput.py [--model smollm2-135m | tiny-sft] [--episodes 8]
        [--turns 8] [--max-new-tokens 16] [--micro-batch 4] [--repeats 2] [--threads 1]
        [--json out.json]

The episodes are played once (MiniHack Room 5x5, ``rollout.conversation: full``, the cpu
preset's small-model prompt, LoRA r=16 as the ``cpu`` preset) and then trained on, each mode
from the same starting weights (restored between runs), with PPO-clip and the
``seq-mean-token-mean`` aggregation:

* ``turn``: one sample per model call (each turn's prompt, i.e. the conversation so far,
  re-encoded): ``actor.sample_unit: turn``;
* ``trajectory``: one sample per episode, the last turn's full sequence with the loss on every
  assistant turn (``actor.sample_unit: trajectory``);
* ``plain``: the trajectory-level batch through the loop a user would write by hand with
  transformers + PEFT: right-padded micro-batches, ``model(...).logits``, ``log_softmax`` over
  the vocabulary, gather, PPO-clip, per-sequence token mean, backward, AdamW step.

It prints trained (loss-carrying) tokens/s, episodes/s and the tokens run through the model for
each mode, then the ratios trajectory / turn (target >= 3x episodes/s) and trajectory / plain
(target >= 1). The fastest of ``--repeats`` runs of each mode counts.
"""

from __future__ import annotations

import argparse
import json
import platform
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--turns", type=int, default=8, help="max turns per episode")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: leave as is)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)

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
    backend = HFBackend(args.model, roles=("actor",), lora=LoraSpec(r=16, alpha=32), seed=args.seed,
                        dtype="float32", device="cpu")
    temperature = 0.99
    engine = RolloutEngine(backend, SamplingParams(temperature=temperature, max_new_tokens=args.max_new_tokens,
                                                   seed=args.seed),
                           PromptConfig.for_small_model(max_turns=args.turns, conversation="full"))
    specs = [EpisodeSpec(env=gymnasium.make("crl/MiniHack-Room-5x5-v0"), seed=i // 4, group_id=i // 4)
             for i in range(args.episodes)]
    t = time.perf_counter()
    trajectories = engine.run(specs)
    play_s = time.perf_counter() - t
    gen = torch.Generator().manual_seed(args.seed)
    advantages = (torch.rand(len(trajectories), generator=gen) * 2 - 1).tolist()
    turn_samples = [TrainSample(u.prompt_ids, u.completion_ids, u.logprobs, a)
                    for tr, a in zip(trajectories, advantages) for u in tr.turns]
    traj_samples = [TrainSample.from_turns(tr.turns, a) for tr, a in zip(trajectories, advantages)]
    trained_tokens = sum(s.n_tokens for s in traj_samples)
    assert trained_tokens == sum(s.n_tokens for s in turn_samples)

    params = [p for p in backend.trainable_parameters("actor") if p.requires_grad]
    start = role_weights(backend, "actor")

    def restore() -> None:
        load_role_weights(backend, "actor", start)

    cfg = OptimConfig(lr=1e-5, micro_batch_size=args.micro_batch)

    def ours(samples: list[TrainSample]) -> float:
        trainer = RoleTrainer(backend, "actor", cfg, total_steps=1)
        t0 = time.perf_counter()
        trainer.update(samples, loss="ppo_clip", loss_kwargs={"clip_eps": 0.2},
                       agg="seq-mean-token-mean", temperature=temperature)
        return time.perf_counter() - t0

    def plain(samples: list[TrainSample]) -> float:
        """What a user writes by hand with transformers + PEFT (same batch, same loss)."""
        model = backend.trainable_model("actor")
        opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0)
        pad = int(backend.tokenizer.pad_token_id)
        t0 = time.perf_counter()
        opt.zero_grad()
        n = len(samples)
        for i in range(0, n, args.micro_batch):
            chunk = samples[i:i + args.micro_batch]
            length = max(s.length for s in chunk)
            ids = torch.full((len(chunk), length), pad, dtype=torch.long)
            attn = torch.zeros_like(ids)
            mask = torch.zeros((len(chunk), length), dtype=torch.bool)
            old = torch.zeros((len(chunk), length))
            adv = torch.zeros((len(chunk), 1))
            for b, s in enumerate(chunk):
                seq = s.prompt_ids + s.completion_ids
                ids[b, :len(seq)] = torch.tensor(seq)
                attn[b, :len(seq)] = 1
                m = torch.tensor([0] * len(s.prompt_ids) + list(s.completion_mask), dtype=torch.bool)
                mask[b, :len(seq)] = m
                old[b, :len(seq)][m] = torch.tensor(s.old_logprobs)
                adv[b] = s.advantage
            logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float() / temperature
            logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            m, o = mask[:, 1:], old[:, 1:]
            ratio = torch.exp(logp - o)
            per_tok = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
            per_seq = (per_tok * m).sum(1) / m.sum(1).clamp(min=1)
            (per_seq.sum() / n).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return time.perf_counter() - t0

    modes = {"turn": (ours, turn_samples), "trajectory": (ours, traj_samples),
             "plain": (plain, traj_samples)}
    results: dict[str, dict[str, float]] = {}
    for name, (fn, samples) in modes.items():
        times = []
        for _ in range(args.repeats):
            restore()
            times.append(fn(samples))
        best = min(times)
        results[name] = {"seconds": best, "samples": len(samples),
                         "model_tokens": sum(s.length for s in samples),
                         "trained_tokens_per_s": trained_tokens / best,
                         "episodes_per_s": len(trajectories) / best}
    restore()
    ratios = {"trajectory_vs_turn_episodes_per_s":
              results["trajectory"]["episodes_per_s"] / results["turn"]["episodes_per_s"],
              "trajectory_vs_plain": results["trajectory"]["episodes_per_s"] / results["plain"]["episodes_per_s"]}
    print(f"model {args.model}, {len(trajectories)} episodes, "
          f"{sum(len(t.turns) for t in trajectories)} turns, {trained_tokens} trained tokens, "
          f"played in {play_s:.1f} s; torch threads {torch.get_num_threads()}, {platform.processor() or platform.machine()}")
    print(f"{'mode':<11} {'samples':>7} {'model tok':>9} {'seconds':>8} {'trained tok/s':>13} {'episodes/s':>10}")
    for name, r in results.items():
        print(f"{name:<11} {r['samples']:>7} {r['model_tokens']:>9} {r['seconds']:>8.2f} "
              f"{r['trained_tokens_per_s']:>13.1f} {r['episodes_per_s']:>10.3f}")
    print(f"trajectory / turn  (episodes/s): {ratios['trajectory_vs_turn_episodes_per_s']:.2f}x  (target >= 3x)")
    print(f"trajectory / plain (episodes/s): {ratios['trajectory_vs_plain']:.2f}x  (target >= 1x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results, "ratios": ratios,
                       "trained_tokens": trained_tokens, "play_s": play_s}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
