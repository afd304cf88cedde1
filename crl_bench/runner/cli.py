"""``crl-bench run``: argument parsing only (the work is imported when the command runs)."""

from __future__ import annotations

import argparse


def configure(p: argparse.ArgumentParser) -> None:
    from crl_bench.config.schema import DEFAULT_AGENT, DEFAULT_TASKS, PRESETS

    p.add_argument("--agent", default=None,
                   help=f"agent name (`crl-bench list agents`); default {DEFAULT_AGENT} (with "
                        "--resume: the stored run's; a different one is refused)")
    p.add_argument("--tasks", default=None,
                   help="task set: a mix (`crl-bench list mixes`) or comma-separated env ids; "
                        f"default {DEFAULT_TASKS} (with --resume: the stored run's)")
    p.add_argument("--preset", choices=list(PRESETS), default=None,
                   help="; ".join(f"{p.name}: {p.summary}" for p in PRESETS.values())
                   + " (`crl-bench list presets` shows each one's settings)")
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
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="run on a Ray cluster (pip install 'crl-bench[ray]'): ADDRESS of a running "
                        "cluster (HOST:PORT or auto), none: start a local one; see docs/scaling.md")
    p.add_argument("--ray-plan", default="cpu", metavar="PLAN",
                   help="with --ray: resource plan (cpu, gpu1, paper16, paper16-split; "
                        "docs/scaling.md)")
    p.add_argument("--no-progress", action="store_true",
                   help="no live progress line (default: one line rewritten in place on a terminal, "
                        "a plain line every 10 s otherwise; CRL_PROGRESS_EVERY=SECONDS changes that)")
    p.add_argument("--wandb", action="store_true",
                   help="also log metrics to Weights & Biases (pip install 'crl-bench[wandb]'); "
                        "offline without WANDB_API_KEY (files in RUN_DIR/wandb); also on with "
                        "WANDB_MODE or WANDB_API_KEY set, off with CRL_WANDB=0")
    p.add_argument("--no-report", action="store_true",
                   help="do not write the report (tables + plots) into RUN_DIR/report at the end")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=run_command)
    p.epilog = ("--set cannot change agent/tasks/seed/preset/steps to something else than their own "
                "options say (refused). Errors print `error: ...` and exit 2; --debug shows the "
                "traceback.")


def run_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from crl_bench.config.overrides import parse_overrides
    from crl_bench.runner.api import default_run_dir, run_experiment
    from crl_bench.config.schema import DEFAULT_AGENT, DEFAULT_TASKS

    overrides = parse_overrides(args.overrides)
    if getattr(args, "wandb", False):
        import os

        os.environ["CRL_WANDB"] = "1"
    if args.out is not None and not args.out.strip():
        raise ValueError('--out "": give the run a folder (e.g. --out runs/my_run), or leave --out '
                         "out for runs/<tasks>__<agent>__<seed>__<time>.")
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
    agent, tasks = args.agent or DEFAULT_AGENT, args.tasks or DEFAULT_TASKS
    ray = (None if args.ray is None else
           {"address": None if args.ray == "local" else args.ray, "plan": args.ray_plan})
    for seed in seeds:
        if args.out and len(seeds) == 1:
            out = Path(args.out)
        elif args.out:
            out = Path(args.out) / f"{tasks}__{agent}__{seed}"
        else:
            out = default_run_dir(agent, tasks, 0 if seed is None else seed)
        if args.resume:  # a folder without a stored run is refused, never started afresh
            from crl_bench.runner.api import require_stored_run

            require_stored_run(out, {"--agent": args.agent, "--tasks": args.tasks,
                                     "--preset": args.preset, "--seed": seed})
        # with --resume the stored run's agent/tasks/seed hold; options given must agree with it
        path = run_experiment(args.agent if args.resume else agent,
                              args.tasks if args.resume else tasks, args.preset,
                              seed, out, steps=args.steps, overrides=overrides,
                              resume=args.resume, progress=not args.no_progress,
                              repair=args.repair, ray=ray)
        _print_summary(path)
        if not getattr(args, "no_report", False):
            _write_run_report(path)
        for line in closing_lines(path):
            print(line)
    return 0


