"""Reading run directories, and accounting for the runs that are missing or unfinished.

A run directory (written by the runner, see ``crl_bench.runner.records``) holds ``config.json``,
``status.json``, ``metrics.jsonl``, ``episodes.jsonl`` and ``eval.jsonl``. Only finished runs
(``state == "done"``) contribute numbers; every other run, and every run the suite expected but
did not find, is listed as a :class:`MissingRun` so that no table silently loses a seed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

__all__ = ["Run", "MissingRun", "RunSet", "load_run", "find_run_dirs", "load_runs",
           "read_jsonl", "is_run_dir"]


# one reader for the run directory's JSONL files: the runner's (torn last lines skipped)
from crl_bench.runner.records import read_jsonl  # noqa: E402


@dataclass
class Run:
    """One run directory, read.

    Attributes:
        path: the directory.
        config: ``config.json`` (agent, tasks, task_names, preset, seed, steps, model, ...).
        status: ``status.json`` ({"state", "step", ...}); ``{"state": "missing"}`` if absent.
        metrics: ``metrics.jsonl`` records, one per training step.
        evals: ``eval.jsonl`` records, one per (eval step, task, with_experience).
    """

    path: Path
    config: dict[str, Any]
    status: dict[str, Any]
    metrics: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)

    @property
    def agent(self) -> str:
        return str(self.config["agent"])

    @property
    def tasks(self) -> str:
        return str(self.config["tasks"])

    @property
    def seed(self) -> int:
        return int(self.config["seed"])

    @property
    def task_names(self) -> list[str]:
        names = self.config.get("task_names")
        if names:
            return [str(n) for n in names]
        return sorted({str(r["task"]) for r in self.evals})

    @property
    def state(self) -> str:
        return str(self.status.get("state", "missing"))

    @property
    def done(self) -> bool:
        return self.state == "done"

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.tasks, self.agent, self.seed)

    def episodes(self) -> list[dict[str, Any]]:
        """``episodes.jsonl`` (read on demand: it is the largest record file)."""
        return read_jsonl(self.path / "episodes.jsonl")

    def facts(self) -> dict[str, Any]:
        """What it took: steps, training episodes, evaluation episodes per mode, the time the
        steps (and the timed evaluations) took, the final bank size; None where not recorded."""
        # a step's record times the whole step; the step-0 record only its evaluation
        keys = [(m, "timing_s/step" if m.get("step") else "timing_s/eval") for m in self.metrics]
        timed = [float(m[k]) for m, k in keys if k in m]
        final = self.final_eval()
        bank = [m["bank/size"] for m in self.metrics if "bank/size" in m]
        return {
            "steps": self.config.get("steps"),
            "train_episodes": sum(1 for e in self.episodes() if e.get("phase") == "train"),
            "eval_episodes": max((int(r.get("n", 0)) for r in final.values()), default=None),
            "time_min": sum(timed) / 60 if timed else None,
            "bank_size": int(bank[-1]) if bank else None,
        }

    def final_eval(self) -> dict[tuple[str, bool], dict[str, Any]]:
        """The last evaluation: ``(task, with_experience) -> record`` at the largest eval step."""
        if not self.evals:
            return {}
        last = max(int(r["step"]) for r in self.evals)
        return {(str(r["task"]), bool(r["with_experience"])): r
                for r in self.evals if int(r["step"]) == last}

    def eval_value(self, task: str, with_experience: bool, metric: str) -> float | None:
        """One metric of the final evaluation, or None if that evaluation was not recorded."""
        rec = self.final_eval().get((task, with_experience))
        if rec is None or rec.get(metric) is None:
            return None
        return float(rec[metric])


@dataclass(frozen=True)
class MissingRun:
    """A run that contributes no number, and why.

    ``path`` is None when no directory was found at all.
    """

    tasks: str
    agent: str
    seed: int | None
    reason: str
    path: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"tasks": self.tasks, "agent": self.agent, "seed": self.seed,
                "reason": self.reason, "path": self.path}


_REQUIRED_CONFIG = ("agent", "tasks", "seed")


def is_run_dir(path: Path) -> bool:
    """A run directory has ``config.json`` plus at least one record file or ``status.json``."""
    if not (path / "config.json").is_file():
        return False
    return any((path / name).exists()
               for name in ("status.json", "metrics.jsonl", "eval.jsonl", "episodes.jsonl"))


def find_run_dirs(paths: Iterable[str | Path], allow_empty: bool = False) -> list[Path]:
    """Run directories given directly or found below the given folders (sorted, no duplicates).

    Raises:
        FileNotFoundError: a path does not exist, or (unless ``allow_empty``) holds no run
            directory.
    """
    found: dict[Path, Path] = {}  # resolved (to drop duplicates) -> as given (for the report)
    for p in paths:
        path = Path(p)
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist; give run directories (with "
                                    "config.json) or folders that contain them")
        if is_run_dir(path):
            found.setdefault(path.resolve(), path)
            continue
        below = [c.parent for c in sorted(path.rglob("config.json"))
                 if "checkpoints" not in c.parent.relative_to(path).parts and is_run_dir(c.parent)]
        if not below and not allow_empty:
            raise FileNotFoundError(
                f"no run directory under {path}: a run directory holds config.json and "
                "status.json/metrics.jsonl/eval.jsonl, as written by `crl-bench run`")
        for d in below:
            found.setdefault(d.resolve(), d)
    return sorted(found.values())


def load_run(path: str | Path) -> Run:
    """Read one run directory.

    Raises:
        ValueError: ``config.json`` is unreadable or lacks agent/tasks/seed.
    """
    path = Path(path)
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path / 'config.json'} is unreadable ({exc})") from exc
    lacking = [k for k in _REQUIRED_CONFIG if k not in config]
    if lacking:
        raise ValueError(f"{path / 'config.json'} lacks {', '.join(lacking)}; it was not written "
                         "by `crl-bench run`")
    status_path = path / "status.json"
    try:
        status = json.loads(status_path.read_text()) if status_path.exists() else {
            "state": "missing", "step": -1}
    except json.JSONDecodeError:
        status = {"state": "unreadable status.json", "step": -1}
    return Run(path=path, config=config, status=status,
               metrics=read_jsonl(path / "metrics.jsonl"),
               evals=read_jsonl(path / "eval.jsonl"))


@dataclass
class RunSet:
    """The runs a report is built from, plus everything that is missing.

    Attributes:
        runs: finished runs, one per (tasks, agent, seed).
        missing: expected or found runs that contribute nothing, with the reason.
        expected: ``(tasks, agent) -> seeds`` the report should have; from a suite, or inferred
            (every seed seen with a mix is expected of every agent seen with that mix).
        notes: other things the reader should know (duplicates ignored, ...).
    """

    runs: list[Run]
    missing: list[MissingRun]
    expected: dict[tuple[str, str], list[int]]
    notes: list[str] = field(default_factory=list)

    def select(self, tasks: str, agent: str) -> list[Run]:
        return sorted((r for r in self.runs if r.tasks == tasks and r.agent == agent),
                      key=lambda r: r.seed)

    def expected_n(self, tasks: str, agent: str) -> int:
        return len(self.expected.get((tasks, agent), []))

    def mixes(self) -> list[str]:
        """Task mixes with any run or expectation, in first-seen order."""
        seen: dict[str, None] = {}
        for tasks, _ in self.expected:
            seen[tasks] = None
        for r in self.runs:
            seen[r.tasks] = None
        return list(seen)

    def task_names(self, tasks: str) -> list[str]:
        for r in self.runs:
            if r.tasks == tasks:
                return r.task_names
        return []

    def agents(self, tasks: str) -> list[str]:
        seen: dict[str, None] = {}
        for (t, a) in self.expected:
            if t == tasks:
                seen[a] = None
        for r in self.runs:
            if r.tasks == tasks:
                seen[r.agent] = None
        return list(seen)


def load_runs(paths: Iterable[str | Path],
              expected: Iterable[tuple[str, str, int]] | None = None) -> RunSet:
    """Load every run below ``paths`` and account for what is missing.

    Args:
        paths: run directories or folders holding them.
        expected: ``(tasks, agent, seed)`` triples the report must cover (e.g. a suite's
            matrix). None: inferred — for each mix, every seed seen with it is expected of
            every agent seen with it.

    Returns:
        A :class:`RunSet`. Runs that are unreadable, not done, or duplicates of a finished run
        end up in ``missing`` or ``notes``, never nowhere.
    """
    missing: list[MissingRun] = []
    notes: list[str] = []
    by_key: dict[tuple[str, str, int], Run] = {}
    unfinished: dict[tuple[str, str, int], list[Run]] = {}
    # with an expected matrix, an empty folder is a valid (all-missing) report
    for d in find_run_dirs(paths, allow_empty=expected is not None):
        try:
            run = load_run(d)
        except ValueError as exc:
            missing.append(MissingRun("?", "?", None, str(exc), str(d)))
            continue
        if not run.done:
            unfinished.setdefault(run.key, []).append(run)
            continue
        if run.key in by_key:
            notes.append(f"duplicate finished run {run.path} ignored: {by_key[run.key].path} "
                         f"already gives {run.tasks}/{run.agent}/seed {run.seed}")
            continue
        by_key[run.key] = run

    if expected is None:
        seeds_by_mix: dict[str, set[int]] = {}
        agents_by_mix: dict[str, set[str]] = {}
        for (tasks, agent, seed) in list(by_key) + list(unfinished):
            seeds_by_mix.setdefault(tasks, set()).add(seed)
            agents_by_mix.setdefault(tasks, set()).add(agent)
        triples = {(t, a, s) for t in seeds_by_mix for a in agents_by_mix[t]
                   for s in seeds_by_mix[t]}
    else:
        triples = set(expected)
    expected_map: dict[tuple[str, str], list[int]] = {}
    for (t, a, s) in sorted(triples):
        expected_map.setdefault((t, a), []).append(s)

    for key, runs in sorted(unfinished.items()):
        if key in by_key:
            for r in runs:
                notes.append(f"unfinished duplicate {r.path} ignored ({r.state}); a finished run "
                             f"exists at {by_key[key].path}")
            continue
        for r in runs:
            error = r.status.get("error")
            reason = f"state={r.state} at step {r.status.get('step', '?')}"
            if error:
                reason += f": {error}"
            missing.append(MissingRun(r.tasks, r.agent, r.seed, reason, str(r.path)))
    for (t, a, s) in sorted(triples):
        if (t, a, s) not in by_key and (t, a, s) not in unfinished:
            missing.append(MissingRun(t, a, s, "no run directory found"))
    for run in by_key.values():
        if not run.evals:
            missing.append(MissingRun(run.tasks, run.agent, run.seed,
                                      "finished but eval.jsonl has no evaluation",
                                      str(run.path)))
    return RunSet(runs=sorted(by_key.values(), key=lambda r: r.key), missing=missing,
                  expected=expected_map, notes=notes)
