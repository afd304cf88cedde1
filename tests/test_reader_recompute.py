"""The reader comparison's numbers, recomputed a second way from the committed jsonl.

A minimal reader of the records (the standard library's ``json`` and arithmetic only; none of the
analysis code that made the page) computes each run's start, end and AUC per evaluation mode as
the plan defines them (``results/experience_helps/reader/PLAN.md``: held-out success at step 0,
at step 20, and the trapezoid over the evaluated steps divided by 20), and checks that the
analysis code (``experiments/experience_records.py``) gives the same figures for every committed
run, and, once the page's analysis is committed, that its per-series means are these. A bug in
the analysis code then cannot hide behind its own output.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDER = REPO / "results" / "experience_helps" / "reader"
RECORDS = FOLDER / "records"
STEPS = 20


def minimal(path: Path) -> tuple[dict, dict[bool, dict[str, float]]]:
    """(header, {with experience?: {start, end, auc}}) of one records file, from scratch."""
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])["run"]
    wins: dict[tuple[bool, int], list[int]] = {}
    for line in lines[1:]:
        e = json.loads(line)
        wins.setdefault((bool(e["exp"]), int(e["step"])), []).append(int(e["success"]))
    out = {}
    for mode in (False, True):
        steps = sorted(s for m, s in wins if m == mode)
        if not steps or steps[0] != 0 or steps[-1] != STEPS:
            continue
        rate = {s: sum(wins[mode, s]) / len(wins[mode, s]) for s in steps}
        area = sum((b - a) * (rate[a] + rate[b]) / 2 for a, b in zip(steps, steps[1:]))
        out[mode] = {"start": rate[0], "end": rate[STEPS], "auc": area / STEPS}
    return header, out


def analysis_code():
    spec = importlib.util.spec_from_file_location(
        "experience_records", REPO / "experiments" / "experience_records.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def committed() -> list[Path]:
    return sorted(RECORDS.glob("*.jsonl"))


def test_the_minimal_reader_computes_the_plans_auc(tmp_path):
    """The trapezoid on a hand-made run: success 0, .5, .5, 1, 1 at steps 0, 5, 10, 15, 20."""
    rows = [{"run": {"agent": "grpo", "run_seed": 0}}]
    for step, wins in zip((0, 5, 10, 15, 20), (0, 2, 2, 4, 4)):
        rows += [{"step": step, "seed": 1_000_000 + i, "exp": 0, "success": int(i < wins)}
                 for i in range(4)]
    path = tmp_path / "grpo__seed0.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    _, m = minimal(path)
    # (0+.5)/2*5 + (.5+.5)/2*5 + (.5+1)/2*5 + (1+1)/2*5 = 1.25 + 2.5 + 3.75 + 5 = 12.5; / 20
    assert m[False] == {"start": 0.0, "end": 1.0, "auc": 0.625}
    assert True not in m


@pytest.mark.skipif(not committed(), reason="no run of the reader comparison committed yet")
@pytest.mark.parametrize("path", committed(), ids=lambda p: p.stem)
def test_every_committed_run_gives_the_same_figures_both_ways(path: Path):
    er = analysis_code()
    header, mine = minimal(path)
    h, episodes = er.load_records(path)
    assert h == header
    assert mine, f"{path.name}: no evaluation at both step 0 and step {STEPS}"
    for with_exp, figures in mine.items():
        theirs = er.run_metrics(h, episodes, with_exp, STEPS)
        assert theirs is not None
        for key, value in figures.items():
            assert theirs[key] == pytest.approx(value, abs=1e-12), (path.name, with_exp, key)


def test_the_pages_means_are_the_minimal_readers():
    """Once the page's analysis is committed, each series' mean over seeds is the mean of the
    minimal reader's per-run figures (a series: an agent with or without experience)."""
    analysis = FOLDER / "analysis.json"
    if not analysis.is_file():
        pytest.skip("the reader comparison's analysis is not committed yet (its runs are under way)")
    er = analysis_code()
    result = json.loads(analysis.read_text())
    per_series: dict[str, list[dict[str, float]]] = {}
    for path in committed():
        header, mine = minimal(path)
        for name, (agent, with_exp) in er.SERIES.items():
            if agent == header["agent"] and with_exp in mine:
                per_series.setdefault(name, []).append(mine[with_exp])
    assert set(result["means"]) == set(per_series)
    for name, runs in per_series.items():
        for key in ("start", "end", "auc"):
            mean = sum(r[key] for r in runs) / len(runs)
            assert result["means"][name][key]["mean"] == pytest.approx(mean, abs=1e-12)