def _write_run_report(path) -> None:
    """The run's own report (tables + plots via ``crl_bench.report``) in ``RUN_DIR/report``."""
    try:
        from crl_bench.report.writer import write_report

        result = write_report([path], path / "report", title=f"crl-bench run {path.name}")
    except Exception as exc:  # noqa: BLE001 - the run itself is done and recorded
        print(f"report: not written ({type(exc).__name__}: {exc}); try "
              f"`{invoked_program()} report {path} --out {path / 'report'}`")
        return
    print(f"report: {result.markdown} ({len(result.plots)} plot(s) in {result.out_dir / 'plots'})")


def summary_lines(evals: list[dict]) -> list[str]:
    """The end-of-run table: per task, evaluation success without / with experience, first
    evaluated step -> last, and the held-out episodes each rate is over."""
    if not evals:
        return []
    first, last = min(e["step"] for e in evals), max(e["step"] for e in evals)
    cells = {(e["task"], bool(e["with_experience"]), e["step"]): e for e in evals}
    tasks = list(dict.fromkeys(e["task"] for e in evals))
    modes = [m for m in (False, True) if any(k[1] == m for k in cells)]
    head = f"  {'task':<22}" + "".join(f"{'without exp' if not m else 'with exp':>22}" for m in modes)
    when = f"step {first} -> step {last}" if first != last else f"step {last}"
    lines = [f"success rate over held-out episodes, evaluation at {when}:", head]
    for task in tasks:
        row = f"  {task:<22}"
        for m in modes:
            a, b = cells.get((task, m, first)), cells.get((task, m, last))
            text = ("-" if not (a and b) else f"{b['success_rate']:.2f} ({b['n']} episodes)"
                    if first == last else
                    f"{a['success_rate']:.2f} -> {b['success_rate']:.2f} ({b['n']} episodes)")
            row += f"{text:>22}"
        lines.append(row)
    return lines


def _print_summary(path) -> None:
    from crl_bench.records.files import read_jsonl

    evals = read_jsonl(path / "eval.jsonl")
    print(f"\nrun directory: {path}")
    for line in summary_lines(evals):
        print(line)


def invoked_program() -> str:
    """How the user started this command, for the commands the end of a run suggests: the path
    they ran (``.venv/bin/crl-bench``), ``crl-bench`` when that is what their PATH finds, or
    ``python -m crl_bench.cli``."""
    import os
    import shutil
    import sys

    argv0 = sys.argv[0] if sys.argv else ""
    name = os.path.basename(argv0)
    if name.startswith("crl-bench"):
        on_path = shutil.which("crl-bench")
        if on_path and os.path.realpath(on_path) == os.path.realpath(argv0):
            return "crl-bench"
        if os.path.isabs(argv0):  # make it relative to where the user is, when it is below
            rel = os.path.relpath(argv0)
            return rel if not rel.startswith("..") else argv0
        return argv0
    return f"{os.path.basename(sys.executable) or 'python'} -m crl_bench.cli"


def _sample_entries(bank, sample: int) -> list:
    """Up to ``sample`` recent entries, one per family first (a run on several families shows
    each), then the most recent of the rest."""
    picked, seen = [], set()
    recent = bank.list_entries(order="recent", limit=max(50, sample))
    for e in recent:
        if e.family not in seen and len(picked) < sample:
            picked.append(e)
            seen.add(e.family)
    for e in recent:
        if len(picked) >= sample:
            break
        if e not in picked:
            picked.append(e)
    return picked


