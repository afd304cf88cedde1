"""`crl-bench report` / `reproduce` on run directories in the runner's format.

Most run directories come from ``tests/_report_fixture_writer.py`` (synthetic numbers in the exact
record format: a 3mix/6mix matrix with holes cannot be played on 2 cores);
``test_report_on_real_tiny_runs`` reports on real ``tiny`` runs (conftest.tiny_run).
Every expected number is recomputed in the test from the files (with scipy), never hard-coded.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from crl_bench.cli import main as cli_main
from crl_bench.mixes import BUILTIN_MIXES
from crl_bench.runner.reproduce import reproduce
from crl_bench.report.runs import load_runs
from crl_bench.report.stats import diff_ci, mean_ci
from crl_bench.report.suites import SUITES, plan_suite, run_dir_name
from crl_bench.report.writer import CSV_FIELDS, write_report
from _report_fixture_writer import write_fixture_run

SEEDS = 3


def task_names(mix: str) -> list[str]:
    return [t.name for t in BUILTIN_MIXES[mix]]


def write(root: Path, mix: str, agent: str, seed: int, **kw) -> Path:
    return write_fixture_run(root / run_dir_name(mix, agent, seed), agent=agent, tasks=mix,
                             task_names=task_names(mix), seed=seed, **kw)


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory) -> Path:
    """A matrix with holes: static_exp seed 2 never ran, exp_only seed 1 failed."""
    root = tmp_path_factory.mktemp("runs")
    for agent in ("grpo", "comp_rl"):
        for seed in range(SEEDS):
            write(root, "minihack", agent, seed)
            write(root, "6mix", agent, seed, steps=4, eval_every=2)
    for agent in ("grpo", "static_exp", "exp_only", "comp_rl", "comp_rl_no_split"):
        for seed in range(SEEDS):
            if (agent, seed) == ("static_exp", 2):
                continue
            failed = (agent, seed) == ("exp_only", 1)
            write(root, "3mix", agent, seed, state="failed" if failed else "done",
                  error="RuntimeError: out of memory" if failed else None)
    return root


@pytest.fixture(scope="module")
def report(runs_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    result = write_report([runs_root], out, plots=False)
    return result, json.loads((out / "report.json").read_text()), out


def final_eval_values(root: Path, mix: str, agent: str, task: str, with_exp: bool,
                      metric: str = "success_rate") -> list[float]:
    """Read each finished seed's final evaluation straight from eval.jsonl."""
    values = []
    for seed in range(SEEDS):
        d = root / run_dir_name(mix, agent, seed)
        if not d.exists() or json.loads((d / "status.json").read_text())["state"] != "done":
            continue
        recs = [json.loads(line) for line in (d / "eval.jsonl").read_text().splitlines()]
        last = max(r["step"] for r in recs)
        (rec,) = [r for r in recs if r["step"] == last and r["task"] == task
                  and r["with_experience"] == with_exp]
        values.append(rec[metric])
    return values


def table(doc: dict, name: str) -> dict:
    (t,) = [t for t in doc["tables"] if t["name"] == name]
    return t


def cell(t: dict, row: str, column: str) -> dict:
    (r,) = [r for r in t["rows"] if r["label"] == row]
    (c,) = [c for c in r["cells"] if c["column"] == column]
    return c


# ---------------------------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=2, max_size=10), st.sampled_from([0.9, 0.95, 0.99]))
def test_mean_ci_equals_scipy_t_interval(values, confidence):
    est = mean_ci(values, confidence)
    if max(values) - min(values) < 1e-12:
        assert est.half_width == pytest.approx(0.0, abs=1e-12)
        return
    lo, hi = stats.t.interval(confidence, len(values) - 1, loc=sum(values) / len(values),
                              scale=stats.sem(values))
    assert est.low == pytest.approx(lo, abs=1e-9) and est.high == pytest.approx(hi, abs=1e-9)
    assert est.n == len(values)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=2, max_size=8),
       st.lists(st.floats(0, 1), min_size=2, max_size=8))
