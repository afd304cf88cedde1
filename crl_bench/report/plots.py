"""Plots from run records: curves per agent with 95% t-CI bands over seeds (matplotlib, headless).

One PNG per (plot kind, task mix):

- ``train_success_<mix>.png``: training success rate vs step, overall and per task;
- ``eval_experience_<mix>.png``: evaluation success with vs without experience vs step;
- ``avg_actions_<mix>.png``: average actions per episode vs step;
- ``bank_<mix>.png``: bank size, retrievals per step and retrieval hit rate vs step;
- ``extractor_reward_<mix>.png``: mean extractor reward vs step.

A plot whose metric no run recorded is skipped and the reason returned, so the report can say so.
Figures are built with ``matplotlib.figure.Figure`` and the Agg canvas directly: no pyplot
global state, no display needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from crl_bench.report.runs import Run, RunSet
from crl_bench.report.stats import mean_ci
from crl_bench.report.suites import agent_label as _agent_label

__all__ = ["Plot", "make_plots", "curve_band"]


@dataclass(frozen=True)
class Plot:
    path: Path
    title: str
    mix: str
    kind: str


def curve_band(per_seed: Sequence[dict[int, float]], confidence: float = 0.95
               ) -> tuple[list[int], list[float], list[float], list[float], list[int]]:
    """Mean and CI band over seeds at each step: (steps, mean, low, high, n).

    A step's values are those of the seeds that recorded it; with one seed low = high = NaN
    (no band drawn there).
    """
    steps = sorted({s for series in per_seed for s in series})
    means, lows, highs, ns = [], [], [], []
    for s in steps:
        values = [series[s] for series in per_seed if s in series]
        est = mean_ci(values, confidence)
        means.append(est.mean)
        lows.append(est.low if est.has_ci else math.nan)
        highs.append(est.high if est.has_ci else math.nan)
        ns.append(est.n)
    return steps, means, lows, highs, ns


def _metric_series(run: Run, key: str) -> dict[int, float]:
    out = {}
    for rec in run.metrics:
        value = rec.get(key)
        if value is None or "step" not in rec:
            continue
        try:
            v = float(value)
        except (TypeError, ValueError):
            continue
        if not math.isnan(v):
            out[int(rec["step"])] = v
    return out


def _moving_average(series: dict[int, float], window: int) -> dict[int, float]:
    if window <= 1:
        return series
    steps = sorted(series)
    out = {}
    for i, s in enumerate(steps):
        chunk = [series[t] for t in steps[max(0, i - window + 1): i + 1]]
        out[s] = sum(chunk) / len(chunk)
    return out


def _eval_series(run: Run, tasks: list[str], with_experience: bool) -> dict[int, float]:
    """Per eval step, the mean success over the mix's tasks (steps missing a task are skipped)."""
    by_step: dict[int, dict[str, float]] = {}
    for rec in run.evals:
        if bool(rec.get("with_experience")) != with_experience or rec.get("success_rate") is None:
            continue
        by_step.setdefault(int(rec["step"]), {})[str(rec["task"])] = float(rec["success_rate"])
    return {s: sum(v[t] for t in tasks) / len(tasks)
            for s, v in by_step.items() if all(t in v for t in tasks)}


def _step_axis(ax: Any, last_step: int) -> None:
    """The whole run on the step axis (0 .. its last step), so that a short run's one or two
    points sit where they belong instead of on an axis matplotlib zoomed to +-0.1 around them."""
    last = max(1, last_step)
    ax.set_xlim(-0.04 * last, 1.04 * last)


