"""The reader comparison's numbers, recomputed a second way from the committed jsonl.

A minimal reader of the records (the standard library's ``json``, ``itertools`` and ``math``
only; none of the analysis code that made the page) computes each run's start, end and AUC per
evaluation mode as the plan defines them (``results/experience_helps/reader/PLAN.md``: held-out
success at step 0, at step 20, and the trapezoid over the evaluated steps divided by 20), and
checks that the analysis code (``experiments/experience_records.py``) gives the same figures for
every committed run, and that the page's analysis (``analysis.json`` / ``analysis.md``) holds
these per-series means and, for every comparison it computes, this difference of means, exact
permutation p (all C(10, 5) = 252 assignments, ties within 1e-12 counted against the observed
value) and exact sign test (zeros dropped); a comparison with a side short of five seeds must be
shown pending. A bug in the analysis code then cannot hide behind its own output.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import subprocess
import sys
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


SEEDS = (0, 1, 2, 3, 4)
SERIES = {  # PLAN.md: an agent without a bank once, each agent with a bank with and without
    "grpo": ("grpo", False),
    "static_exp with exp": ("static_exp", True), "static_exp without exp": ("static_exp", False),
    "comp_rl with exp": ("comp_rl", True), "comp_rl without exp": ("comp_rl", False),
    "exp_only with exp": ("exp_only", True), "exp_only without exp": ("exp_only", False),
}
PLANNED = [  # PLAN.md, Statistics: the primary, then the secondary comparisons
    ("auc", "comp_rl with exp", "grpo"), ("auc", "comp_rl without exp", "grpo"),
    ("auc", "static_exp with exp", "comp_rl with exp"), ("auc", "static_exp with exp", "grpo"),
    ("auc", "exp_only with exp", "grpo"), ("auc", "exp_only with exp", "comp_rl with exp"),
    ("auc", "exp_only with exp", "static_exp with exp"), ("end", "comp_rl with exp", "grpo")]


def permutation_p(a: list[float], b: list[float]) -> tuple[float, float]:
    """(one-sided mean(a) - mean(b) > 0, two-sided) over every choice of which values are a's."""
    pooled, n = a + b, len(a)
    observed = sum(a) / n - sum(b) / len(b)
    stats = []
    for chosen in itertools.combinations(range(len(pooled)), n):
        sa = sum(pooled[i] for i in chosen)
        stats.append(sa / n - (sum(pooled) - sa) / len(b))
    return (sum(x >= observed - 1e-12 for x in stats) / len(stats),
            sum(abs(x) >= abs(observed) - 1e-12 for x in stats) / len(stats))


def sign_p(diffs: list[float]) -> tuple[int, int, float, float]:
    """(positive, n, P(X >= positive), two-sided) with X ~ Binomial(n, 1/2), zeros dropped."""
    nonzero = [d for d in diffs if d != 0]
    n, k = len(nonzero), sum(d > 0 for d in nonzero)
    if n == 0:
        return 0, 0, 1.0, 1.0
    upper = sum(math.comb(n, i) for i in range(k, n + 1)) / 2 ** n
    lower = sum(math.comb(n, i) for i in range(0, k + 1)) / 2 ** n
    return k, n, upper, min(1.0, 2 * min(upper, lower))