def test_diff_ci_equals_scipy_welch_interval(a, b):
    est = diff_ci(a, b)
    mean_diff = sum(a) / len(a) - sum(b) / len(b)
    assert est.mean == pytest.approx(mean_diff, abs=1e-12)
    const_a, const_b = len(set(a)) == 1, len(set(b)) == 1
    if const_a and const_b:  # no spread at all: a zero-width interval (up to float rounding of
        assert est.half_width == pytest.approx(0.0, abs=1e-12)  # the variance of equal values)
    elif const_a or const_b:  # all the variance is the other side's: Welch df = n_other - 1
        other = b if const_a else a
        half = float(stats.t.ppf(0.975, len(other) - 1) * stats.sem(other))
        assert est.half_width == pytest.approx(half, rel=1e-6, abs=1e-300)
    else:
        ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
        if math.isfinite(ci.low) and math.isfinite(ci.high):
            assert est.low == pytest.approx(ci.low, abs=1e-8)
            assert est.high == pytest.approx(ci.high, abs=1e-8)
        else:  # scipy's df underflows on variances near 1e-300; ours must stay finite
            assert math.isfinite(est.half_width) and est.half_width >= 0


def test_diff_ci_survives_tiny_variances():
    # found by hypothesis: squaring a 1e-309 variance underflowed the Welch df to 0 / 0
    est = diff_ci([0.0, 0.0], [0.0, 1.0698469999063331e-154])
    assert math.isfinite(est.half_width) and est.half_width >= 0


def test_single_value_and_empty_have_no_interval():
    assert math.isnan(mean_ci([0.5]).half_width) and mean_ci([0.5]).mean == 0.5
    assert mean_ci([]).n == 0
    with pytest.raises(ValueError, match="report them as missing"):
        mean_ci([0.1, float("nan")])


# ---------------------------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------------------------

def test_tables_have_the_papers_rows_and_columns(report):
    _, doc, _ = report
    names = [t["name"] for t in doc["tables"]]
    assert names == ["single_success", "single_score", "single_actions", "single_vs_baseline", "multi_3mix",
                     "multi_6mix", "ablation_3mix", "task_scaling"]

    multi = table(doc, "multi_3mix")
    assert multi["columns"] == ["MiniHack Room", "WebShop", "ALFWorld", "Average"]
    assert [r["label"] for r in multi["rows"]] == [
        "Baseline", "Static Online Exp. w/ exp", "Static Online Exp. w/o exp", "Exp. Only",
        "Comp. RL w/ exp", "Comp. RL w/o exp"]
    # the paper's value sits beside ours
    assert cell(multi, "Baseline", "Average")["paper"] == 0.75
    assert cell(multi, "Comp. RL w/o exp", "ALFWorld")["paper"] == 0.74
    assert cell(table(doc, "multi_6mix"), "Baseline", "WebShop")["paper"] is None

    single = table(doc, "single_success")
    assert single["columns"] == ["MiniHack Room"]
    assert [r["label"] for r in single["rows"]] == ["Baseline", "Comp. RL w/ exp",
                                                    "Comp. RL w/o exp"]
    assert table(doc, "single_actions")["rows"][0]["cells"][0]["n"] == SEEDS

    ablation = table(doc, "ablation_3mix")
    labels = [r["label"] for r in ablation["rows"]]
    assert labels[:4] == ["Comp. RL w/ exp", "Comp. RL w/o exp",
                          "Comp. RL, no split advantages w/ exp",
                          "Comp. RL, no split advantages w/o exp"]
    assert len(labels) == 14  # comp_rl + 6 ablations, each w/ and w/o experience

    scaling = table(doc, "task_scaling")
    assert [r["label"] for r in scaling["rows"]] == ["3 tasks (3mix)", "6 tasks (6mix)"]
    assert cell(scaling, "3 tasks (3mix)", "Gain w/ exp")["paper"] == 0.066