def closing_lines(path, sample: int = 3) -> list[str]:
    """The end of ``run``: what the run was, a sample of what the extractor wrote, what to run
    next. Never fails: the run is done and recorded whatever this can read."""
    import json

    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return []
    preset, agent, tasks = cfg.get("preset"), cfg.get("agent"), cfg.get("tasks")
    prog = invoked_program()
    lines = [""]
    if preset in ("quick", "tiny"):
        lines.append(f"This was the `{preset}` preset: {cfg.get('steps')} step(s) of {agent} on {tasks}, "
                     f"{cfg.get('eval', {}).get('episodes_per_task')} held-out episodes per cell - a "
                     "look at the whole pipeline, not a result (a small model this briefly trained "
                     "scores ~0 here).")
    bank = path / "bank.sqlite"
    if bank.is_file():
        try:
            from crl_bench.experience.bank import ExperienceBank

            with ExperienceBank.open(bank, read_only=True, build_index=False) as b:
                n, entries = len(b), _sample_entries(b, sample)
            families = sorted({e.family for e in entries})
            lines.append(f"What the extractor wrote ({len(entries)} of {n} bank entries, the "
                         f"latest of {', '.join(families)}; all: {prog} bank show {bank}):" if n else
                         "The experience bank is empty: the extractor wrote no well-formed entry.")
            if n and preset in ("quick", "tiny"):
                lines.append(f"  (written by the `{preset}` preset's small model after "
                             f"{cfg.get('steps')} step(s): expect them to read poorly; they show "
                             "the pipeline, not what a trained extractor writes)")
            lines += [f"  [{e.family}] {e.title}: {' '.join(e.content.split())[:150]}" for e in entries]
        except Exception as exc:  # noqa: BLE001 - a look at the bank, never the run's outcome
            lines.append(f"bank: not read ({type(exc).__name__}: {exc}); try `{prog} bank show {bank}`")
    if preset in ("quick", "tiny"):
        lines += ["Next, for a result: train grpo and comp_rl on one family over seeds, then compare:",
                  f"  {prog} run --agent grpo --tasks minihack --preset cpu --seed 0 1 2",
                  f"  {prog} run --agent comp_rl --tasks minihack --preset cpu --seed 0 1 2",
                  f"  {prog} report runs/minihack__* --out results/mine",
                  "  (about 70 min per run on 2 CPU cores; on GPUs --preset paper; docs/usage.md)"]
    return lines


# ---------------------------------------------------------------------------------------------
# eval / show
# ---------------------------------------------------------------------------------------------

