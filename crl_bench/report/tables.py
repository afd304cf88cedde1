"""The paper's tables, built from finished runs: every cell a mean ± t-CI over seeds.

Tables (each emitted only when some run or expectation belongs to it):

- ``single_success`` / ``single_score`` / ``single_actions``: agents x env families (single-task
  runs), success rate, the env's score and average actions per episode at the final evaluation;
- ``single_vs_baseline``: Comp. RL against the baseline per family — the form of the paper's
  single-task claims (success ratio, success gain, action reduction);
- ``multi_<mix>``: the paper's multi-task layout (Baseline; Static Online Exp. w/ and w/o exp;
  Exp. Only; Comp. RL w/ and w/o exp), a column per task and the average;
- ``ablation_<mix>``: Comp. RL with one mechanism off at a time;
- ``task_scaling``: average success of Baseline and Comp. RL per multi-task mix, and the gain.

A run's value for a cell comes from its *final* evaluation (largest eval step). A finished run
that lacks the evaluation a cell needs is reported as a gap, never silently averaged away. An
agent whose runs on a mix come in several configurations gets a row per configuration, named by
what differs (``Comp. RL (lr=2e-6) w/ exp``; :class:`crl_bench.report.runs.RunGroup`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from crl_bench.report import paper
from crl_bench.report.runs import MissingRun, Run, RunSet
from crl_bench.report.stats import Estimate, diff_ci, mean_ci, ratio_of_means
from crl_bench.report.suites import ABLATIONS, PAPER_AGENTS, VARIANTS, agent_label

__all__ = ["Cell", "Row", "Table", "build_tables", "mix_task_names", "format_cell"]

AVERAGE = "Average"


@dataclass
class Cell:
    """One table cell.

    Attributes:
        column: the column it sits in.
        estimate: mean ± CI over seeds (or a diff / ratio); None when no finished run has a value.
        paper: the paper's value for this cell, if it reports one (same units / kind).
        expected_n: how many seeds the report expected behind this cell (None = unknown).
        kind: "mean", "diff" (difference of means) or "ratio" (ratio of means), for formatting.
    """

    column: str
    estimate: Estimate | None
    paper: float | None = None
    expected_n: int | None = None
    kind: str = "mean"

    @property
    def n(self) -> int:
        return 0 if self.estimate is None else self.estimate.n


@dataclass
class Row:
    label: str
    cells: list[Cell]
    agent: str | None = None
    with_experience: bool | None = None
    mix: str | None = None


@dataclass
class Table:
    """A titled grid of cells plus notes; rendered to Markdown, CSV and JSON by ``render``."""

    name: str
    title: str
    metric: str
    unit: str
    columns: list[str]
    rows: list[Row]
    notes: list[str] = field(default_factory=list)
    digits: int = 2


def mix_task_names(rs: RunSet, mix: str) -> list[str]:
    """Task (column) names of a mix: from its runs, else the built-in mix, else the name."""
    names = rs.task_names(mix)
    if names:
        return names
    try:
        from crl_bench.mixes import BUILTIN_MIXES
    except ImportError:  # pragma: no cover - the core package always has it
        BUILTIN_MIXES = {}
    if mix in BUILTIN_MIXES:
        return [t.name for t in BUILTIN_MIXES[mix]]
    return [mix]


def _variants(rs: RunSet, mix: str, agent: str) -> tuple[bool, ...]:
    if rs.agent_of(agent) in VARIANTS:
        return VARIANTS[rs.agent_of(agent)]
    found = {bool(r["with_experience"]) for run in rs.select(mix, agent) for r in run.evals}
    return tuple(sorted(found, reverse=True)) or (False,)


def _row_label(rs: RunSet, row: str, with_experience: bool, variants: tuple[bool, ...]) -> str:
    label = agent_label(rs.agent_of(row))
    if rs.label_of(row):
        label += f" ({rs.label_of(row)})"
    if len(variants) > 1:
        label += " w/ exp" if with_experience else " w/o exp"
    return label


class _Values:
    """Per-run values of one metric, collecting the gaps (finished runs without the value)."""

    def __init__(self, rs: RunSet, gaps: dict[tuple[Any, ...], MissingRun]) -> None:
        self.rs = rs
        self.gaps = gaps

    def task(self, run: Run, task: str, with_exp: bool, metric: str) -> float | None:
        value = run.eval_value(task, with_exp, metric)
        if value is None or math.isnan(value):
            variant = "with" if with_exp else "without"
            key = (run.tasks, run.agent, run.seed, task, with_exp, metric)
            self.gaps[key] = MissingRun(
                run.tasks, run.agent, run.seed,
                f"finished, but its final evaluation has no {metric} for {task!r} {variant} "
                "experience", str(run.path))
            return None
        return value

    def average(self, run: Run, tasks: list[str], with_exp: bool, metric: str) -> float | None:
        values = [self.task(run, t, with_exp, metric) for t in tasks]
        if any(v is None for v in values):
            return None
        return sum(values) / len(values)  # type: ignore[arg-type]

    def per_seed(self, mix: str, agent: str, fn: Callable[[Run], float | None]) -> list[float]:
        out = []
        for run in self.rs.select(mix, agent):
            v = fn(run)
            if v is not None:
                out.append(v)
        return out


def _cell(column: str, values: list[float], conf: float, expected_n: int | None,
          paper_value: float | None = None) -> Cell:
    est = mean_ci(values, conf) if values else None
    return Cell(column, est, paper_value, expected_n or None)


def _several(rs: RunSet, mix: str, agents: tuple[str, ...]) -> list[str]:
    """Notes for agents with several configurations on ``mix``: a comparison that needs one row
    per agent is not made for them."""
    return [f"{agent_label(a)} has {len(rs.rows_of(mix, a))} configurations on {mix} "
            f"({'; '.join(rs.label_of(r) for r in rs.rows_of(mix, a))}): no comparison is made "
            "with it here; compare its rows in the tables above."
            for a in agents if len(rs.rows_of(mix, a)) > 1]


def _is_multi(rs: RunSet, mix: str) -> bool:
    return len(mix_task_names(rs, mix)) > 1


# ---------------------------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------------------------

def _single_tables(rs: RunSet, vals: _Values, conf: float) -> list[Table]:
    mixes = [m for m in rs.mixes() if not _is_multi(rs, m)]
    if not mixes:
        return []
    columns: list[str] = []
    column_mix: dict[str, str] = {}
    for m in mixes:
        name = mix_task_names(rs, m)[0]
        if name not in column_mix:
            columns.append(name)
            column_mix[name] = m
    agents = rs.ordered({a: None for m in mixes for a in rs.agents(m)})
    tables = []
    for metric, name, title, unit, digits in (
            ("success_rate", "single_success", "Single-task success rate", "fraction of episodes", 2),
            # the env's own score: partial credit (WebShop's attribute match, the share of
            # SWE tests passing) moves before success does
            ("score", "single_score", "Single-task score", "env score, 0-1", 2),
            ("avg_actions", "single_actions", "Single-task average actions per episode",
             "actions per episode", 1)):
        rows = []
        for agent in agents:
            variants = tuple(dict.fromkeys(v for m in mixes for v in _variants(rs, m, agent)))
            for wx in variants:
                cells = []
                for col in columns:
                    m = column_mix[col]
                    values = vals.per_seed(m, agent, lambda r: vals.task(r, col, wx, metric))
                    cells.append(_cell(col, values, conf, rs.expected_n(m, agent)))
                rows.append(Row(_row_label(rs, agent, wx, variants), cells,
                                rs.agent_of(agent), wx))
        tables.append(Table(name, title, metric, unit, columns, rows, digits=digits, notes=[
            "One run per (env family, agent, seed), trained and evaluated on that family alone; "
            "final evaluation.",
            "The paper gives no single-task table, only relative claims: see single_vs_baseline."]))

    if all(any(rs.expected_n(column_mix[c], r) or rs.select(column_mix[c], r)
               for c in columns for r in rs.rows_of(column_mix[c], a))
           for a in ("grpo", "comp_rl")):
        tables.append(_single_vs_baseline(rs, vals, conf, columns, column_mix))
    return tables


def _single_vs_baseline(rs: RunSet, vals: _Values, conf: float, columns: list[str],
                        column_mix: dict[str, str]) -> Table:
    rows = []
    notes = [n for col in columns for n in _several(rs, column_mix[col], ("grpo", "comp_rl"))]
    for col in columns:
        m = column_mix[col]

        def of(agent: str, wx: bool, metric: str) -> list[float]:
            return vals.per_seed(m, agent, lambda r: vals.task(r, col, wx, metric))

        base_s, comp_s = of("grpo", False, "success_rate"), of("comp_rl", True, "success_rate")
        base_a, comp_a = of("grpo", False, "avg_actions"), of("comp_rl", True, "avg_actions")
        cells = [
            Cell("Success ratio (Comp. RL / Baseline)",
                 ratio_of_means(comp_s, base_s, conf) if comp_s and base_s else None,
                 paper.SINGLE_TASK_SUCCESS_RATIO.get(col), kind="ratio"),
            Cell("Success gain (Comp. RL - Baseline)",
                 diff_ci(comp_s, base_s, conf) if comp_s and base_s else None,
                 paper.SINGLE_TASK_SUCCESS_GAIN.get(col), kind="diff"),
            Cell("Action reduction (Baseline / Comp. RL)",
                 ratio_of_means(base_a, comp_a, conf) if comp_a and base_a else None,
                 paper.SINGLE_TASK_ACTION_REDUCTION.get(col), kind="ratio"),
        ]
        rows.append(Row(col, cells, mix=m))
    return Table("single_vs_baseline", "Single task: Comp. RL (w/ exp) against the baseline",
                 "relative", "ratio (x) or difference in success rate",
                 [c.column for c in rows[0].cells], rows, notes=[
                     "Ratios are ratios of seed means (point estimates, no CI); the gain is a "
                     "difference of independent means with a Welch 95% t-interval.",
                     "Paper: ~1.3x baseline success on MiniHack Room and ALFWorld, +3.0 points "
                     "on SWE-Bench, 1.5x fewer actions on MiniHack and 2x fewer on ALFWorld; "
                     "a 'steady lead' on WebShop with no number.", *notes])


def _mix_table(rs: RunSet, vals: _Values, conf: float, mix: str, agents: list[str], name: str,
               title: str, notes: list[str]) -> Table:
    tasks = mix_task_names(rs, mix)
    columns = [*tasks, AVERAGE]
    rows = []
    for agent in agents:
        variants = _variants(rs, mix, agent)
        for wx in variants:
            cells = []
            for col in columns:
                if col == AVERAGE:
                    values = vals.per_seed(
                        mix, agent, lambda r: vals.average(r, tasks, wx, "success_rate"))
                else:
                    values = vals.per_seed(
                        mix, agent, lambda r: vals.task(r, col, wx, "success_rate"))
                cells.append(_cell(col, values, conf, rs.expected_n(mix, agent),
                                   paper.multi_task_value(mix, rs.agent_of(agent), wx, col)))
            rows.append(Row(_row_label(rs, agent, wx, variants), cells, rs.agent_of(agent),
                            wx, mix))
    return Table(name, title, "success_rate", "fraction of episodes", columns, rows, notes=notes)


def _multi_tables(rs: RunSet, vals: _Values, conf: float) -> list[Table]:
    tables = []
    for mix in rs.mixes():
        if not _is_multi(rs, mix):
            continue
        present = rs.agents(mix)
        bases = {rs.agent_of(a) for a in present}
        if not bases & set(PAPER_AGENTS) and bases & set(ABLATIONS):
            continue  # an ablation-only mix: its table is the ablation table
        others = [a for a in rs.ordered(present)
                  if rs.agent_of(a) not in PAPER_AGENTS and rs.agent_of(a) not in ABLATIONS]
        paper_rows = [r for a in PAPER_AGENTS for r in rs.rows_of(mix, a)]
        # a paper row nobody ran or asked for is named in a note, not shown as a row of
        # "no runs" beside a report that counts nothing missing
        unasked = [r for r in paper_rows if not rs.select(mix, r) and not rs.expected_n(mix, r)]
        agents = [*(r for r in paper_rows if r not in unasked), *others]
        n_tasks = len(mix_task_names(rs, mix))
        notes = ["The paper's layout. Average = per-run mean over the mix's tasks, then mean ± CI "
                 "over seeds.", "A paper row that was expected but has no finished run reads "
                 "'missing'."]
        if unasked:
            notes.append(f"Paper rows not run here (not asked for, so not counted missing; "
                         f"`crl-bench report --suite multi` expects them): "
                         f"{', '.join(agent_label(r) for r in unasked)}.")
        tables.append(_mix_table(
            rs, vals, conf, mix, agents, f"multi_{mix}",
            f"Multi-task success rate, {n_tasks} tasks ({mix})", notes))
    return tables


def _ablation_tables(rs: RunSet, vals: _Values, conf: float) -> list[Table]:
    tables = []
    for mix in rs.mixes():
        present = rs.agents(mix)
        if not any(rs.agent_of(a) in ABLATIONS for a in present):
            continue
        agents = [r for a in ("comp_rl", *ABLATIONS) for r in rs.rows_of(mix, a)]
        tables.append(_mix_table(
            rs, vals, conf, mix, agents, f"ablation_{mix}",
            f"Ablations on {mix}: Comp. RL with one mechanism off",
            ["Each row switches off one mechanism of Comp. RL (the paper reports no numbers for "
             "its ablations)."]))
    return tables


def _task_scaling_table(rs: RunSet, vals: _Values, conf: float) -> list[Table]:
    mixes = [m for m in rs.mixes() if _is_multi(rs, m)
             and all(any(rs.select(m, r) or rs.expected_n(m, r) for r in rs.rows_of(m, a))
                     for a in ("grpo", "comp_rl"))]  # a gain needs both agents
    if not mixes:
        return []
    mixes.sort(key=lambda m: len(mix_task_names(rs, m)))
    several = [n for m in mixes for n in _several(rs, m, ("grpo", "comp_rl"))]
    rows = []
    columns = ["Baseline", "Comp. RL w/ exp", "Gain w/ exp", "Comp. RL w/o exp", "Gain w/o exp"]
    for mix in mixes:
        tasks = mix_task_names(rs, mix)

        def avg(agent: str, wx: bool) -> list[float]:
            return vals.per_seed(mix, agent,
                                 lambda r: vals.average(r, tasks, wx, "success_rate"))

        base, comp_w, comp_wo = avg("grpo", False), avg("comp_rl", True), avg("comp_rl", False)
        n_base, n_comp = rs.expected_n(mix, "grpo"), rs.expected_n(mix, "comp_rl")
        cells = [
            _cell("Baseline", base, conf, n_base, paper.multi_task_value(mix, "grpo", False,
                                                                          AVERAGE)),
            _cell("Comp. RL w/ exp", comp_w, conf, n_comp,
                  paper.multi_task_value(mix, "comp_rl", True, AVERAGE)),
            Cell("Gain w/ exp", diff_ci(comp_w, base, conf) if comp_w and base else None,
                 paper.TASK_SCALING_GAIN.get(mix), min(n_base, n_comp) or None, kind="diff"),
            _cell("Comp. RL w/o exp", comp_wo, conf, n_comp,
                  paper.multi_task_value(mix, "comp_rl", False, AVERAGE)),
            Cell("Gain w/o exp", diff_ci(comp_wo, base, conf) if comp_wo and base else None,
                 None, min(n_base, n_comp) or None, kind="diff"),
        ]
        rows.append(Row(f"{len(tasks)} tasks ({mix})", cells, mix=mix))
    return [Table("task_scaling", "Task scaling: average success over the mix, gain over the "
                  "baseline", "success_rate", "fraction of episodes (gain: difference)", columns,
                  rows, notes=[
                      "Gain = Comp. RL average - Baseline average, a difference of independent "
                      "means with a Welch 95% t-interval.",
                      "Paper gains: +6.6 points (3 tasks), +8.1 points (6 tasks; the paper does "
                      "not name its 6 tasks, our 6mix is our own choice).", *several])]


def build_tables(rs: RunSet, confidence: float = 0.95) -> tuple[list[Table], list[MissingRun]]:
    """All tables the runs support, and the gaps (finished runs lacking a needed evaluation)."""
    gaps: dict[tuple[Any, ...], MissingRun] = {}
    vals = _Values(rs, gaps)
    tables = [*_single_tables(rs, vals, confidence), *_multi_tables(rs, vals, confidence),
              *_ablation_tables(rs, vals, confidence), *_task_scaling_table(rs, vals, confidence)]
    return tables, list(gaps.values())


# ---------------------------------------------------------------------------------------------
# cell formatting (shared by the Markdown writer and the console)
# ---------------------------------------------------------------------------------------------

def _num(x: float, digits: int, signed: bool) -> str:
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def _seeds(n: int, expected: int | None = None) -> str:
    """``3 seeds``, ``1 seed``, ``2/3 seeds`` (n counts seeds, i.e. runs; never episodes)."""
    if expected and n < expected:
        return f"{n}/{expected} seeds"
    return f"{n} seed" + ("" if n == 1 else "s")


def format_cell(cell: Cell, digits: int = 2) -> str:
    """``0.62 ± 0.08 (3 seeds)``, ``+0.07 ± 0.05 (3 seeds)``, ``1.25x (3 seeds)``,
    ``0.40 (1 seed, no CI)``, ``missing (0/3 seeds)``; the paper's value after ``·``."""
    est = cell.estimate
    expected = cell.expected_n if cell.expected_n and cell.n < cell.expected_n else None
    if est is not None and est.n > 0 and math.isnan(est.mean) and cell.kind == "ratio":
        # runs exist, the ratio has no value
        text = f"undefined: denominator 0 ({_seeds(est.n, expected)})"
    elif est is None or est.n == 0 or math.isnan(est.mean):
        # "missing" when the matrix expected runs here; "no runs" when nothing was asked for
        text = f"missing ({_seeds(0, expected)})" if expected else "no runs"
    elif cell.kind == "ratio":
        text = f"{est.mean:.2f}x ({_seeds(est.n, expected)})"
    else:
        signed = cell.kind == "diff"
        text = _num(est.mean, digits, signed)
        if est.has_ci:
            text += f" ± {est.half_width:.{digits}f} ({_seeds(est.n, expected)})"
        else:
            text += f" ({_seeds(est.n, expected)}, no CI)"
    if cell.paper is not None:
        if cell.kind == "ratio":
            text += f" · paper {cell.paper:.1f}x"
        else:
            text += f" · paper {_paper_num(cell.paper, digits, cell.kind == 'diff')}"
    return text


def _paper_num(x: float, digits: int, signed: bool) -> str:
    """The paper's value with as many decimals as it has (0.066 stays 0.066), at least ``digits``."""
    text = _num(x, 3, signed)
    while text.endswith("0") and len(text.split(".")[1]) > digits:
        text = text[:-1]
    return text
