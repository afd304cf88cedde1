"""``crl-bench run``: argument parsing only (the work is imported when the command runs)."""

from __future__ import annotations

import argparse


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agent", default="comp_rl", help="agent name (`crl-bench list agents`); default comp_rl")
    p.add_argument("--tasks", default="3mix",
                   help="task set: a mix (`crl-bench list mixes`: minihack, webshop, alfworld, swe, 3mix, "
                        "6mix) or comma-separated env ids; default 3mix")
    p.add_argument("--preset", choices=["tiny", "cpu", "paper"], default=None,
                   help="tiny (tests), cpu (embedded SmolLM2; minutes per step on 2 cores), paper (GPUs); "
                        "default: cpu without a GPU, paper with one")
    p.add_argument("--seed", type=int, nargs="+", default=[0], help="one or more seeds (one run each)")
    p.add_argument("--steps", type=int, default=None, help="actor steps (overrides the preset)")
    p.add_argument("--out", default=None,
                   help="run directory (one seed) or parent folder (several seeds); default runs/<name>")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set actor.lr=2e-5 --set rollout.group_size=8")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from crl_bench.cli import parse_overrides
    from crl_bench.runner.api import default_run_dir, run_experiment

    overrides = parse_overrides(args.overrides)
    if args.resume and not args.out:
        raise ValueError("--resume needs --out RUN_DIR (the run to continue).")
    for seed in args.seed:
        if args.out and len(args.seed) == 1:
            out = Path(args.out)
        elif args.out:
            out = Path(args.out) / f"{args.tasks}__{args.agent}__{seed}"
        else:
            out = default_run_dir(args.agent, args.tasks, seed)
        path = run_experiment(args.agent, args.tasks, args.preset, seed, out, steps=args.steps,
                              overrides=overrides, resume=args.resume,
                              progress=not args.no_progress)
        _print_summary(path)
    return 0


def _print_summary(path) -> None:
    from crl_bench.runner.records import read_jsonl

    evals = read_jsonl(path / "eval.jsonl")
    if not evals:
        print(f"run directory: {path}")
        return
    last = max(e["step"] for e in evals)
    print(f"\nfinal evaluation (step {last}) — {path}")
    for e in evals:
        if e["step"] == last:
            tag = "with exp   " if e["with_experience"] else "without exp"
            print(f"  {e['task']:<20} {tag}  success {e['success_rate']:.2f}  score {e['score']:.2f}  "
                  f"actions {e['avg_actions']:.1f}  (n={e['n']})")
