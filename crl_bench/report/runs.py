"""Reading run directories, and accounting for the runs that are missing or unfinished.

A run directory (written by the runner, see ``crl_bench.records.files``) holds ``config.json``,
``status.json``, ``metrics.jsonl``, ``episodes.jsonl`` and ``eval.jsonl``. Only finished runs
(``state == "done"``) contribute numbers; every other run, and every run the suite expected but
did not find, is listed as a :class:`MissingRun` so that no table silently loses a seed.

Runs are grouped by their configuration: runs of one (task mix, agent) whose stored settings differ
in anything but the seed (a learning-rate sweep, another model, another preset) are separate
groups, each its own table row, labelled with the settings that tell the groups apart
(``comp_rl (lr=2e-6)``). Only runs with the same settings *and* the same seed are duplicates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

__all__ = ["Run", "MissingRun", "RunSet", "RunGroup", "load_run", "find_run_dirs", "load_runs",
           "read_jsonl", "is_run_dir", "run_settings", "NOT_SETTINGS"]


# one reader for the run directory's JSONL files: the runner's (torn last lines skipped)
from crl_bench.records.files import read_jsonl  # noqa: E402


WAIT_KEYS = ("timing_s/extractor_wait", "timing_s/bank_wait")
"""The actor loop's time spent waiting on the extractor: for the model it held, and for pending
bank writes before a rollout (``extractor.wait_before_rollout``)."""


def actor_wait_share(metrics: list[dict[str, Any]]) -> float | None:
    """The share of the training steps' time the actor loop waited on the extractor
    (:data:`WAIT_KEYS` over ``timing_s/step``); None when the run recorded no step time."""
    steps = [m for m in metrics if m.get("step") and "timing_s/step" in m]
    total = sum(float(m["timing_s/step"]) for m in steps)
    if not steps or total <= 0:
        return None
    return sum(float(m.get(k, 0.0)) for m in steps for k in WAIT_KEYS) / total


def bank_lag_max(metrics: list[dict[str, Any]]) -> int | None:
    """The most steps the bank was behind at a training rollout's start
    (``extractor/bank_lag_steps``); None for runs without an extractor or older records."""
    lags = [int(m["extractor/bank_lag_steps"]) for m in metrics if "extractor/bank_lag_steps" in m]
    return max(lags) if lags else None


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
    group: str = ""
    """What sets this run's configuration apart from the other runs of its (tasks, agent)
    (``lr=2e-6``); empty when they all share one configuration (set by :func:`load_runs`)."""

    @property
    def row(self) -> str:
        """The run's row: the agent, with its group when the agent has several
        (``comp_rl (lr=2e-6)``)."""
        return f"{self.agent} ({self.group})" if self.group else self.agent

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
        return (self.tasks, self.row, self.seed)

    def settings(self) -> dict[str, Any]:
        """The run's configuration, flattened (:func:`run_settings`)."""
        return run_settings(self.config)

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
            "actor_wait": actor_wait_share(self.metrics),
            "bank_lag_max": bank_lag_max(self.metrics),
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

NOT_SETTINGS = ("seed", "agent", "tasks", "task_names", "env_ids", "host", "threads",
                "checkpoint_every")
"""``config.json`` keys that do not make two runs' configurations differ: the seed (runs differing
only there are seeds of one configuration), the row's own agent and task mix (and their derived
task names / env ids), the machine (``host``), torch's thread count and how often checkpoints are
written. ``method`` (the agent's option overrides) is also left out when ``agent_options`` (the
options the agent resolved from them) is there."""


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for k in sorted(value):
            _flatten(value[k], f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, (list, tuple, dict)):
        out[prefix] = json.dumps(value, sort_keys=True)
    else:
        out[prefix] = value


def run_settings(config: dict[str, Any]) -> dict[str, Any]:
    """A run's configuration as ``{dotted.key: value}``, without :data:`NOT_SETTINGS`: two runs
    of one (tasks, agent) belong to one group exactly when these are equal."""
    skip = set(NOT_SETTINGS)
    if "agent_options" in config:
        skip.add("method")
    out: dict[str, Any] = {}
    for key in sorted(config):
        if key not in skip:
            _flatten(config[key], key, out)
    return out


def _show_value(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, float):
        text = f"{v:g}"
        return text.replace("e-0", "e-").replace("e+0", "e+")
    return str(v)


# settings named first when several tell groups apart: the usual axes of a comparison
_FIRST = ("preset", "model.actor", "model.extractor", "model.lora_r", "actor.lr", "steps")


