"""`crl-bench report` groups runs by configuration: runs of one (mix, agent) that differ in
anything but the seed are separate rows, named by the difference, never dropped as duplicates.

Run directories come from ``tests/_report_fixture_writer.py`` (the runner's record format), with
the stored configuration edited the way a sweep or another model changes it; every expected value
is read back from the run's own files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crl_bench.cli import main as cli_main
from crl_bench.mixes import BUILTIN_MIXES
from crl_bench.report.runs import load_runs, run_settings
from crl_bench.report.writer import write_report
from _report_fixture_writer import write_fixture_run

MINIHACK = [t.name for t in BUILTIN_MIXES["minihack"]]


def run(root: Path, name: str, *, agent: str = "comp_rl", seed: int = 0, lr: float = 1e-6,
        actor: str = "smollm2-135m", preset: str = "cpu", scale: float = 1.0, **kw) -> Path:
    d = write_fixture_run(root / name, agent=agent, tasks="minihack", task_names=MINIHACK,
                          seed=seed, **kw)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(preset=preset, model={"actor": actor, "lora_r": 0},
               actor={"lr": lr, "clip_ratio": 0.2}, host={"python": name}, threads=seed)
    (d / "config.json").write_text(json.dumps(cfg))
    if scale != 1.0:  # this configuration's own numbers, to tell the rows' values apart
        recs = [json.loads(x) for x in (d / "eval.jsonl").read_text().splitlines()]
        for r in recs:
            r["success_rate"] = r["success_rate"] * scale
        (d / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return d


def final_success(d: Path, with_exp: bool) -> float:
    recs = [json.loads(x) for x in (d / "eval.jsonl").read_text().splitlines()]
    last = max(r["step"] for r in recs)
    (rec,) = [r for r in recs if r["step"] == last and r["with_experience"] == with_exp]
    return rec["success_rate"]


def rows(doc: dict, name: str) -> dict[str, dict]:
    (t,) = [t for t in doc["tables"] if t["name"] == name]
    return {r["label"]: r for r in t["rows"]}


def test_a_learning_rate_sweep_is_two_rows_each_from_its_own_run(tmp_path, capsys):
    a = run(tmp_path / "runs", "lr1", lr=1e-6)
    b = run(tmp_path / "runs", "lr2", lr=2e-6, scale=0.5)
    assert cli_main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "out"),
                     "--no-plots"]) == 0
    out = capsys.readouterr().out
    # the console names the rows and counts runs and rows; nothing is dropped or missing
    assert "2 finished run(s) in 2 row(s)" in out and "0 missing" in out
    assert "row minihack/comp_rl (lr=1e-6): 1 finished seed(s) (0)" in out
    assert "row minihack/comp_rl (lr=2e-6): 1 finished seed(s) (0)" in out
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    assert doc["notes"] == [] and doc["missing"] == []
    assert sorted(g["row"] for g in doc["groups"]) == ["comp_rl (lr=1e-6)", "comp_rl (lr=2e-6)"]
    assert {g["row"]: g["differs"] for g in doc["groups"]} == {
        "comp_rl (lr=1e-6)": {"actor.lr": 1e-6}, "comp_rl (lr=2e-6)": {"actor.lr": 2e-6}}
    single = rows(doc, "single_success")
    for label, d in (("Comp. RL (lr=1e-6)", a), ("Comp. RL (lr=2e-6)", b)):
        for wx in (True, False):
            c = single[f"{label} {'w/' if wx else 'w/o'} exp"]["cells"][0]
            assert c["values"] == [final_success(d, wx)] and c["n"] == 1
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Configurations" in md and "`actor.lr`=2e-06" in md
    assert "| Comp. RL (lr=2e-6) w/ exp |" in md


def test_a_run_with_another_model_is_its_own_row(tmp_path):
    for seed in (0, 1):
        run(tmp_path, f"small{seed}", seed=seed)
    other = run(tmp_path, "big0", actor="Qwen/Qwen2.5-7B-Instruct", scale=0.25)
    rs = load_runs([tmp_path])
    assert len(rs.runs) == 3 and rs.notes == []
    assert sorted(rs.agents("minihack")) == ["comp_rl (actor=Qwen/Qwen2.5-7B-Instruct)",
                                             "comp_rl (actor=smollm2-135m)"]
    big = rs.select("minihack", "comp_rl (actor=Qwen/Qwen2.5-7B-Instruct)")
    assert [r.path for r in big] == [other]
    assert [r.seed for r in rs.select("minihack", "comp_rl (actor=smollm2-135m)")] == [0, 1]
    # the inferred expectation asks each configuration for every seed seen on the mix
    assert [(m.agent, m.seed, m.reason) for m in rs.missing] == [
        ("comp_rl (actor=Qwen/Qwen2.5-7B-Instruct)", 1, "no run directory found")]


def test_only_the_same_settings_and_seed_is_a_duplicate_and_the_console_says_so(tmp_path,
                                                                                  capsys):
    run(tmp_path / "runs", "first", seed=0)
    run(tmp_path / "runs", "again", seed=0)  # same settings (host and threads are not settings)
    assert cli_main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "out"),
                     "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "1 finished run(s) in 1 row(s)" in out
    assert "note: duplicate finished run" in out and "with the same settings" in out


def test_settings_leave_out_seed_host_and_threads_only():
    cfg = {"agent": "grpo", "tasks": "minihack", "seed": 3, "threads": 2, "host": {"x": 1},
           "checkpoint_every": 5, "method": {"merge": False}, "agent_options": {"merge": False},
           "actor": {"lr": 1e-6}, "eval": {"episodes_per_task": 8}}
    assert run_settings(cfg) == {"actor.lr": 1e-6, "agent_options.merge": False,
                                 "eval.episodes_per_task": 8}


def test_a_suite_expects_every_seed_of_each_configuration(tmp_path):
    run(tmp_path, "a0", agent="grpo", seed=0, lr=1e-6)
    run(tmp_path, "b0", agent="grpo", seed=0, lr=2e-6)
    rs = load_runs([tmp_path], expected=[("minihack", "grpo", s) for s in (0, 1)]
                   + [("minihack", "comp_rl", 0)])
    assert sorted((m.agent, m.seed) for m in rs.missing) == [
        ("comp_rl", 0), ("grpo (lr=1e-6)", 1), ("grpo (lr=2e-6)", 1)]


def test_a_quick_report_says_it_is_not_a_result_and_lists_no_unasked_rows(tmp_path):
    mix = "3mix"
    names = [t.name for t in BUILTIN_MIXES[mix]]
    d = write_fixture_run(tmp_path / "runs" / "q", agent="comp_rl", tasks=mix, task_names=names,
                          seed=0, steps=2, eval_every=2)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(cfg | {"preset": "quick"}))
    result = write_report([tmp_path / "runs"], tmp_path / "out", plots=False)
    md = result.markdown.read_text()
    assert "**Not a result.**" in md and "`quick`" in md
    assert "## Missing or unfinished runs (0)" in md
    assert "no runs" not in md  # no row of "no runs" beside a count of nothing missing
    (multi,) = [t for t in json.loads(result.json.read_text())["tables"]
                if t["name"] == "multi_3mix"]
    assert [r["label"] for r in multi["rows"]] == ["Comp. RL w/ exp", "Comp. RL w/o exp"]
    assert any("not asked for" in n and "Baseline" in n and "Exp. Only" in n
               for n in multi["notes"])
    # one seed: the cell says so, and that it has no interval
    assert "(1 seed, no CI)" in md


def test_a_short_runs_plots_show_the_whole_run_on_the_step_axis(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from crl_bench.report import plots

    seen = []
    monkeypatch.setattr(plots._Painter, "save",
                        staticmethod(lambda fig, path: seen.append((path.name, fig))))
    run(tmp_path / "runs", "r", steps=2, eval_every=2)
    write_report([tmp_path / "runs"], tmp_path / "out", plots=True)
    assert seen
    for name, fig in seen:
        for ax in fig.axes:
            if ax.get_visible():
                lo, hi = ax.get_xlim()
                assert lo <= 0 and hi >= 2, (name, lo, hi)  # not 1.90 - 2.10


def test_a_field_newer_than_a_run_counts_as_its_default(tmp_path):
    """A run written before a config field existed lacks it in config.json: it groups with the
    runs that leave the field at its default (else every field added to the code would split a
    sweep's seeds into rows 'x=unset' and 'x=0'), and not with one that changes it."""
    from crl_bench.config.schema import RunConfig

    default = RunConfig().experience.memory_warmup
    dirs = [run(tmp_path, f"s{seed}", seed=seed) for seed in (0, 1, 2)]
    for d, value in zip(dirs, (None, default, default + 5)):
        cfg = json.loads((d / "config.json").read_text())
        if value is not None:  # the run from before the field has no such key
            cfg["experience"] = {"memory_warmup": value}
        (d / "config.json").write_text(json.dumps(cfg))
    rs = load_runs([tmp_path])
    assert rs.notes == []
    rows = {g.row: list(g.seeds) for g in rs.groups}
    assert rows == {f"comp_rl (memory_warmup={default})": [0, 1],
                    f"comp_rl (memory_warmup={default + 5})": [2]}, rows


def test_the_runs_table_shows_the_actors_wait_and_the_banks_lag(tmp_path):
    """An extractor that falls behind without making the actor wait shows in the lag column: a
    run that waited a quarter of its step time and one whose bank was 2 steps behind at zero wait."""
    a = run(tmp_path, "a", seed=0)
    b = run(tmp_path, "b", seed=1)
    for d, wait, lag in ((a, 25.0, 0), (b, 0.0, 2)):
        recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        for r in recs:
            if r.get("step"):
                r.update({"timing_s/step": 100.0, "timing_s/extractor_wait": wait,
                          "timing_s/bank_wait": 0.0, "extractor/bank_lag_steps": 0})
        recs[-1]["extractor/bank_lag_steps"] = lag
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    write_report([a, b], tmp_path / "out", plots=False)
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    by_seed = {r["seed"]: r for r in doc["runs"]}
    assert by_seed[0]["actor_wait"] == pytest.approx(0.25) and by_seed[0]["bank_lag_max"] == 0
    assert by_seed[1]["actor_wait"] == 0.0 and by_seed[1]["bank_lag_max"] == 2
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| actor wait | bank lag (steps) |" in md
    assert "| 25% | 0 |" in md and "| 0% | 2 |" in md