def test_cell_ci_equals_scipy_t_interval_on_the_run_values(report, runs_root):
    _, doc, _ = report
    values = final_eval_values(runs_root, "3mix", "comp_rl", "WebShop", True)
    assert len(values) == SEEDS
    c = cell(table(doc, "multi_3mix"), "Comp. RL w/ exp", "WebShop")
    mean = sum(values) / len(values)
    lo, hi = stats.t.interval(0.95, len(values) - 1, loc=mean, scale=stats.sem(values))
    assert c["values"] == values
    assert c["mean"] == pytest.approx(mean)
    assert c["ci_low"] == pytest.approx(lo) and c["ci_high"] == pytest.approx(hi)
    assert c["n"] == SEEDS and c["expected_n"] == SEEDS

    actions = final_eval_values(runs_root, "minihack", "grpo", "MiniHack Room", False,
                                "avg_actions")
    c = cell(table(doc, "single_actions"), "Baseline", "MiniHack Room")
    lo, hi = stats.t.interval(0.95, SEEDS - 1, loc=sum(actions) / SEEDS, scale=stats.sem(actions))
    assert c["ci_low"] == pytest.approx(lo) and c["ci_high"] == pytest.approx(hi)

    scores = final_eval_values(runs_root, "minihack", "comp_rl", "MiniHack Room", True, "score")
    c = cell(table(doc, "single_score"), "Comp. RL w/ exp", "MiniHack Room")
    assert c["values"] == scores and c["n"] == SEEDS


def test_average_is_the_per_run_task_mean_and_gain_is_welch(report, runs_root):
    _, doc, _ = report
    tasks = task_names("3mix")
    per_task = [final_eval_values(runs_root, "3mix", "grpo", t, False) for t in tasks]
    base = [sum(v) / len(v) for v in zip(*per_task)]
    c = cell(table(doc, "multi_3mix"), "Baseline", "Average")
    assert c["values"] == pytest.approx(base)
    per_task = [final_eval_values(runs_root, "3mix", "comp_rl", t, True) for t in tasks]
    comp = [sum(v) / len(v) for v in zip(*per_task)]
    gain = cell(table(doc, "task_scaling"), "3 tasks (3mix)", "Gain w/ exp")
    ci = stats.ttest_ind(comp, base, equal_var=False).confidence_interval(0.95)
    assert gain["mean"] == pytest.approx(sum(comp) / 3 - sum(base) / 3)
    assert gain["ci_low"] == pytest.approx(ci.low) and gain["ci_high"] == pytest.approx(ci.high)


