"""``crl-bench report`` (``crl-bench reproduce``, which trains, is :mod:`crl_bench.runner.reproduce`).

This module's top level imports only the standard library and the (pure-Python) suite table:
pandas-free, and matplotlib/scipy are imported by the report code when it runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from crl_bench.report.suites import SUITES, plan_suite

__all__ = ["configure_report", "print_summary", "split_csv", "SUITE_CHOICES"]

SUITE_CHOICES = [*SUITES, "all"]


def split_csv(text: str | None) -> list[str] | None:
    if text is None:
        return None
    return [p.strip() for p in text.split(",") if p.strip()]


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------

def configure_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR",
                   help="run directories, or folders that contain them (searched recursively)")
    p.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="output folder for report.md, report.json, tables/*.csv, plots/*.png "
                        "(e.g. results/cpu)")
    p.add_argument("--suite", choices=SUITE_CHOICES,
                   help="the matrix the runs should cover: runs of it that are absent are "
                        "reported missing (default: inferred from the runs found)")
    p.add_argument("--seeds", type=int, default=None,
                   help="with --suite: seeds 0..N-1 are expected (default 3)")
    p.add_argument("--tasks", help="with --suite: only these task mixes (comma-separated)")
    p.add_argument("--confidence", type=float, default=0.95, help="CI coverage (default 0.95)")
    p.add_argument("--no-plots", action="store_true", help="tables only")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=_cmd_report)


def print_summary(result: Any) -> None:
    groups = getattr(result, "groups", [])
    print(f"report: {result.n_runs} finished run(s) in {len(groups)} row(s) of (mix, agent, "
          f"configuration), {len(result.tables)} table(s), {len(result.plots)} plot(s), "
          f"{len(result.missing)} missing/incomplete run(s)")
    for g in groups:
        if g.label:  # an agent with several configurations: each is its own row
            print(f"  row {g.tasks}/{g.row}: {len(g.seeds)} finished seed(s) "
                  f"({', '.join(map(str, g.seeds)) or '-'})")
    for m in result.missing[:20]:
        seed = "" if m.seed is None else f" seed {m.seed}"
        print(f"  missing: {m.tasks}/{m.agent}{seed}: {m.reason}")
    if len(result.missing) > 20:
        print(f"  ... and {len(result.missing) - 20} more (see missing_runs.csv)")
    for note in getattr(result, "notes", []):
        print(f"  note: {note}")
    print(f"wrote {result.markdown}, {result.json}, {len(result.csvs)} CSV file(s)")


def _cmd_report(args: argparse.Namespace) -> int:
    from crl_bench.report.writer import write_report

    expected = None
    if args.suite:
        plan = plan_suite(args.suite, args.seeds or 3, split_csv(args.tasks))
        expected = [(r.tasks, r.agent, r.seed) for r in plan]
    elif args.seeds is not None or args.tasks is not None:
        raise ValueError("--seeds and --tasks describe a suite's matrix: give --suite too")
    result = write_report(args.run_dirs, args.out, expected=expected, plots=not args.no_plots,
                          confidence=args.confidence)
    print_summary(result)
    return 0