def configure_eval(p: argparse.ArgumentParser) -> None:
    from crl_bench.config.schema import DEFAULT_TASKS, PRESETS

    p.add_argument("model", nargs="?", default=None, metavar="MODEL",
                   help="what to evaluate: a Hugging Face id (owner/name), a model folder, a "
                        "built-in name (smollm2-135m, tiny-sft), or a run directory (its "
                        "configuration and last checkpoint); default: the preset's actor")
    p.add_argument("--endpoint", metavar="URL",
                   help="an OpenAI-compatible server instead of MODEL, e.g. "
                        "http://127.0.0.1:8000/v1 (vllm serve, SGLang, llama.cpp, OpenAI); "
                        "$OPENAI_API_KEY is sent when set")
    p.add_argument("--model-id", metavar="NAME", help="with --endpoint: the served model's name")
    p.add_argument("--tasks", default=None,
                   help=f"task set: a mix (`crl-bench list mixes`) or comma-separated env ids; "
                        f"default {DEFAULT_TASKS} (a run directory: the run's)")
    p.add_argument("--bank", metavar="PATH",
                   help="an experience bank (e.g. RUN_DIR/bank.sqlite): evaluate without and with "
                        "experience retrieved from it (a copy is used; the file is not changed)")
    p.add_argument("--seed", type=int, nargs="+", default=[0],
                   help="one or more seeds (one evaluation each; the report's intervals are over "
                        "them); default 0")
    p.add_argument("--episodes", type=int, default=None,
                   help="held-out episodes per task and mode (default: the preset's "
                        "eval.episodes_per_task)")
    p.add_argument("--preset", choices=list(PRESETS), default=None,
                   help="settings of the episodes and sampling (default: quick without a GPU, "
                        "paper with one; a run directory: the run's)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set eval.temperature=0")
    p.add_argument("--out", default=None,
                   help="output folder: one folder per seed (seed_N, laid out as a run's) and "
                        "report/; default evals/<tasks>__<model>__<time>")
    p.add_argument("--concurrency", type=int, default=8,
                   help="with --endpoint: requests in flight at once (default 8)")
    p.add_argument("--no-progress", action="store_true", help="no live progress line")
    p.add_argument("--no-report", action="store_true", help="do not write OUT/report")
    p.add_argument("--wandb", action="store_true",
                   help="also log to Weights & Biases (as for `crl-bench run --wandb`)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=eval_command)
    p.epilog = ("Writes the same evaluation records as a run (eval.jsonl, episodes.jsonl, "
                "trajectories/) and a report with success, steps and intervals over seeds. "
                "`crl-bench show OUT/seed_0 --episode 0` prints one episode as the model saw it.")


def eval_command(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from crl_bench.config.overrides import parse_overrides
    from crl_bench.runner.eval_api import resolve_model, run_eval

    if args.wandb:
        os.environ["CRL_WANDB"] = "1"
    if args.concurrency < 1:
        raise ValueError(f"--concurrency {args.concurrency}: give 1 or more")
    model = resolve_model(args.model, args.endpoint, args.model_id)
    out, dirs, report = run_eval(
        model, tasks=args.tasks, preset=args.preset, seeds=list(args.seed),
        out=Path(args.out) if args.out else None, bank=Path(args.bank) if args.bank else None,
        episodes=args.episodes, overrides=parse_overrides(args.overrides),
        progress=not args.no_progress, report=not args.no_report, concurrency=args.concurrency)
    from crl_bench.records.files import read_jsonl

    evals = [e for d in dirs for e in read_jsonl(d / "eval.jsonl")]
    print(f"\nevaluation: {out} ({len(dirs)} seed(s): {', '.join(d.name for d in dirs)})")
    for line in eval_summary_lines(evals):
        print(line)
    if report is not None:
        print(f"report: {report.markdown}")
    print(f"one episode as the model saw it: crl-bench show {dirs[0]} --episode 0")
    return 0


def eval_summary_lines(evals: list[dict]) -> list[str]:
    """Per task and mode: success over all seeds' episodes (the report has the intervals)."""
    cells: dict[tuple[str, bool], list[dict]] = {}
    for e in evals:
        cells.setdefault((e["task"], bool(e["with_experience"])), []).append(e)
    lines = [f"  {'task':<22}{'mode':>18}{'success':>10}{'episodes':>10}{'seeds':>7}"]
    for (task, with_exp), recs in cells.items():
        n = sum(int(r["n"]) for r in recs)
        wins = sum(float(r["success_rate"]) * int(r["n"]) for r in recs)
        lines.append(f"  {task:<22}{'with experience' if with_exp else 'without':>18}"
                     f"{wins / max(1, n):>10.2f}{n:>10}{len(recs):>7}")
    return lines


def configure_show(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (or one seed's folder of "
                                                      "an evaluation)")
    p.add_argument("--episode", type=int, default=None, metavar="N",
                   help="line N (from 0) of RUN_DIR/episodes.jsonl; without it the episodes are "
                        "listed")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=show_command)


def show_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from crl_bench.runner.show import episode_index_lines, format_episode

    run = Path(args.run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"{run}: no such run directory")
    lines = (episode_index_lines(run) if args.episode is None
             else format_episode(run, args.episode))
    try:
        print("\n".join(lines), flush=True)
    except BrokenPipeError:  # piped into `head` or a pager that was closed: nothing is wrong
        import os
        import sys

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