def test_missing_and_failed_runs_are_reported_not_dropped(report):
    result, doc, out = report
    missing = {(m["tasks"], m["agent"], m["seed"]): m["reason"] for m in doc["missing"]}
    assert missing[("3mix", "static_exp", 2)] == "no run directory found"
    assert missing[("3mix", "exp_only", 1)].startswith("state=failed")
    assert "out of memory" in missing[("3mix", "exp_only", 1)]
    assert len(missing) == 2
    c = cell(table(doc, "multi_3mix"), "Static Online Exp. w/ exp", "WebShop")
    assert c["n"] == 2 and c["expected_n"] == SEEDS
    md = (out / "report.md").read_text()
    assert "## Missing or unfinished runs (2)" in md
    assert "(2/3 seeds)" in md and "no run directory found" in md
    with open(out / "missing_runs.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 2


def test_a_finished_run_lacking_an_evaluation_is_a_gap(tmp_path):
    for seed in range(2):
        d = write(tmp_path, "3mix", "grpo", seed)
    lines = (d / "eval.jsonl").read_text().splitlines()
    kept = [line for line in lines if json.loads(line)["task"] != "ALFWorld"]
    (d / "eval.jsonl").write_text("\n".join(kept) + "\n")
    result = write_report([tmp_path], tmp_path / "out", plots=False)
    gaps = [m for m in result.missing if m.seed == 1]
    assert gaps and "'ALFWorld'" in gaps[0].reason
    doc = json.loads(result.json.read_text())
    assert cell(table(doc, "multi_3mix"), "Baseline", "ALFWorld")["n"] == 1
    assert cell(table(doc, "multi_3mix"), "Baseline", "Average")["n"] == 1


def test_csv_has_a_line_per_cell(report):
    result, doc, out = report
    for t in doc["tables"]:
        with open(out / "tables" / f"{t['name']}.csv") as fh:
            reader = csv.DictReader(fh)
            rows = list(reader)
        assert reader.fieldnames == CSV_FIELDS
        assert len(rows) == len(t["rows"]) * len(t["columns"])
    with open(out / "tables" / "multi_3mix.csv") as fh:
        row = [r for r in csv.DictReader(fh)
               if r["row"] == "Baseline" and r["column"] == "Average"][0]
    assert row["paper"] == "0.75" and row["n"] == "3" and len(row["values"].split(";")) == 3


def test_inferred_expectation_and_explicit_suite(runs_root):
    rs = load_runs([runs_root])
    assert rs.expected[("3mix", "static_exp")] == [0, 1, 2]
    rs = load_runs([runs_root], expected=[(p.tasks, p.agent, p.seed)
                                          for p in plan_suite("ablation", SEEDS)])
    never_run = [m for m in rs.missing if m.agent == "comp_rl_no_merge"]
    assert len(never_run) == SEEDS


# ---------------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------------

def test_plots_exist_and_are_not_blank(runs_root, tmp_path):
    import matplotlib.image as mpimg

    result = write_report([runs_root / run_dir_name("3mix", a, s)
                           for a in ("grpo", "comp_rl") for s in range(SEEDS)],
                          tmp_path, plots=True)
    kinds = {p.kind for p in result.plots}
    assert kinds == {"train_success", "eval_experience", "avg_actions", "bank",
                     "extractor_reward"}
    for p in result.plots:
        assert p.path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert p.path.stat().st_size > 10_000
        img = mpimg.imread(p.path)
        assert img.shape[0] > 300 and img.shape[1] > 600
        assert float(img[..., :3].std()) > 0.05  # not a blank canvas
    md = (tmp_path / "report.md").read_text()
    assert "![Training success rate, 3mix](plots/train_success_3mix.png)" in md


def test_plots_skip_with_a_reason_when_nothing_recorded(tmp_path):
    for seed in range(2):
        write(tmp_path / "runs", "minihack", "grpo", seed)
    result = write_report([tmp_path / "runs"], tmp_path / "out", plots=True)
    assert {p.kind for p in result.plots} == {"train_success", "avg_actions"}
    assert any(s.startswith("bank_minihack") for s in result.skipped_plots)
    assert "skipped bank_minihack" in result.markdown.read_text()


# ---------------------------------------------------------------------------------------------
# CLI and reproduce
# ---------------------------------------------------------------------------------------------

def test_report_cli(runs_root, tmp_path, capsys):
    assert cli_main(["report", str(runs_root), "--out", str(tmp_path), "--no-plots"]) == 0
    assert "2 missing/incomplete" in capsys.readouterr().out
    assert (tmp_path / "report.md").exists() and (tmp_path / "tables" / "multi_3mix.csv").exists()
    assert cli_main(["report", str(runs_root), "--out", str(tmp_path / "s"), "--no-plots",
                     "--suite", "multi", "--seeds", "3"]) == 0
    doc = json.loads((tmp_path / "s" / "report.json").read_text())
    assert len(doc["missing"]) == 2  # 6mix grpo/comp_rl x 3 seeds are all there
    assert cli_main(["report", str(tmp_path / "nowhere"), "--out", str(tmp_path)]) == 2


def test_report_cli_module_imports_nothing_heavy():
    code = ("import sys, crl_bench.report.cli; "
            "heavy = [m for m in ('matplotlib', 'scipy', 'pandas', 'torch') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_plan_suite():
    assert len(plan_suite("single", 2)) == 2 * 4 * 2
    assert len(plan_suite("multi", 1)) == 4 + 2
    assert len(plan_suite("ablation", 1)) == 7
    assert len(plan_suite("all", 1)) == 8 + 6 + 6  # comp_rl on 3mix is shared
    assert {p.tasks for p in plan_suite("single", 1, ["minihack"])} == {"minihack"}
    with pytest.raises(ValueError, match="its task mixes are"):
        plan_suite("ablation", 1, ["minihack"])
    with pytest.raises(ValueError, match="Available: single, multi, ablation, all"):
        plan_suite("everything", 1)
    assert set(SUITES) == {"single", "multi", "ablation"}


def fixture_runner(calls: list, fail: set | None = None):
    """A run_fn for ``reproduce`` that writes fixture runs (stands in for the real runner)."""
    def run(*, agent, tasks, preset, seed, out_dir, steps, overrides, resume):
        calls.append((tasks, agent, seed, preset, steps, overrides, resume))
        if fail and (tasks, agent, seed) in fail:
            raise RuntimeError("env data not found")
        return write_fixture_run(Path(out_dir), agent=agent, tasks=tasks,
                                 task_names=task_names(tasks), seed=seed, steps=steps or 4,
                                 eval_every=2)
    return run


def test_reproduce_runs_the_matrix_then_resumes(tmp_path):
    calls: list = []
    fail = {("3mix", "exp_only", 1)}
    result = reproduce("multi", "tiny", 2, tmp_path, steps=4, tasks=["3mix"],
                       overrides={"rollout.groups": 1}, plots=False,
                       run_fn=fixture_runner(calls, fail), log=lambda m: None)
    assert len(calls) == 8
    assert calls[0][3:] == ("tiny", 4, {"rollout.groups": 1}, True)
    assert [(m.tasks, m.agent, m.seed) for m in result.missing] == [("3mix", "exp_only", 1)]
    md = result.markdown.read_text()
    assert "3mix__exp_only__seed1 raised RuntimeError: env data not found" in md

    # a second call only (re)starts what is not done: the failed cell, and one left "running"
    status = tmp_path / "runs" / run_dir_name("3mix", "grpo", 0) / "status.json"
    status.write_text(json.dumps({"state": "running", "step": 2}))
    calls.clear()
    result = reproduce("multi", "tiny", 2, tmp_path, steps=4, tasks=["3mix"], plots=False,
                       run_fn=fixture_runner(calls), log=lambda m: None)
    assert sorted((c[0], c[1], c[2]) for c in calls) == [("3mix", "exp_only", 1),
                                                          ("3mix", "grpo", 0)]
    assert result.missing == [] and result.n_runs == 8


def process_runner(*, agent, tasks, preset, seed, out_dir, steps, overrides, resume):
    """A picklable run_fn for ``reproduce(jobs=2)``: writes a fixture run and the worker's pid;
    fails for exp_only."""
    import os

    if agent == "exp_only":
        raise RuntimeError("no data for this cell")
    path = write_fixture_run(Path(out_dir), agent=agent, tasks=tasks, task_names=task_names(tasks),
                             seed=seed, steps=steps or 4, eval_every=2)
    (Path(out_dir) / "pid.txt").write_text(str(os.getpid()))
    return path


def test_reproduce_jobs_trains_runs_in_worker_processes(tmp_path):
    import os

    logs: list[str] = []
    result = reproduce("multi", "tiny", 1, tmp_path, steps=4, tasks=["3mix"], plots=False,
                       run_fn=process_runner, jobs=2, log=logs.append)
    runs = tmp_path / "runs"
    pids = {int((runs / run_dir_name("3mix", a, 0) / "pid.txt").read_text())
            for a in ("grpo", "static_exp", "comp_rl")}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    assert [(m.tasks, m.agent) for m in result.missing] == [("3mix", "exp_only")]
    assert "3mix__exp_only__seed0 raised RuntimeError: no data for this cell" in result.markdown.read_text()
    assert sum("finished" in m for m in logs) == 3
    with pytest.raises(ValueError, match="jobs must be >= 1"):
        reproduce("multi", "tiny", 1, tmp_path, tasks=["3mix"], run_fn=process_runner, jobs=0)


def test_reproduce_dry_run(tmp_path, capsys):
    assert cli_main(["reproduce", "--suite", "ablation", "--seeds", "2", "--dry-run",
                     "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "14 run(s)" in out and "3mix__comp_rl_no_ask__seed1" in out


def test_ratio_with_zero_denominator_is_undefined_not_missing():
    from crl_bench.report.stats import ratio_of_means
    from crl_bench.report.tables import Cell, format_cell

    assert format_cell(Cell("r", ratio_of_means([0.0], [0.0]), kind="ratio")) == \
        "undefined: denominator 0 (1 seed)"
    assert format_cell(Cell("r", ratio_of_means([0.5, 0.7], [0.2, 0.4]), paper=1.3, kind="ratio")) == \
        "2.00x (2 seeds) · paper 1.3x"
    assert format_cell(Cell("r", None, kind="ratio")) == "no runs"
    assert format_cell(Cell("r", None, expected_n=3, kind="ratio")) == "missing (0/3 seeds)"


# ---------------------------------------------------------------------------------------------
# on real tiny runs (played once per session by conftest.tiny_run, shared with the e2e,
# ablation and golden tests)
# ---------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_report_on_real_tiny_runs(tiny_run, tmp_path):
    pytest.importorskip("nle")
    runs = {(agent, seed): tiny_run(agent, seed).path
            for agent, seed in (("grpo", 0), ("grpo", 1), ("comp_rl", 0), ("comp_rl", 1),
                                ("static_exp", 0), ("comp_rl_no_split", 0))}
    result = write_report(sorted(runs.values()), tmp_path, plots=True)
    doc = json.loads((tmp_path / "report.json").read_text())
    single = table(doc, "single_success")
    assert single["columns"] == ["MiniHack Room"]
    for label, agent, with_exp in (("Baseline", "grpo", False), ("Comp. RL w/ exp", "comp_rl", True),
                                   ("Comp. RL w/o exp", "comp_rl", False)):
        values = []
        for seed in (0, 1):  # each run's final evaluation, read straight from its eval.jsonl
            recs = [json.loads(x) for x in (runs[(agent, seed)] / "eval.jsonl").read_text().splitlines()]
            last = max(r["step"] for r in recs)
            (rec,) = [r for r in recs if r["step"] == last and r["with_experience"] == with_exp]
            values.append(rec["success_rate"])
        c = cell(single, label, "MiniHack Room")
        assert c["values"] == values and c["n"] == 2
        mean = sum(values) / 2
        if values[0] != values[1]:
            lo, hi = stats.t.interval(0.95, 1, loc=mean, scale=stats.sem(values))
            assert (c["ci_low"], c["ci_high"]) == pytest.approx((lo, hi))
        else:  # a constant sample: a zero-width interval at the mean
            assert c["ci_low"] == pytest.approx(mean) and c["ci_high"] == pytest.approx(mean)
    # the runs section lists what each run took, from its own records
    assert {(r["agent"], r["seed"]) for r in doc["runs"]} == set(runs)
    for rec in doc["runs"]:
        train = [json.loads(x) for x in (Path(rec["path"]) / "episodes.jsonl").read_text().splitlines()
                 if json.loads(x)["phase"] == "train"]
        assert rec["steps"] == 3 and rec["train_episodes"] == len(train) == 3 * 8
    with open(tmp_path / "tables" / "single_success.csv") as fh:
        rows = list(csv.DictReader(fh))
    # one row per (agent, evaluation variant): grpo w/o exp; the others w/ and w/o exp
    assert len(rows) == 7
    assert {r["agent"] for r in rows} == {"grpo", "comp_rl", "static_exp", "comp_rl_no_split"}
    assert result.plots and all(p.path.stat().st_size > 5_000 for p in result.plots)