def _group_labels(settings: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Labels for distinct configurations (``lr=2e-6``): the fewest settings, taken in a fixed
    order, that tell every pair apart; and every setting in which any two differ."""
    keys = sorted({k for s in settings for k in s})
    differ = [k for k in keys if len({json.dumps(s.get(k, "<unset>"), sort_keys=True)
                                      for s in settings}) > 1]
    order = [k for k in _FIRST if k in differ] + [k for k in differ if k not in _FIRST]
    chosen: list[str] = []

    def sig(s: dict[str, Any]) -> tuple[str, ...]:
        return tuple(json.dumps(s.get(k, "<unset>"), sort_keys=True) for k in chosen)

    for k in order:
        if len({sig(s) for s in settings}) == len(settings):
            break
        before = len({sig(s) for s in settings})
        chosen.append(k)
        if len({sig(s) for s in settings}) == before:
            chosen.pop()  # separates nothing more
    short = {}
    for k in chosen:
        tail = k.rsplit(".", 1)[-1]
        short[k] = tail if sum(c.rsplit(".", 1)[-1] == tail for c in chosen) == 1 else k
    labels = [", ".join(f"{short[k]}={_show_value(s.get(k, 'unset'))}" for k in chosen)
              for s in settings]
    return labels, differ


@dataclass(frozen=True)
class RunGroup:
    """Runs of one (tasks, agent) sharing one configuration: a table row.

    Attributes:
        tasks, agent: the mix and the registered agent.
        row: the row's name (``agent``, or ``agent (label)`` when the agent has several groups).
        label: the settings that tell this group from the agent's others ("" when alone).
        differs: every setting in which the agent's groups differ, with this group's value.
        seeds: the seeds of its finished runs.
        runs: the number of its run directories (finished or not).
    """

    tasks: str
    agent: str
    row: str
    label: str
    differs: dict[str, Any]
    seeds: tuple[int, ...]
    runs: int

    def as_dict(self) -> dict[str, Any]:
        return {"tasks": self.tasks, "agent": self.agent, "row": self.row, "label": self.label,
                "differs": self.differs, "seeds": list(self.seeds), "runs": self.runs}


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

    Rows: a row is an agent, or, when the agent's runs on a mix come in several configurations,
    one per configuration (``comp_rl (lr=2e-6)``, :class:`RunGroup`); :meth:`select`,
    :meth:`agents` and :meth:`expected_n` speak of rows, :meth:`agent_of` gives a row's agent.

    Attributes:
        runs: finished runs, one per (tasks, row, seed).
        missing: expected or found runs that contribute nothing, with the reason.
        expected: ``(tasks, row) -> seeds`` the report should have; from a suite, or inferred
            (every seed seen with a mix is expected of every row seen with that mix).
        notes: other things the reader should know (duplicates ignored, ...).
        groups: every row with its configuration's difference from the agent's other rows.
    """

    runs: list[Run]
    missing: list[MissingRun]
    expected: dict[tuple[str, str], list[int]]
    notes: list[str] = field(default_factory=list)
    groups: list[RunGroup] = field(default_factory=list)

    def select(self, tasks: str, row: str) -> list[Run]:
        return sorted((r for r in self.runs if r.tasks == tasks and r.row == row),
                      key=lambda r: r.seed)

    def expected_n(self, tasks: str, row: str) -> int:
        return len(self.expected.get((tasks, row), []))

    def agent_of(self, row: str) -> str:
        """The registered agent of a row (a row that is no group is an agent's name)."""
        for g in self.groups:
            if g.row == row:
                return g.agent
        return row

    def label_of(self, row: str) -> str:
        """The row's group label ("" for an agent with one configuration)."""
        for g in self.groups:
            if g.row == row:
                return g.label
        return ""

    def ordered(self, rows: Iterable[str]) -> list[str]:
        """Rows in the paper's order of their agents (its agents, then the ablations, then the
        rest), an agent's configurations by name."""
        from crl_bench.baselines import ABLATIONS, PAPER_AGENTS

        rank = {a: i for i, a in enumerate((*PAPER_AGENTS, *ABLATIONS))}
        return sorted(rows, key=lambda r: (rank.get(self.agent_of(r), len(rank)), r))

    def rows_of(self, tasks: str, agent: str) -> list[str]:
        """The rows of one agent on a mix: one per configuration (the agent's name when none)."""
        rows = [g.row for g in self.groups if g.tasks == tasks and g.agent == agent]
        return rows or [agent]

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
        """The rows with a run or an expectation on ``tasks`` (see the class docstring)."""
        seen: dict[str, None] = {}
        for (t, a) in self.expected:
            if t == tasks:
                seen[a] = None
        for r in self.runs:
            if r.tasks == tasks:
                seen[r.row] = None
        return list(seen)


def _default_settings() -> dict[str, Any]:
    """The settings of a default ``RunConfig`` of this version (:func:`run_settings`)."""
    from crl_bench.config.schema import RunConfig

    return run_settings(RunConfig().to_dict())


def _assign_groups(runs: list[Run]) -> list[RunGroup]:
    """Set each run's ``group`` from its settings and return the groups (rows). A setting a
    run's ``config.json`` lacks (a field added to the code after the run) counts as its
    default, as a resume does, so a run from before a new field groups with later runs that
    leave it at that default."""
    by_agent: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        by_agent.setdefault((r.tasks, r.agent), []).append(r)
    defaults = _default_settings() if runs else {}
    groups: list[RunGroup] = []
    for (tasks, agent), members in by_agent.items():
        configs: dict[str, list[Run]] = {}
        filled: dict[str, dict[str, Any]] = {}
        for r in members:
            st = {**defaults, **r.settings()}
            key = json.dumps(st, sort_keys=True, default=str)
            configs.setdefault(key, []).append(r)
            filled[key] = st
        keys = sorted(configs)
        settings = [filled[k] for k in keys]
        labels, differ = (_group_labels(settings) if len(keys) > 1 else ([""], []))
        for key, label, st in zip(keys, labels, settings):
            for r in configs[key]:
                r.group = label
            row = f"{agent} ({label})" if label else agent
            groups.append(RunGroup(tasks, agent, row, label, {k: st.get(k) for k in differ},
                                   tuple(sorted({r.seed for r in configs[key] if r.done})),
                                   len(configs[key])))
    return sorted(groups, key=lambda g: (g.tasks, g.agent, g.row))


def load_runs(paths: Iterable[str | Path],
              expected: Iterable[tuple[str, str, int]] | None = None) -> RunSet:
    """Load every run below ``paths``, group them by configuration and account for what is
    missing.

    Args:
        paths: run directories or folders holding them.
        expected: ``(tasks, agent, seed)`` triples the report must cover (e.g. a suite's
            matrix): each is expected of every configuration (row) of that agent found. None:
            inferred — for each mix, every seed seen with it is expected of every row seen
            with it.

    Returns:
        A :class:`RunSet`. Runs that are unreadable, not done, or duplicates of a finished run
        (same configuration and seed) end up in ``missing`` or ``notes``, never nowhere; runs
        that differ in their configuration are separate rows (:class:`RunGroup`).
    """
    missing: list[MissingRun] = []
    notes: list[str] = []
    loaded: list[Run] = []
    # with an expected matrix, an empty folder is a valid (all-missing) report
    for d in find_run_dirs(paths, allow_empty=expected is not None):
        try:
            loaded.append(load_run(d))
        except ValueError as exc:
            missing.append(MissingRun("?", "?", None, str(exc), str(d)))
    groups = _assign_groups(loaded)
    by_key: dict[tuple[str, str, int], Run] = {}
    unfinished: dict[tuple[str, str, int], list[Run]] = {}
    for run in loaded:
        if not run.done:
            unfinished.setdefault(run.key, []).append(run)
            continue
        if run.key in by_key:
            notes.append(f"duplicate finished run {run.path} ignored: {by_key[run.key].path} "
                         f"already gives {run.tasks}/{run.row}/seed {run.seed} with the same "
                         "settings")
            continue
        by_key[run.key] = run

    if expected is None:
        seeds_by_mix: dict[str, set[int]] = {}
        rows_by_mix: dict[str, set[str]] = {}
        for (tasks, row, seed) in list(by_key) + list(unfinished):
            seeds_by_mix.setdefault(tasks, set()).add(seed)
            rows_by_mix.setdefault(tasks, set()).add(row)
        triples = {(t, a, s) for t in seeds_by_mix for a in rows_by_mix[t]
                   for s in seeds_by_mix[t]}
    else:
        rows = {(g.tasks, g.agent): [] for g in groups}
        for g in groups:
            rows[(g.tasks, g.agent)].append(g.row)
        triples = {(t, row, s) for (t, a, s) in expected for row in rows.get((t, a), [a])}
    expected_map: dict[tuple[str, str], list[int]] = {}
    for (t, a, s) in sorted(triples):
        expected_map.setdefault((t, a), []).append(s)

    for key, runs in sorted(unfinished.items()):
        if key in by_key:
            for r in runs:
                notes.append(f"unfinished duplicate {r.path} ignored ({r.state}); a finished run "
                             f"with the same settings exists at {by_key[key].path}")
            continue
        for r in runs:
            error = r.status.get("error")
            reason = f"state={r.state} at step {r.status.get('step', '?')}"
            if error:
                reason += f": {error}"
            missing.append(MissingRun(r.tasks, r.row, r.seed, reason, str(r.path)))
    for (t, a, s) in sorted(triples):
        if (t, a, s) not in by_key and (t, a, s) not in unfinished:
            missing.append(MissingRun(t, a, s, "no run directory found"))
    for run in by_key.values():
        if not run.evals:
            missing.append(MissingRun(run.tasks, run.row, run.seed,
                                      "finished but eval.jsonl has no evaluation",
                                      str(run.path)))
    return RunSet(runs=sorted(by_key.values(), key=lambda r: r.key), missing=missing,
                  expected=expected_map, notes=notes, groups=groups)
