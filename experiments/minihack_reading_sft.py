"""How many labelled examples does the actor need to learn to read? A diagnostic, not a training
path of the suite (supervised learning is not the paper's method; issue 18: "if the 135M model
cannot learn it in the time below, ... say why").

    python experiments/minihack_reading_sft.py --examples 512 --batch 8 --probe-every 64 \\
        --levels 48 --samples 4 --set threads=2 --out OUT.json

The actor (the preset's model and LoRA, ``cpu``: SmolLM2-135M) is trained by plain supervised
learning on first turns of *training* levels of ``--env``: the exact prompt the rollout engine
builds (preset's prompt, ``--view``, ``--example`` pick, the ``<answer>`` prefix) with the greedy
answer as the target — the direction in which the observation names the staircase down, then
``</answer>`` and the end-of-turn token (cross-entropy on those tokens only, AdamW at ``--lr``,
one optimiser step per ``--batch`` examples, each example seen once). Every ``--probe-every``
examples the first turn of the same held-out levels as ``experiments/minihack_reading.py`` is
played by the real engine (sampling at the preset's temperature) and scored the same way: valid
answers, moves toward the stairs (95% Wilson), copies of the example answer.

Why it matters: GRPO can teach reading only through the actions it rewards. In stop 16's runs,
~1/8 of the trained action turns moved toward the stairs, with a mean advantage of +0.10
(``experiments/minihack_credit.py``): a step of 48 trained turns carries the equivalent of well
under one labelled example. The number of labelled examples reading needs here is a floor on
what an RL budget must supply.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling experiments

from learning_minihack import stairs_direction  # noqa: E402
from minihack_reading import context, probe  # noqa: E402


def labelled_first_turns(ctx: Any, env_id: str, view: str, example: str, levels: range,
                         seed: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, target ids) of the first turn of each level that shows the stairs: the
    prompt the engine samples that turn from (``RolloutEngine.first_prompt``), the target the
    greedy answer, its close and the end-of-turn token."""
    import gymnasium

    from crl_bench.llm.rollout import EpisodeSpec

    engine = ctx.player.engine(None, seed)
    engine.prompt = replace(engine.prompt, example_pick=example)
    tok = ctx.backend.tokenizer
    a = engine.prompt.answer_tag
    answer_start = engine.prompt.response_prefix or ""  # already in the prompt
    env = gymnasium.make(env_id, view=view, max_steps=1)
    out = []
    for i, level in enumerate(levels):
        prompt, observation = engine.first_prompt(EpisodeSpec(env=env, seed=level), i)
        goal = stairs_direction(observation)
        if goal is None or prompt is None:
            continue
        full = f"<{a}>{goal}</{a}>"
        if not full.startswith(answer_start):
            raise ValueError(f"the response prefix {answer_start!r} is not the start of an answer "
                             f"{full!r}; this diagnostic needs the <{a}> format")
        target = tok(full[len(answer_start):], add_special_tokens=False)["input_ids"]
        if tok.eos_token_id is not None:
            target = target + [tok.eos_token_id]
        out.append((prompt, target))
    env.close()
    return out


