"""``crl-bench reproduce``: train a whole suite (agents x tasks x seeds), then write the report.

Resumable: finished runs are skipped, unfinished ones continued (see :func:`reproduce`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

from crl_bench.report.cli import SUITE_CHOICES, print_summary, split_csv
from crl_bench.report.suites import PlannedRun, plan_suite

__all__ = ["configure", "reproduce", "RunFn"]

RunFn = Callable[..., Path]
"""``run_experiment(agent=, tasks=, preset=, seed=, out_dir=, steps=, overrides=, resume=)``."""


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", choices=SUITE_CHOICES, required=True,
                   help="single: Baseline vs Comp. RL per env family; multi: the 4 paper agents "
                        "on 3mix + Baseline/Comp. RL on 6mix; ablation: Comp. RL variants on "
                        "3mix; all: everything")
    from crl_bench.config.schema import PRESETS

    p.add_argument("--preset", default="cpu", choices=list(PRESETS),
                   help="run preset (`crl-bench list presets`; default cpu)")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per cell (default 3)")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="where runs go, DIR/runs/<mix>__<agent>__seed<k> "
                        "(default runs/reproduce-<preset>)")
    p.add_argument("--report-out", type=Path, default=None, metavar="DIR",
                   help="where the report goes (default DIR/report)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: preset's)")
    p.add_argument("--tasks", default=None,
                   help="only these task mixes of the suite, comma-separated (e.g. "
                        "minihack,webshop when the other env families have no data here)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override passed to every run (repeatable), e.g. "
                        "--set rollout.groups=2")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs trained at once, each in its own process (default 1). On a CPU, "
                        "give each run one torch thread: --jobs 2 --set threads=1 on 2 cores")
    p.add_argument("--dry-run", action="store_true", help="print the matrix and exit")
    p.add_argument("--no-plots", action="store_true", help="tables only")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=_cmd_reproduce)


def reproduce(suite: str, preset: str, seeds: int, out_dir: str | Path, *,
              steps: int | None = None, tasks: list[str] | None = None,
              overrides: dict[str, Any] | None = None, report_dir: str | Path | None = None,
              plots: bool = True, run_fn: RunFn | None = None, jobs: int = 1,
              log: Callable[[str], None] = print) -> Any:
    """Run a suite's matrix (skipping finished runs), then write the report.

    Resumable: a run whose ``status.json`` says ``done`` is skipped, and so is one that another
    live process is training (its lock is held); any other run is started or continued by the
    runner with ``resume=True``. A run that raises is logged and the matrix goes
    on; the report lists it as missing with the error.

    Args:
        suite, preset, seeds, steps, tasks, overrides: see ``crl-bench reproduce --help``.
        out_dir: runs go to ``out_dir/runs/<mix>__<agent>__seed<k>``.
        report_dir: report folder (default ``out_dir/report``).
        run_fn: the runner; default ``crl_bench.runner.api.run_experiment``. With ``jobs > 1``
            it must be picklable (a module-level function).
        jobs: runs trained at once, each in a worker process (spawned: no state is shared).

    Returns:
        The :class:`crl_bench.report.writer.ReportResult`.
    """
    from crl_bench.report.runs import load_run
    from crl_bench.report.writer import write_report
    from crl_bench.records.files import RunInUseError, run_holder

    plan: list[PlannedRun] = plan_suite(suite, seeds, tasks)
    if run_fn is None:
        from crl_bench.runner.api import run_experiment as run_fn  # type: ignore[no-redef]
    out = Path(out_dir)
    runs_root = out / "runs"
    runs_root.mkdir(parents=True, exist_ok=True)
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    notes: list[str] = []
    todo: list[tuple[str, PlannedRun, Path]] = []
    for i, planned in enumerate(plan, 1):
        run_dir = runs_root / planned.dir_name
        tag = f"[{i}/{len(plan)}] {planned.tasks} / {planned.agent} / seed {planned.seed}"
        holder = run_holder(run_dir)
        if holder is not None:
            msg = str(RunInUseError(run_dir, holder))
            notes.append(msg)
            log(f"{tag}: skipped: {msg}")
            continue
        status_path = run_dir / "status.json"
        if status_path.exists():
            try:
                state = json.loads(status_path.read_text()).get("state")
            except json.JSONDecodeError:
                state = None
            if state == "done":
                done_steps = load_run(run_dir).config.get("steps")
                if steps is not None and done_steps != steps:
                    msg = (f"{run_dir} finished with steps={done_steps}, not the requested "
                           f"{steps}; kept as is (delete the folder to rerun it)")
                    notes.append(msg)
                    log(f"{tag}: warning: {msg}")
                log(f"{tag}: done already, skipped")
                continue
        todo.append((tag, planned, run_dir))

    def failed(tag: str, planned: PlannedRun, exc: BaseException) -> None:
        if isinstance(exc, RunInUseError):  # another process took it after we planned
            notes.append(str(exc))
            log(f"{tag}: skipped: {exc}")
            return
        # keep going: one broken cell must not lose the others
        notes.append(f"{planned.dir_name} raised {type(exc).__name__}: {exc}")
        log(f"{tag}: FAILED: {type(exc).__name__}: {exc}")

    def kwargs(planned: PlannedRun, run_dir: Path) -> dict[str, Any]:
        return dict(agent=planned.agent, tasks=planned.tasks, preset=preset, seed=planned.seed,
                    out_dir=run_dir, steps=steps, overrides=dict(overrides or {}), resume=True)

    if jobs == 1 or len(todo) <= 1:
        for tag, planned, run_dir in todo:
            log(f"{tag}: running -> {run_dir}")
            try:
                run_fn(**kwargs(planned, run_dir))
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                failed(tag, planned, exc)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {}
            for tag, planned, run_dir in todo:
                log(f"{tag}: queued -> {run_dir}")
                futures[pool.submit(run_fn, **kwargs(planned, run_dir))] = (tag, planned)
            for fut in as_completed(futures):
                tag, planned = futures[fut]
                try:
                    fut.result()
                    log(f"{tag}: finished")
                except Exception as exc:
                    failed(tag, planned, exc)
    result = write_report([runs_root], Path(report_dir) if report_dir else out / "report",
                          expected=[(p.tasks, p.agent, p.seed) for p in plan], plots=plots,
                          title=f"crl-bench reproduce --suite {suite} --preset {preset} "
                                f"--seeds {seeds}", notes=notes)
    return result


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from crl_bench.config.overrides import parse_overrides

    tasks = split_csv(args.tasks)
    plan = plan_suite(args.suite, args.seeds, tasks)
    out = args.out or Path("runs") / f"reproduce-{args.preset}"
    if args.dry_run:
        for p in plan:
            print(f"{p.tasks:<10} {p.agent:<24} seed {p.seed}  -> {out / 'runs' / p.dir_name}")
        print(f"{len(plan)} run(s)")
        return 0
    result = reproduce(args.suite, args.preset, args.seeds, out, steps=args.steps, tasks=tasks,
                       overrides=parse_overrides(args.overrides), report_dir=args.report_out,
                       plots=not args.no_plots, jobs=args.jobs)
    print_summary(result)
    return 1 if result.missing else 0