def check_page(folder: Path) -> int:
    """Assert that ``folder``'s analysis holds the minimal reader's per-series means and, for
    every comparison it computes, the difference, permutation p and sign test recomputed here;
    returns the number of computed comparisons checked."""
    result = json.loads((folder / "analysis.json").read_text())
    page = (folder / "analysis.md").read_text()
    per_series: dict[str, dict[int, dict[str, float]]] = {}
    for name in result["recorded"]:
        header, mine = minimal(folder / "records" / f"{name}.jsonl")
        for series, (agent, with_exp) in SERIES.items():
            if agent == header["agent"] and with_exp in mine:
                per_series.setdefault(series, {})[int(header["run_seed"])] = mine[with_exp]
    assert set(result["means"]) == set(per_series)
    for series, runs in per_series.items():
        row = next(x for x in page.splitlines() if x.startswith(f"| {series} | {len(runs)} | "))
        for key in ("start", "end", "auc"):
            mean = sum(r[key] for r in runs.values()) / len(runs)
            assert result["means"][series][key]["mean"] == pytest.approx(mean, abs=1e-12)
            assert f"{mean:.3f} [" in row, (series, key, row)
    assert [(c["metric"], c["a"], c["b"]) for c in result["comparisons"]] == PLANNED
    computed = 0
    for c in result["comparisons"]:
        a, b = per_series.get(c["a"], {}), per_series.get(c["b"], {})
        if not all(s in a and s in b for s in SEEDS):
            have = f"{sum(s in a for s in SEEDS)} + {sum(s in b for s in SEEDS)} of 5 + 5 seeds"
            assert c.get("pending") == f"pending ({have})", c
            continue
        xa, xb = [a[s][c["metric"]] for s in SEEDS], [b[s][c["metric"]] for s in SEEDS]
        diff = sum(xa) / 5 - sum(xb) / 5
        assert c["diff"] == pytest.approx(diff, abs=1e-12), c
        assert (c["perm_p_greater"], c["perm_p_two_sided"]) == pytest.approx(permutation_p(xa, xb))
        k, n, p1, p2 = sign_p([x - y for x, y in zip(xa, xb)])
        assert (c["sign_test_positive"], c["sign_test_n"]) == (k, n)
        assert (c["sign_test_p_greater"], c["sign_test_p_two_sided"]) == pytest.approx((p1, p2))
        unit = "AUC" if c["metric"] == "auc" else c["metric"]
        row = next(x for x in page.splitlines()
                   if f"| {unit}({c['a']}) − {unit}({c['b']}) | 5 + 5 | " in x)
        assert f"{diff:+.3f} [" in row, row
        computed += 1
    return computed


def test_the_page_holds_the_minimal_readers_figures():
    """The committed page's means and computed comparisons are the minimal reader's (the
    comparisons still short of five seeds a side shown pending)."""
    if not (FOLDER / "analysis.json").is_file():
        pytest.skip("the reader comparison's analysis is not committed yet")
    check_page(FOLDER)


def test_the_page_covers_every_committed_record():
    """The page is rerun whenever a record is committed (run_all.sh does it before committing):
    it names exactly the committed records. If this fails, rerun ``python
    experiments/minihack_landmark.py analyse --summary-only --records
    results/experience_helps/reader/records --out results/experience_helps/reader``."""
    if not (FOLDER / "analysis.json").is_file():
        pytest.skip("the reader comparison's analysis is not committed yet")
    result = json.loads((FOLDER / "analysis.json").read_text())
    assert sorted(result["recorded"]) == [p.stem for p in committed()]


# -- synthetic runs of the other agents, in the records' real format ---------------------------

BANKED = ("static_exp", "comp_rl", "exp_only")


def synthetic_run(records: Path, agent: str, seed: int, wins: dict[tuple[int, int], int]) -> Path:
    """``<agent>__seed<seed>.jsonl`` in ``records``: a copy of the committed ``grpo`` record of
    that seed with the agent changed and, for each (step, with experience) in ``wins``, the 128
    evaluation episodes of that mode (the grpo episodes' levels, answers and shown example)
    with the first ``wins[step, exp]`` levels solved and the others not."""
    lines = (RECORDS / f"grpo__seed{seed}.jsonl").read_text().splitlines()
    head = json.loads(lines[0])
    head["run"]["agent"] = agent
    out = [json.dumps(head, separators=(",", ":"))]
    template: dict[int, list[dict]] = {}
    for line in lines[1:]:
        e = json.loads(line)
        template.setdefault(int(e["step"]), []).append(e)
    for (step, exp), k in sorted(wins.items()):
        for i, e in enumerate(sorted(template[step], key=lambda x: x["seed"])):
            out.append(json.dumps({**e, "exp": exp, "success": int(i < k),
                                   "score": float(i < k)}, separators=(",", ":")))
    records.mkdir(parents=True, exist_ok=True)
    path = records / f"{agent}__seed{seed}.jsonl"
    path.write_text("\n".join(out) + "\n")
    return path