def sft_step(ctx: Any, optimizer: Any, batch: list[tuple[list[int], list[int]]]) -> float:
    """One AdamW step of token-mean cross-entropy on the targets of ``batch``; returns the loss."""
    from crl_bench.llm.batching import collate_sequences

    b = collate_sequences([p for p, _ in batch], [t for _, t in batch],
                          ctx.backend.tokenizer.pad_token_id or 0)
    score = b.loss_mask.bool()
    logprobs = ctx.raw_backend.forward_token_logprobs("actor", b.input_ids, b.attention_mask,
                                                     score_mask=score)
    loss = -(logprobs * b.loss_mask).sum() / b.loss_mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    ctx.raw_backend.after_update("actor")
    return float(loss.detach())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="crl/MiniHack-Room-Random-5x5-v0")
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--view", default="compact")
    ap.add_argument("--example", default="random", help="example answer pick (PromptConfig)")
    ap.add_argument("--examples", type=int, default=512, help="labelled training levels")
    ap.add_argument("--first-train-level", type=int, default=0,
                    help="training level seeds start here (the probe's held-out levels start at "
                         "900000, the runs' evaluation at 1000000)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--probe-every", type=int, default=64, help="examples between probes")
    ap.add_argument("--levels", type=int, default=48, help="held-out levels per probe")
    ap.add_argument("--first-level", type=int, default=900_000)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.examples < 1 or args.batch < 1 or args.probe_every < 1:
        ap.error("--examples, --batch and --probe-every must be >= 1")

    import torch

    from crl_bench.config.overrides import parse_overrides
    from crl_bench.config.schema import build_config

    cfg = build_config(agent="grpo", tasks="minihack", preset=args.preset,
                       overrides=parse_overrides(args.set), seed=args.seed)
    cfg.validate()
    held_out = list(range(args.first_level, args.first_level + args.levels))
    train_levels = range(args.first_train_level, args.first_train_level + args.examples)
    if set(train_levels) & set(held_out):
        ap.error("training and probe levels overlap; move --first-train-level")
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        ctx = context(cfg, None, Path(tmp) / "run")
        data = labelled_first_turns(ctx, args.env, args.view, args.example, train_levels, args.seed)
        optimizer = torch.optim.AdamW(ctx.raw_backend.trainable_parameters("actor"), lr=args.lr,
                                      weight_decay=0.0)

        def measure(seen: int, loss: float | None) -> None:
            r = probe(ctx, args.env, args.view, args.example, held_out, args.samples, args.seed)
            r.update({"examples_seen": seen, "train_loss": loss,
                      "elapsed_s": time.perf_counter() - t0})
            rows.append(r)
            print(f"examples {seen:4d}  loss {'-' if loss is None else f'{loss:.3f}':>6}  valid "
                  f"{r['valid']['share']:.0%}  toward stairs {r['toward_stairs']['share']:.1%} "
                  f"[{r['toward_stairs']['low']:.1%}, {r['toward_stairs']['high']:.1%}]  copies "
                  f"{r['copies_example']['share']:.0%}  top {r['top_action']['action']} "
                  f"({r['elapsed_s']:.0f} s)", flush=True)

        measure(0, None)
        seen, losses = 0, []
        for start in range(0, len(data), args.batch):
            losses.append(sft_step(ctx, optimizer, data[start:start + args.batch]))
            before, seen = seen, min(start + args.batch, len(data))
            if seen // args.probe_every > before // args.probe_every or seen == len(data):
                measure(seen, sum(losses) / len(losses))
                losses = []
    result = {"env": args.env, "preset": args.preset, "model": cfg.model.actor,
              "view": args.view, "example": args.example, "lr": args.lr, "batch": args.batch,
              "labelled_levels": len(data), "probe_levels": args.levels, "samples": args.samples,
              "chance_toward": 1 / 8,
              "command": "python experiments/minihack_reading_sft.py " + " ".join(
                  sys.argv[1:] if argv is None else argv), "rows": rows}
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        png = plot(rows, args.out.with_suffix(".png"), args.batch)
        print(f"wrote {args.out}" + (f", {png}" if png else ""))
    return 0


def plot(rows: list[dict[str, Any]], path: Path, batch: int) -> Path | None:
    """Moves toward the stairs (95% Wilson) and valid answers against labelled examples seen."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    xs = [r["examples_seen"] for r in rows]
    toward = [r["toward_stairs"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.errorbar(xs, [t["share"] for t in toward],
                yerr=[[t["share"] - t["low"] for t in toward], [t["high"] - t["share"] for t in toward]],
                marker="o", capsize=3, label="first moves toward the stairs (95% Wilson)")
    ax.plot(xs, [r["valid"]["share"] for r in rows], marker=".", ls="--", label="valid answers")
    ax.axhline(1 / 8, color="grey", ls=":", label="a walker that ignores the observation")
    ax.set(xlabel=f"labelled examples seen ({batch} per AdamW step)", ylabel="share", ylim=(0, 1.02),
           title="held-out first turns after supervised steps")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
