"""``write_report``: run directories in, ``report.md`` + ``report.json`` + CSVs + PNGs out.

Output folder layout::

    OUT/report.md            every table (mean ± 95% CI (n), paper value beside), missing runs,
                             plots embedded
    OUT/report.json          the same, machine-readable: runs, missing, tables (values per seed)
    OUT/tables/<name>.csv    one long-format CSV per table (a line per cell)
    OUT/missing_runs.csv     every expected run that contributes nothing, and why
    OUT/plots/*.png          see ``crl_bench.report.plots``
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from crl_bench.report.paper import PAPER_REF
from crl_bench.report.plots import Plot, make_plots
from crl_bench.report.runs import MissingRun, RunSet, load_runs
from crl_bench.report.tables import Table, build_tables, format_cell

__all__ = ["ReportResult", "write_report", "tables_to_markdown", "table_to_csv_rows",
           "CSV_FIELDS"]

CSV_FIELDS = ["table", "row", "agent", "with_experience", "mix", "column", "kind", "mean",
              "ci_low", "ci_high", "half_width", "n", "expected_n", "confidence", "paper",
              "values"]


@dataclass
class ReportResult:
    """What ``write_report`` wrote and found."""

    out_dir: Path
    markdown: Path
    json: Path
    csvs: list[Path]
    plots: list[Plot]
    tables: list[Table]
    missing: list[MissingRun]
    skipped_plots: list[str] = field(default_factory=list)
    n_runs: int = 0
    groups: list[Any] = field(default_factory=list)
    """The rows: one per (tasks, agent, configuration), :class:`crl_bench.report.runs.RunGroup`."""
    notes: list[str] = field(default_factory=list)


def _f(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def _cell_dict(table: Table, row: Any, cell: Any) -> dict[str, Any]:
    est = cell.estimate
    return {
        "table": table.name, "row": row.label, "agent": row.agent,
        "with_experience": row.with_experience, "mix": row.mix, "column": cell.column,
        "kind": cell.kind,
        "mean": _f(est.mean) if est else None,
        "ci_low": _f(est.low) if est else None,
        "ci_high": _f(est.high) if est else None,
        "half_width": _f(est.half_width) if est else None,
        "n": cell.n, "expected_n": cell.expected_n,
        "confidence": est.confidence if est else None,
        "paper": cell.paper,
        "values": list(est.values) if est and cell.kind == "mean" else None,
    }


def table_to_csv_rows(table: Table) -> list[dict[str, Any]]:
    """One dict per cell with :data:`CSV_FIELDS` (values joined by ';')."""
    rows = []
    for row in table.rows:
        for cell in row.cells:
            d = _cell_dict(table, row, cell)
            d["values"] = ";".join(f"{v:.6g}" for v in d["values"]) if d["values"] else ""
            rows.append({k: ("" if d[k] is None else d[k]) for k in CSV_FIELDS})
    return rows


def _model_name(config: dict[str, Any]) -> str:
    """The actor (and extractor) model of a run; ``config["model"]`` is a dict or a name."""
    model = config.get("model", "?")
    if isinstance(model, dict):
        actor = str(model.get("actor", "?"))
        extractor = model.get("extractor")
        return f"{actor} + extractor {extractor}" if extractor else actor
    return str(model)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def tables_to_markdown(tables: Iterable[Table]) -> str:
    parts = []
    for t in tables:
        parts.append(f"### {t.title}\n")
        parts.append(f"`{t.name}` — {t.metric} ({t.unit}).\n")
        header = "| | " + " | ".join(_md_escape(c) for c in t.columns) + " |"
        parts.append(header)
        parts.append("|" + "---|" * (len(t.columns) + 1))
        for row in t.rows:
            cells = [format_cell(c, t.digits) for c in row.cells]
            parts.append(f"| {_md_escape(row.label)} | " + " | ".join(cells) + " |")
        parts.append("")
        for note in t.notes:
            parts.append(f"- {note}")
        parts.append("")
    return "\n".join(parts)


def _missing_markdown(missing: list[MissingRun]) -> str:
    if not missing:
        return "None: every expected run finished and has its final evaluation.\n"
    lines = ["| mix | agent | seed | reason | path |", "|---|---|---|---|---|"]
    for m in missing:
        seed = "" if m.seed is None else str(m.seed)
        lines.append(f"| {m.tasks} | {m.agent} | {seed} | {_md_escape(m.reason)} | "
                     f"{m.path or ''} |")
    return "\n".join(lines) + "\n"


def _show(v: Any, fmt: str = "{}") -> str:
    return "-" if v is None else fmt.format(v)


NOT_A_RESULT_PRESETS = ("tiny", "quick")
"""Presets whose runs are a look at the pipeline (a tiny or briefly trained model, a handful of
episodes): a report of them says so before any number."""


def _not_a_result(presets: list[str]) -> str:
    small = [p for p in presets if p in NOT_A_RESULT_PRESETS]
    if not small:
        return ""
    return (f"**Not a result.** These runs use the {', '.join(f'`{p}`' for p in small)} "
            "preset: a small model trained for a few steps and evaluated on a handful of "
            "episodes, to show the pipeline end to end. Their numbers say nothing about the "
            "agents, and the paper's values beside them are not comparable (they come from the "
            "`paper` preset's 7B model after 512 steps).\n")


def _groups_markdown(groups: list[Any]) -> str:
    """The agents whose runs come in several configurations, and how they differ."""
    several = [g for g in groups if g.label]
    if not several:
        return ""
    lines = ["## Configurations\n",
             "Runs of one mix and agent whose settings differ (in anything but the seed) are "
             "separate rows, named by the settings that tell them apart; every setting in which "
             "they differ:\n", "| mix | row | seeds | runs | differing settings |",
             "|---|---|---|---|---|"]
    for g in several:
        diff = "; ".join(f"`{k}`={v!r}" for k, v in g.differs.items())
        lines.append(f"| {g.tasks} | {_md_escape(g.row)} | "
                     f"{', '.join(map(str, g.seeds)) or '-'} | {g.runs} | {_md_escape(diff)} |")
    return "\n".join(lines) + "\n"


def _runs_markdown(runs: list[Any], facts: list[dict[str, Any]]) -> str:
    if not runs:
        return "None.\n"
    lines = ["| mix | agent | seed | preset | steps | training episodes | eval episodes per mode "
             "| time (min) | actor wait | bank lag (steps) | bank entries | path |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r, f in zip(runs, facts):
        lines.append(f"| {r.tasks} | {_md_escape(r.row)} | {r.seed} | "
                     f"{r.config.get('preset', '?')} | "
                     f"{_show(f['steps'])} | {f['train_episodes']} | {_show(f['eval_episodes'])} | "
                     f"{_show(f['time_min'], '{:.0f}')} | {_show(f['actor_wait'], '{:.0%}')} | "
                     f"{_show(f['bank_lag_max'])} | {_show(f['bank_size'])} | {r.path} |")
    return ("\n".join(lines) + "\n\nTime: the training steps and the timed evaluations as the "
            "run recorded them (`timing_s/`), on whatever machine ran it. Actor wait: the share "
            "of the training steps' time the actor loop waited on the extractor (for the model, "
            "and for pending bank writes before a rollout). Bank lag: the most steps the bank was "
            "behind at a training rollout's start (0: it held every earlier step's entries) — an "
            "extractor that falls behind shows here, not in the wait.\n")


def write_report(run_dirs: Iterable[str | Path], out_dir: str | Path, *,
                 expected: Iterable[tuple[str, str, int]] | None = None,
                 plots: bool = True, confidence: float = 0.95,
                 title: str = "crl-bench report", notes: Iterable[str] = ()) -> ReportResult:
    """Build every table and plot from the runs under ``run_dirs`` and write them to ``out_dir``.

    Args:
        run_dirs: run directories, or folders containing them.
        out_dir: output folder (created).
        expected: ``(tasks, agent, seed)`` triples the report must cover; those without a
            finished run are listed as missing. None: inferred from the runs found.
        plots: also write the PNGs.
        confidence: CI coverage (0.95).
        title: the report's heading.
        notes: extra lines for the report (e.g. runs that raised during ``reproduce``).
    """
    rs: RunSet = load_runs(run_dirs, expected)
    rs.notes.extend(notes)
    tables, gaps = build_tables(rs, confidence)
    missing = [*rs.missing, *gaps]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    plot_list: list[Plot] = []
    skipped: list[str] = []
    if plots:
        plot_list, skipped = make_plots(rs, out / "plots", confidence)

    csvs = []
    (out / "tables").mkdir(exist_ok=True)
    for t in tables:
        path = out / "tables" / f"{t.name}.csv"
        with open(path, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
            w.writeheader()
            w.writerows(table_to_csv_rows(t))
        csvs.append(path)
    missing_csv = out / "missing_runs.csv"
    with open(missing_csv, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["tasks", "agent", "seed", "reason", "path"])
        w.writeheader()
        for m in missing:
            w.writerow({k: ("" if v is None else v) for k, v in m.as_dict().items()})
    csvs.append(missing_csv)

    facts = [r.facts() for r in rs.runs]
    pct = int(round(confidence * 100))
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    presets = sorted({str(r.config.get("preset", "?")) for r in rs.runs})
    models = sorted({_model_name(r.config) for r in rs.runs})
    md = [f"# {title}\n",
          f"Generated {generated} by `crl-bench report` from {len(rs.runs)} finished run(s); "
          f"preset(s): {', '.join(presets) or '-'}; model(s): {', '.join(models) or '-'}.\n",
          _not_a_result(presets),
          f"Every cell: mean ± half-width of the two-sided {pct}% Student-t interval over seeds "
          f"(`3 seeds`: three runs, one per seed; `2/3 seeds`: one expected seed is missing; one "
          f"seed has no interval), each run's value being its final evaluation's rate over its "
          f"held-out episodes. `paper` is the value reported by {PAPER_REF}, where it reports "
          f"one.\n",
          f"{len(rs.runs)} finished run(s) in {len(rs.groups)} row(s) of (mix, agent, "
          f"configuration).\n",
          f"## Missing or unfinished runs ({len(missing)})\n", _missing_markdown(missing),
          _groups_markdown(rs.groups),
          f"## Runs ({len(rs.runs)})\n", _runs_markdown(rs.runs, facts)]
    if rs.notes:
        md.append("Notes:\n\n" + "\n".join(f"- {n}" for n in rs.notes) + "\n")
    md.append("## Tables\n")
    md.append(tables_to_markdown(tables) if tables else "No table: no finished run.\n")
    if plots:
        md.append("## Plots\n")
        for p in plot_list:
            md.append(f"### {p.title} — {p.mix}\n\n![{p.title}, {p.mix}]"
                      f"({p.path.relative_to(out).as_posix()})\n")
        for s in skipped:
            md.append(f"- skipped {s}")
        md.append("")
    md_path = out / "report.md"
    md_path.write_text("\n".join(md))

    doc = {
        "title": title, "generated": generated, "confidence": confidence,
        "paper": PAPER_REF,
        "groups": [g.as_dict() for g in rs.groups],
        "runs": [{"path": str(r.path), "tasks": r.tasks, "agent": r.agent, "row": r.row,
                  "group": r.group, "seed": r.seed,
                  "state": r.state, "step": r.status.get("step"),
                  "preset": r.config.get("preset"), "model": r.config.get("model"), **f}
                 for r, f in zip(rs.runs, facts)],
        "expected": [{"tasks": t, "agent": a, "seeds": s} for (t, a), s in rs.expected.items()],
        "missing": [m.as_dict() for m in missing],
        "notes": rs.notes,
        "tables": [{"name": t.name, "title": t.title, "metric": t.metric, "unit": t.unit,
                    "columns": t.columns, "notes": t.notes,
                    "rows": [{"label": row.label, "agent": row.agent,
                              "with_experience": row.with_experience, "mix": row.mix,
                              "cells": [_cell_dict(t, row, c) for c in row.cells]}
                             for row in t.rows]}
                   for t in tables],
        "plots": [{"path": p.path.relative_to(out).as_posix(), "title": p.title, "mix": p.mix,
                   "kind": p.kind} for p in plot_list],
        "skipped_plots": skipped,
    }
    json_path = out / "report.json"
    json_path.write_text(json.dumps(doc, indent=2, allow_nan=False))
    return ReportResult(out, md_path, json_path, csvs, plot_list, tables, missing, skipped,
                        len(rs.runs), rs.groups, rs.notes)