class _Painter:
    """Shared figure set-up: one colour per agent, consistent across all plots of a report."""

    def __init__(self, agents: list[str], confidence: float) -> None:
        from matplotlib import colormaps

        cmap = colormaps["tab10"]
        self.colors = {a: cmap(i % 10) for i, a in enumerate(agents)}
        self.confidence = confidence

    def figure(self, n_axes: int, title: str) -> tuple[Any, list[Any]]:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        cols = min(n_axes, math.ceil(math.sqrt(n_axes))) if n_axes > 3 else n_axes
        rows = math.ceil(n_axes / cols)
        width = max(8.0, 5.2 * cols)
        fig = Figure(figsize=(width, 3.9 * rows + 0.7), layout="constrained")
        axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
        for ax in axes[n_axes:]:
            ax.set_visible(False)
        for ax in axes[:n_axes]:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
        fig.suptitle(title, fontsize=12)
        return fig, axes[:n_axes]

    def band(self, ax: Any, per_seed: list[dict[int, float]], agent: str, label: str,
             linestyle: str = "-", clip: tuple[float, float] | None = None,
             color: Any = None, shade: bool = True, marker: str = "o") -> bool:
        """Mean curve over seeds and its CI band (clipped to ``clip``, the metric's range)."""
        per_seed = [s for s in per_seed if s]
        if not per_seed:
            return False
        steps, mean, low, high, ns = curve_band(per_seed, self.confidence)
        color = self.colors.get(agent) if color is None else color
        ax.plot(steps, mean, linestyle=linestyle, color=color, linewidth=1.8,
                label=f"{label} ({max(ns)} seed{'s' if max(ns) != 1 else ''})",
                marker=marker if len(steps) <= 12 else None,
                markersize=3.5)
        if shade and any(not math.isnan(x) for x in low):
            if clip is not None:
                low = [x if math.isnan(x) else max(clip[0], x) for x in low]
                high = [x if math.isnan(x) else min(clip[1], x) for x in high]
            ax.fill_between(steps, low, high, color=color, alpha=0.15, linewidth=0)
        return True

    @staticmethod
    def save(fig: Any, path: Path) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        path.parent.mkdir(parents=True, exist_ok=True)
        FigureCanvasAgg(fig)
        fig.savefig(path, dpi=110)


def _smoothing_window(runs: list[Run]) -> int:
    longest = max((len(r.metrics) for r in runs), default=0)
    return max(1, round(longest / 10))