def grpo_wins(seed: int) -> dict[int, int]:
    """The committed grpo run's held-out successes per evaluated step."""
    wins: dict[int, int] = {}
    for line in (RECORDS / f"grpo__seed{seed}.jsonl").read_text().splitlines()[1:]:
        e = json.loads(line)
        wins[int(e["step"])] = wins.get(int(e["step"]), 0) + int(e["success"])
    return wins


def synthetic_comparison(folder: Path, seeds=SEEDS, agents=BANKED) -> Path:
    """A reader folder with the committed grpo records and synthetic runs of ``agents``:
    comp_rl with experience 64/128 at every evaluation (AUC 0.5), without experience grpo's
    curve with 8 more successes at step 10 (8 fewer on seed 4); static_exp 8/128 with, 16/128
    without; exp_only 0/128 with, 16/128 without. Returns the records folder."""
    records = folder / "records"
    records.mkdir(parents=True, exist_ok=True)
    for path in sorted(RECORDS.glob("grpo__seed*.jsonl")):
        (records / path.name).write_text(path.read_text())
    for seed in seeds:
        steps = sorted(grpo_wins(seed))
        shifted = {s: k + (8 if seed < 4 else -8) * (s == 10) for s, k in grpo_wins(seed).items()}
        plan = {"comp_rl": {**{(s, 1): 64 for s in steps}, **{(s, 0): shifted[s] for s in steps}},
                "static_exp": {**{(s, 1): 8 for s in steps}, **{(s, 0): 16 for s in steps}},
                "exp_only": {**{(s, 1): 0 for s in steps}, **{(s, 0): 16 for s in steps}}}
        for agent in agents:
            synthetic_run(records, agent, seed, plan[agent])
    return records


