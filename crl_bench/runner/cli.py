"""``crl-bench run``: argument parsing only (the work is imported when the command runs)."""

from __future__ import annotations

import argparse


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agent", default=None,
                   help="agent name (`crl-bench list agents`); default comp_rl (with --resume: the "
                        "stored run's; a different one is refused)")
    p.add_argument("--tasks", default=None,
                   help="task set: a mix (`crl-bench list mixes`: minihack, webshop, alfworld, swe, 3mix, "
                        "6mix) or comma-separated env ids; default 3mix (with --resume: the stored run's)")
    p.add_argument("--preset", choices=["tiny", "cpu", "paper"], default=None,
                   help="tiny (tests), cpu (embedded SmolLM2; minutes per step on 2 cores), paper (GPUs); "
                        "default: cpu without a GPU, paper with one")
    p.add_argument("--seed", type=int, nargs="+", default=None,
                   help="one or more distinct seeds >= 0 (one run each); default 0")
    p.add_argument("--steps", type=int, default=None, help="actor steps (overrides the preset)")
    p.add_argument("--out", default=None,
                   help="run directory (one seed) or parent folder (several seeds); default runs/<name>")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--repair", action="store_true",
                   help="with --resume: move damaged record lines (a line torn by a crash, a corrupt "
                        "line) aside to <file>.bad instead of stopping with an error")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set actor.lr=2e-5 --set rollout.group_size=8")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=run_command)
    p.epilog = ("--set cannot change agent/tasks/seed/preset/steps to something else than their own "
                "options say (refused). Errors print `error: ...` and exit 2; --debug shows the "
                "traceback.")


def run_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from crl_bench.cli import parse_overrides
    from crl_bench.runner.api import default_run_dir, run_experiment

    overrides = parse_overrides(args.overrides)
    if args.resume and not args.out:
        raise ValueError("--resume needs --out RUN_DIR (the run to continue).")
    if args.repair and not args.resume:
        raise ValueError("--repair only applies with --resume: crl-bench run --resume --repair --out RUN_DIR")
    seeds = args.seed if args.seed is not None else [None]
    dup = sorted({s for s in seeds if seeds.count(s) > 1})
    if dup:
        raise ValueError(f"--seed {' '.join(map(str, args.seed))}: seed {', '.join(map(str, dup))} "
                         "is given more than once; give each seed once (one run per seed).")
    bad = [s for s in seeds if s is not None and s < 0]
    if bad:
        raise ValueError(f"--seed {bad[0]}: seeds must be >= 0.")
    agent, tasks = args.agent or "comp_rl", args.tasks or "3mix"
    for seed in seeds:
        if args.out and len(seeds) == 1:
            out = Path(args.out)
        elif args.out:
            out = Path(args.out) / f"{tasks}__{agent}__{seed}"
        else:
            out = default_run_dir(agent, tasks, 0 if seed is None else seed)
        # with --resume the stored run's agent/tasks/seed hold; options given must agree with it
        path = run_experiment(args.agent if args.resume else agent,
                              args.tasks if args.resume else tasks, args.preset,
                              seed, out, steps=args.steps, overrides=overrides,
                              resume=args.resume, progress=not args.no_progress,
                              repair=args.repair)
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