def make_plots(rs: RunSet, out_dir: str | Path, confidence: float = 0.95
               ) -> tuple[list[Plot], list[str]]:
    """Write every plot the finished runs support under ``out_dir``.

    Returns:
        (plots written, reasons for plots skipped).
    """
    from crl_bench.report.suites import VARIANTS

    out = Path(out_dir)
    all_agents = rs.ordered({r.row: None for r in rs.runs})

    def agent_label(row: str) -> str:  # a row: the agent's label, and its group
        label = _agent_label(rs.agent_of(row))
        return f"{label} ({rs.label_of(row)})" if rs.label_of(row) else label

    painter = _Painter(all_agents, confidence)
    pct = int(round(confidence * 100))
    plots: list[Plot] = []
    skipped: list[str] = []
    unit_range = (0.0, 1.0)
    for mix in rs.mixes():
        runs = [r for r in rs.runs if r.tasks == mix]
        if not runs:
            continue
        agents = rs.ordered({r.row: None for r in runs})
        last_step = max(int(r.config.get("steps") or 0) for r in runs)
        tasks = runs[0].task_names
        window = _smoothing_window(runs)
        smooth_note = f", {window}-step moving average" if window > 1 else ""
        band_note = f"lines: mean over seeds{smooth_note}; shaded: {pct}% t-CI"
        eval_note = f"lines: mean over seeds; shaded: {pct}% t-CI"
        step_label = "training step (actor updates)"

        def seeds(agent: str, key: str, smooth: bool = True) -> list[dict[int, float]]:
            return [_moving_average(_metric_series(r, key), window if smooth else 1)
                    for r in runs if r.row == agent]

        def save(fig: Any, kind: str, title: str) -> None:
            path = out / f"{kind}_{mix}.png"
            painter.save(fig, path)
            plots.append(Plot(path, title, mix, kind))

        # 1. training success, overall and per task
        keys = [("charts/success_rate", "all tasks" if len(tasks) > 1 else tasks[0])]
        if len(tasks) > 1:
            keys += [(f"charts/success_rate/{t}", t) for t in tasks]
        fig, axes = painter.figure(len(keys), f"Training success rate, {mix}\n({band_note})")
        drew = False
        for ax, (key, name) in zip(axes, keys):
            for agent in agents:
                drew |= painter.band(ax, seeds(agent, key), agent, agent_label(agent),
                                     clip=unit_range)
            ax.set_title(name)
            ax.set_xlabel(step_label)
            _step_axis(ax, last_step)
            ax.set_ylabel("success rate (fraction of episodes)")
            ax.set_ylim(-0.02, 1.02)
        if drew:
            axes[0].legend(fontsize=8)
            save(fig, "train_success", "Training success rate")
        else:
            skipped.append(f"train_success_{mix}: no run recorded charts/success_rate")

        # 2. evaluation with vs without experience: one panel per agent that uses a bank, the
        # baseline drawn in each panel as the reference
        bank_agents = [a for a in agents
                       if True in VARIANTS.get(rs.agent_of(a), (True,))
                       and False in VARIANTS.get(rs.agent_of(a), (False,))
                       and any(r.row == a and any(e.get("with_experience") for e in r.evals)
                               for r in runs)]
        if bank_agents:
            fig, axes = painter.figure(len(bank_agents), "Evaluation success with (solid) vs "
                                       f"without (dashed) experience, {mix}\n({eval_note})")
            baseline = [_eval_series(r, tasks, False) for r in runs if r.row == "grpo"]
            for ax, agent in zip(axes, bank_agents):
                for wx, style in ((True, "-"), (False, "--")):
                    per_seed = [_eval_series(r, tasks, wx) for r in runs if r.row == agent]
                    painter.band(ax, per_seed, agent, "w/ exp" if wx else "w/o exp", style,
                                 clip=unit_range, marker="o" if wx else "s")
                if any(baseline):
                    painter.band(ax, baseline, "grpo", "Baseline", ":", color="0.45",
                                 shade=False, marker=".")
                ax.set_title(agent_label(agent))
                ax.set_xlabel("training step at evaluation")
                _step_axis(ax, last_step)
                ax.set_ylabel("success rate, mean over tasks (fraction)")
                ax.set_ylim(-0.02, 1.02)
                ax.legend(fontsize=8)
            save(fig, "eval_experience", "Evaluation with vs without experience")
        else:
            skipped.append(f"eval_experience_{mix}: no run evaluated both with and without "
                           "experience")

        # 3. average actions
        fig, axes = painter.figure(1, f"Average actions per episode (training), {mix}\n"
                                      f"({band_note})")
        ax = axes[0]
        drew = False
        for agent in agents:
            drew |= painter.band(ax, seeds(agent, "charts/avg_actions"), agent,
                                 agent_label(agent), clip=(0.0, math.inf))
        ax.set_xlabel(step_label)
        _step_axis(ax, last_step)
        ax.set_ylabel("actions per episode")
        if drew:
            ax.legend(fontsize=8)
            save(fig, "avg_actions", "Average actions per episode")
        else:
            skipped.append(f"avg_actions_{mix}: no run recorded charts/avg_actions")

        # 4. bank size and retrieval statistics
        bank_keys = [("bank/size", "bank size", "entries", (0.0, math.inf)),
                     ("bank/retrievals", "retrievals per step", "retrievals per step",
                      (0.0, math.inf)),
                     ("bank/hit_rate", "retrieval hit rate", "fraction of queries with a hit",
                      unit_range)]
        with_bank = [a for a in agents
                     if any(_metric_series(r, "bank/size") for r in runs if r.row == a)]
        if with_bank:
            fig, axes = painter.figure(3, f"Experience bank over training, {mix}\n({band_note}; "
                                          "bank size not averaged over steps)")
            for ax, (key, name, unit, clip) in zip(axes, bank_keys):
                for agent in with_bank:
                    painter.band(ax, seeds(agent, key, smooth=key != "bank/size"), agent,
                                 agent_label(agent), clip=clip)
                ax.set_title(name)
                ax.set_xlabel(step_label)
                _step_axis(ax, last_step)
                ax.set_ylabel(unit)
            axes[0].legend(fontsize=8)
            save(fig, "bank", "Experience bank size and retrieval")
        else:
            skipped.append(f"bank_{mix}: no run recorded bank/size (no agent with a bank)")

        # 5. extractor reward
        fig, axes = painter.figure(1, f"Experience extractor reward, {mix}\n({band_note})")
        ax = axes[0]
        drew = False
        for agent in agents:
            drew |= painter.band(ax, seeds(agent, "extractor/reward_mean"), agent,
                                 agent_label(agent), clip=(-1.0, 1.0))
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set_xlabel(step_label)
        _step_axis(ax, last_step)
        ax.set_ylabel("mean extractor reward (in [-1, 1])")
        ax.set_ylim(-1.05, 1.05)
        if drew:
            ax.legend(fontsize=8)
            save(fig, "extractor_reward", "Extractor reward")
        else:
            skipped.append(f"extractor_reward_{mix}: no run recorded extractor/reward_mean "
                           "(no agent with an extractor)")
    return plots, skipped
