"""Does the actor read its observation before any training? The first turn of MiniHack Room
levels under several observation views and example-answer picks, scored the way
``experiments/learning_minihack.py`` scores training turns (issue 18: "choose the observation
wording ... by measurement").

    python experiments/minihack_reading.py --levels 48 --samples 4 \\
        --views full compact --examples random none --set threads=1

For each (view, example pick), the same ``--levels`` held-out levels of ``--env`` are each played
for one turn ``--samples`` times by the real rollout engine with the preset's prompt (the
embedded model under ``cpu``). Printed and written to ``--out`` (JSON): the share of valid
answers, of actions **toward the stairs** (the direction in which the observation names the
staircase down: the greedy move; 1/8 for a walker that ignores the observation), of copies of
the example answer, and the most frequent action — each share with a 95% Wilson interval. GRPO
can only sharpen what the policy already samples: a view under which the untrained model moves
toward the stairs more often than 1/8 gives the update a reading direction to follow.

``--run RUN_DIR`` probes a *trained* actor instead: the run's stored configuration (its preset,
prompt and env settings; ``--preset``/``--set`` are then refused, except ``threads``) and the
adapters of its last checkpoint, on the same held-out levels. ``--run RUN_DIR --base`` is the same
configuration without the adapters (the step-0 policy: a fresh LoRA adapter is zero), so the two
are paired level by level::

    python experiments/minihack_reading.py --run OUT/runs/RUN --views compact --examples random
    python experiments/minihack_reading.py --run OUT/runs/RUN --base --views compact --examples random

``--max-steps N`` plays whole episodes of up to N actions instead of first turns (e.g. an actor
trained on the one-action Adjacent-3x3 level, on Room-Random-5x5 with the 10-action cap of its
evaluation) and adds the episodes' success beside a uniform random walker's on the same levels.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling experiments

from learning_minihack import (EXAMPLE_ANSWER, blind_episode, stairs_direction,  # noqa: E402
                               wilson)


def probe(ctx: Any, env_id: str, view: str, example: str, levels: list[int], samples: int,
          seed: int, prompt: dict[str, Any] | None = None,
          max_steps: int | None = None) -> dict[str, Any]:
    """One turn per (level, sample) under ``view`` and ``example``; shares of what was answered.
    With ``max_steps``, whole episodes of up to that many actions instead (the engine's own turn
    cap, as in the runner's evaluation): the first turn is scored as before and the episode's
    success is added, beside a uniform random walker's on the same levels and cap."""
    import gymnasium

    from crl_bench.envs.minihack.actions import normalise_action
    from crl_bench.llm.rollout import EpisodeSpec

    cap = max_steps or ctx.cfg.rollout.env_max_steps.get("minihack", 10)
    envs = [gymnasium.make(env_id, view=view, max_steps=cap) for _ in range(len(levels) * samples)]
    goals = {}
    for level in levels:
        obs, _ = envs[0].reset(seed=level)
        goals[level] = stairs_direction(obs)
    engine = ctx.player.engine(None, seed)
    engine.prompt = replace(engine.prompt, max_turns=None if max_steps else 1,
                            example_pick=example, **(prompt or {}))
    specs = [EpisodeSpec(env=envs[i * samples + j], seed=level, group_id=i)
             for i, level in enumerate(levels) for j in range(samples)]
    t0 = time.perf_counter()
    trajectories = engine.run(specs)
    wall = time.perf_counter() - t0
    example_re = re.compile(EXAMPLE_ANSWER)
    tok = ctx.backend.tokenizer  # to read the example each prompt showed
    n = valid = toward = seen = copies = 0
    actions: Counter[str] = Counter()
    for spec, traj in zip(specs, trajectories):
        turn = traj.turns[0]
        n += 1
        if turn.kind != "action" or turn.action is None:
            continue
        valid += 1
        action = normalise_action(turn.action)  # as the env reads it: "Southeast" moves southeast
        actions[action] += 1
        goal = goals[spec.seed]
        if goal is not None:
            seen += 1
            toward += action == goal
        shown = example_re.findall(tok.decode(turn.prompt_ids))
        copies += bool(shown) and normalise_action(shown[-1]) == action
    for env in envs:
        env.close()

    def share(k: int, total: int) -> dict[str, Any]:
        low, high = wilson(k, total)
        return {"k": k, "n": total, "share": k / total if total else float("nan"), "low": low,
                "high": high}

    top, top_n = actions.most_common(1)[0] if actions else ("", 0)
    row = {"view": view, "example": example, "prompt": prompt or {}, "turns": n,
           "valid": share(valid, n),
           "toward_stairs": share(toward, seen), "copies_example": share(copies, valid),
           "top_action": {"action": top, **share(top_n, valid)}, "wall_s": wall}
    if max_steps:
        row["max_steps"] = cap
        row["success"] = share(sum(t.success for t in trajectories), len(trajectories))
        row["mean_actions"] = sum(t.n_actions for t in trajectories) / len(trajectories)
        row["walker_success"] = share(walker_wins(env_id, levels, samples, cap, seed),
                                      len(levels) * samples)
    return row


def walker_wins(env_id: str, levels: list[int], samples: int, cap: int, seed: int) -> int:
    """Episodes a uniform random walker (one of the 8 move words per action) wins on ``levels``,
    ``samples`` walks each, with the same action cap: the floor for whole-episode success."""
    import random

    import gymnasium

    from crl_bench.envs.minihack.language import DIRECTIONS

    env = gymnasium.make(env_id, max_steps=cap)
    rng = random.Random(seed)
    wins = sum(blind_episode(env, level, lambda: rng.choice(DIRECTIONS))
               for level in levels for _ in range(samples))
    env.close()
    return wins


def run_config(run: Path, overrides: dict[str, Any], argv: list[str],
               base: bool = False) -> tuple[Any, dict[str, Any]]:
    """A run's stored configuration (``threads`` may change) and its last checkpoint: the step
    it holds, the adapters' folder and the roles saved there (``base``: no adapters, step 0)."""
    from crl_bench.runner.api import _stored_config
    from crl_bench.config.schema import ConfigError
    from crl_bench.records.files import RunDir

    if any(a == "--preset" or a.startswith("--preset=") for a in argv):
        raise ConfigError("--run probes the run's own configuration; drop --preset.")
    other = sorted(k for k in overrides if k != "threads")
    if other:
        raise ConfigError(f"--run probes the run's own configuration; drop --set {', '.join(other)} "
                          "(only threads may change).")
    if not (run / "config.json").is_file():
        raise ConfigError(f"{run} holds no run (no config.json); pass a run folder, e.g. "
                          "OUT/runs/<tasks>__grpo__0 of experiments/learning_minihack.py.")
    cfg = _stored_config(RunDir(run))
    if "threads" in overrides:
        cfg.threads = int(overrides["threads"])
    if base:
        return cfg, {"adapters": None, "step": 0, "roles": ["actor"]}
    last = run / "checkpoints" / "last"
    if not (last / "adapters" / "roles.json").is_file():
        raise ConfigError(f"{run} has no checkpoint with adapters yet ({last / 'adapters'} is "
                          "missing); probe it after its first actor step, or use --base.")
    state = json.loads((last / "loop_state.json").read_text())
    roles = json.loads((last / "adapters" / "roles.json").read_text())["roles"]
    return cfg, {"adapters": last / "adapters", "step": state["step"], "roles": roles}


def context(cfg: Any, checkpoint: dict[str, Any] | None, scratch: Path) -> Any:
    """A RunContext on ``scratch`` with the models built and, when ``checkpoint`` names
    adapters, the trained ones loaded (the extractor's too when the run saved one)."""
    from crl_bench.run.context import RunContext
    from crl_bench.records.files import RunDir

    ctx = RunContext(cfg, RunDir(scratch))
    ctx.seed_everything()
    ctx.build_models(extractor=bool(checkpoint and "extractor" in checkpoint["roles"]))
    if checkpoint and checkpoint["adapters"] is not None:
        ctx.raw_backend.load_adapters(checkpoint["adapters"])
    return ctx


def _ci(s: dict[str, Any]) -> str:
    return f"{s['share']:.1%} [{s['low']:.1%}, {s['high']:.1%}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="crl/MiniHack-Room-Random-5x5-v0")
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--levels", type=int, default=48)
    ap.add_argument("--first-level", type=int, default=900_000,
                    help="level seeds first-level ... first-level + levels - 1")
    ap.add_argument("--samples", type=int, default=4, help="answers per level")
    ap.add_argument("--views", nargs="+", default=["full", "compact"])
    ap.add_argument("--examples", nargs="+", default=["random", "none"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=None,
                    help="play whole episodes of up to this many actions (default: first turns "
                         "only) and add their success, beside a random walker's")
    ap.add_argument("--prompt", action="append", default=[], metavar="FIELD=VALUE",
                    help="a PromptConfig field for every probe, e.g. --prompt show_admissible=false")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="config overrides, as for crl-bench run")
    ap.add_argument("--out", type=Path, default=None, help="write the results here (JSON)")
    ap.add_argument("--run", type=Path, default=None,
                    help="probe this run's actor (its config and last checkpoint's adapters)")
    ap.add_argument("--base", action="store_true",
                    help="with --run: its configuration without the adapters (the step-0 policy)")
    args = ap.parse_args(argv)
    if args.max_steps is not None and args.max_steps < 1:
        ap.error(f"--max-steps must be >= 1 (got {args.max_steps}); leave it out for first "
                 "turns only")

    import tempfile

    from crl_bench.config.overrides import parse_overrides
    from crl_bench.config.schema import ConfigError, build_config

    overrides = parse_overrides(args.set)
    checkpoint = None
    if args.run is not None:
        try:
            cfg, checkpoint = run_config(args.run, overrides,
                                         argv if argv is not None else sys.argv[1:], args.base)
        except ConfigError as exc:
            ap.error(str(exc))
    elif args.base:
        ap.error("--base needs --run (the run whose configuration to probe without adapters)")
    else:
        cfg = build_config(agent="grpo", tasks="minihack", preset=args.preset, overrides=overrides,
                           seed=args.seed)
    cfg.validate()
    prompt = parse_overrides(args.prompt)
    with tempfile.TemporaryDirectory() as tmp:
        ctx = context(cfg, checkpoint, Path(tmp) / "run")
        levels = list(range(args.first_level, args.first_level + args.levels))
        rows = []
        for view in args.views:
            for example in args.examples:
                r = probe(ctx, args.env, view, example, levels, args.samples, args.seed, prompt,
                          args.max_steps)
                rows.append(r)
                whole = ("" if args.max_steps is None else
                         f"  success {_ci(r['success'])} (walker {_ci(r['walker_success'])}, "
                         f"{r['mean_actions']:.1f} actions)")
                print(f"view={view:8s} example={example:7s} valid {r['valid']['share']:.0%}  "
                      f"toward stairs {_ci(r['toward_stairs'])} (n={r['toward_stairs']['n']})  "
                      f"copies example {r['copies_example']['share']:.0%}  top "
                      f"{r['top_action']['action']} {r['top_action']['share']:.0%}{whole}  "
                      f"({r['wall_s']:.0f} s)", flush=True)
    result = {"env": args.env, "preset": cfg.preset, "model": cfg.model.actor,
              "checkpoint": None if checkpoint is None else {
                  "run": str(args.run), "step": checkpoint["step"],
                  "adapters": None if checkpoint["adapters"] is None else str(checkpoint["adapters"])},
              "levels": args.levels, "samples": args.samples, "chance_toward": 1 / 8,
              "max_steps": args.max_steps,
              "command": "python experiments/minihack_reading.py " + " ".join(
                  sys.argv[1:] if argv is None else argv), "rows": rows}
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