def run_analysis(records: Path, out: Path) -> None:
    """The plan's command on ``records`` (a subprocess: this file imports no analysis code)."""
    res = subprocess.run([sys.executable, str(REPO / "experiments" / "minihack_landmark.py"),
                          "analyse", "--summary-only", "--plan", "reader", "--records",
                          str(records), "--out", str(out)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]


def test_the_check_passes_on_a_full_synthetic_comparison_and_fails_on_a_changed_number(tmp_path):
    """All 20 runs (grpo committed, the rest synthetic): every comparison is computed and the
    recomputation agrees; the same page with one difference changed by 0.001 fails it."""
    records = synthetic_comparison(tmp_path)
    run_analysis(records, tmp_path)
    assert check_page(tmp_path) == len(PLANNED)
    # comp_rl without experience: AUC differences +1/64 on four seeds, -1/64 on one (8 levels
    # of 128 over the 5 steps either side of step 10: 8/128 * 5 / 20); mean (4 - 1) / 5 / 64
    result = json.loads((tmp_path / "analysis.json").read_text())
    second = result["comparisons"][1]
    assert second["diff"] == pytest.approx(3 / 320, abs=1e-12)
    result["comparisons"][1]["diff"] += 0.001
    (tmp_path / "analysis.json").write_text(json.dumps(result))
    with pytest.raises(AssertionError):
        check_page(tmp_path)


def test_a_side_short_of_five_seeds_must_be_shown_pending(tmp_path):
    records = synthetic_comparison(tmp_path, seeds=(0, 1, 2, 3), agents=("comp_rl",))
    run_analysis(records, tmp_path)
    assert check_page(tmp_path) == 0
    result = json.loads((tmp_path / "analysis.json").read_text())
    assert result["comparisons"][0]["pending"] == "pending (4 + 5 of 5 + 5 seeds)"
    assert "pending (4 + 5 of 5 + 5 seeds)" in (tmp_path / "analysis.md").read_text()


def test_every_run_of_a_seed_starts_from_the_same_actor() -> None:
    """The plan runs one actor for all agents: before any training (step 0) and without
    experience, every agent's run of a run seed must send the same greedy answer on every
    held-out level. (The reader was built twice, on two machines, from its one recipe; this is
    the check that both builds are one model as far as the comparison can see.)"""
    step0: dict[int, dict[str, dict[int, tuple]]] = {}
    for path in committed():
        lines = path.read_text().splitlines()
        header = json.loads(lines[0])["run"]
        answers = {}
        for line in lines[1:]:
            e = json.loads(line)
            if int(e["step"]) == 0 and not e["exp"]:
                answers[int(e["seed"])] = tuple(e["actions"])
        step0.setdefault(int(header["run_seed"]), {})[header["agent"]] = answers
    for seed, by_agent in step0.items():
        agents = sorted(by_agent)
        first = by_agent[agents[0]]
        assert len(first) == 128, (seed, agents[0], len(first))
        for agent in agents[1:]:
            differ = [lvl for lvl in first if by_agent[agent].get(lvl) != first[lvl]]
            assert not differ, (f"run seed {seed}: {agent} and {agents[0]} answer differently at "
                                f"step 0 without experience on levels {differ[:5]}")


def test_the_answers_account_of_comp_rls_successes_recomputes_from_the_jsonl():
    """The page's answer says where `comp_rl`'s with-experience held-out successes came from:
    counted here from the records alone (json; the level's rule move from the environment's own
    layout function, not from the analysis code): successes after step 0, those whose shown
    success claim named the move the actor sent, and the success claims naming the rule's move."""
    from crl_bench.envs.minihack.landmark import landmark_layout

    paths = sorted(RECORDS.glob("comp_rl__seed*.jsonl"))
    if len(paths) < 5:
        pytest.skip("comp_rl's five runs are not all committed yet")
    solved = followed = claims = right = 0
    for path in paths:
        for line in path.read_text().splitlines()[1:]:
            e = json.loads(line)
            if not e["exp"]:
                continue
            claim = e.get("claim")
            sent = e["actions"][0].strip().lower() if e["actions"] else None
            if claim and claim[0] == "success":
                claims += 1
                right += claim[1].strip().lower() == landmark_layout(int(e["seed"]))[2]
            if e["step"] > 0 and e["success"]:
                solved += 1
                followed += bool(claim) and claim[0] == "success" and claim[1].strip().lower() == sent
    page = " ".join((FOLDER / "README.md").read_text().split())
    assert f"of `comp_rl`'s {solved:,} held-out successes after step 0, {followed:,} were" in page
    assert f"{right:,} of the {claims:,} success claims shown" in page


def test_the_split_by_trained_and_new_layouts_recomputes_from_the_jsonl():
    """analysis.json's held-out success on layouts a training level had and on the others,
    counted here from the records alone (the layout, kind and square, from the environment's own
    layout function; the training levels from each record's header)."""
    from crl_bench.envs.minihack.landmark import landmark_layout

    if not (FOLDER / "analysis.json").is_file():
        pytest.skip("the reader comparison's analysis is not committed yet")
    rows = json.loads((FOLDER / "analysis.json").read_text()).get("layouts")
    assert rows, "analysis.json has no layout split: rerun the analysis"
    for row in rows:
        agent, _, mode = row["series"].partition(" ")
        lines = (RECORDS / f"{agent}__seed{row['seed']}.jsonl").read_text().splitlines()
        seen = {landmark_layout(s)[:2] for s in json.loads(lines[0])["run"]["train_levels"]}
        count = {True: [0, 0], False: [0, 0]}
        for line in lines[1:]:
            e = json.loads(line)
            if e["step"] > 0 and bool(e["exp"]) == (mode == "with exp"):
                c = count[landmark_layout(e["seed"])[:2] in seen]
                c[0] += 1
                c[1] += e["success"]
        for side, key in ((True, "trained"), (False, "never")):
            assert (row[key]["episodes"], row[key]["solved"]) == tuple(count[side]), row
