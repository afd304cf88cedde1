"""The reader comparison's analysis (experiments/reader_analysis.py) follows its plan
(results/experience_helps/reader/PLAN.md, Statistics and What counts): the exact tests on
values whose p-values are counted by hand, the pending rule, the verdict and claim rules, the
per-run figures, and the bank entries' title/content check on a real bank."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import experience_records as er  # noqa: E402
import reader_analysis as ra  # noqa: E402

from tests.test_reader_recompute import synthetic_run  # noqa: E402

S = ra.SEEDS


def per_seed(values: list[float]) -> dict[int, float]:
    return dict(zip(S, values))


# -- the exact tests, counted by hand ----------------------------------------------------------

def test_the_most_extreme_labelling_has_p_1_in_252_and_the_sign_test_1_in_32():
    """a = 6..10, b = 1..5: of the C(10, 5) = 252 ways to label five of the ten values a, only
    the observed one gives a difference >= 5 (one-sided p 1/252); its mirror image gives -5
    (two-sided 2/252). Five positive paired differences: P(X >= 5) = 1/32 for X ~ Bin(5, 1/2),
    two-sided 2/32."""
    c = ra.compare(per_seed([6, 7, 8, 9, 10]), per_seed([1, 2, 3, 4, 5]))
    assert c["diff"] == 5
    assert c["perm_assignments"] == 252
    assert c["perm_p_greater"] == pytest.approx(1 / 252)
    assert c["perm_p_two_sided"] == pytest.approx(2 / 252)
    assert c["perm_p_less"] == pytest.approx(1.0)
    assert c["perm_p_min"] == pytest.approx(1 / 252)
    assert (c["sign_test_positive"], c["sign_test_n"], c["sign_test_zeros"]) == (5, 5, 0)
    assert (c["sign_test_p_greater"], c["sign_test_p_two_sided"]) == pytest.approx((1 / 32, 2 / 32))
    assert c["low"] > 0 and ra.verdict(c) == "hit"


def test_the_second_most_extreme_labelling_counts_both_above_it():
    """a = {5, 7, 8, 9, 10} (sum 39), b = {1, 2, 3, 4, 6}: the a-sums >= 39 of five of 1..10
    are 40 ({6..10}) and 39 (only this one: 6 -> 5), so p = 2/252; the difference is
    (2 s - 55) / 5, and |.| >= 4.6 also holds for s <= 16 ({1..5} = 15, {1, 2, 3, 4, 6} = 16):
    two-sided 4/252."""
    c = ra.compare(per_seed([5, 7, 8, 9, 10]), per_seed([1, 2, 3, 4, 6]))
    assert c["diff"] == pytest.approx(4.6)
    assert c["perm_p_greater"] == pytest.approx(2 / 252)
    assert c["perm_p_two_sided"] == pytest.approx(4 / 252)


def test_ties_count_against_the_observed_value_and_zeros_leave_the_sign_test():
    """a = (1, 0, 0, 0, 0), b = zeros: every labelling that puts the single 1 in a (C(9, 4) =
    126 of 252) ties the observed difference 0.2: one-sided p 1/2; every labelling has
    |difference| 0.2: two-sided 1. The sign test drops the four equal seeds: 1 of n = 1
    positive, P(X >= 1) = 1/2, two-sided 1. No labelling of these values can reach p <= 0.05:
    not testable."""
    c = ra.compare(per_seed([1, 0, 0, 0, 0]), per_seed([0, 0, 0, 0, 0]))
    assert c["perm_p_greater"] == pytest.approx(0.5)
    assert c["perm_p_two_sided"] == pytest.approx(1.0)
    assert (c["sign_test_positive"], c["sign_test_n"], c["sign_test_zeros"]) == (1, 1, 4)
    assert (c["sign_test_p_greater"], c["sign_test_p_two_sided"]) == pytest.approx((0.5, 1.0))
    assert c["perm_p_min"] == pytest.approx(0.5)
    assert ra.judge(c, +1)[0] == "not testable here"


def test_every_seed_equal_gives_p_1_and_an_empty_sign_test():
    c = ra.compare(per_seed([0.125] * 5), per_seed([0.125] * 5))
    assert (c["perm_p_greater"], c["perm_p_two_sided"]) == (1.0, 1.0)
    assert (c["sign_test_n"], c["sign_test_p_greater"], c["sign_test_p_two_sided"]) == (0, 1.0, 1.0)
    assert (c["low"], c["high"]) == (0.0, 0.0)
    assert ra.verdict(c) == "miss"  # the plan's rule for the primary: neither hit nor reverse
    assert ra.judge(c, -1)[0] == "not testable here"


def test_a_side_short_of_five_seeds_is_pending():
    c = ra.compare(dict(zip((0, 1, 2, 3), [1.0] * 4)), per_seed([0.0] * 5))
    assert c == {"pending": "pending (4 + 5 of 5 + 5 seeds)", "n_a": 4, "n_b": 5}
    assert ra.verdict(c) == "pending" and ra.judge(c, +1)[0] == "pending"


# -- the verdict and the claims ----------------------------------------------------------------

def test_an_interval_with_a_bound_at_0_does_not_lie_above_0():
    hit = {"diff": 0.1, "low": 1e-9, "high": 0.2, "perm_p_greater": 0.01, "perm_p_less": 0.99,
           "perm_p_two_sided": 0.02, "perm_p_min": 0.004}
    assert ra.verdict(hit) == "hit" and ra.judge(hit, +1)[0] == "hit"
    at_zero = {**hit, "low": 0.0}
    assert ra.verdict(at_zero) == "miss" and ra.judge(at_zero, +1)[0] == "miss"
    assert ra.verdict({**hit, "perm_p_greater": 0.051}) == "miss"
    reverse = {**hit, "diff": -0.1, "low": -0.2, "high": -0.01, "perm_p_greater": 0.99,
               "perm_p_less": 0.01}
    assert ra.verdict(reverse) == "reverse" and ra.judge(reverse, +1)[0] == "reverse"
    # the same comparison read in the other direction (a claim that a is below b): a hit
    assert ra.judge(reverse, -1)[0] == "hit"
    assert ra.judge({**reverse, "high": 0.0}, -1)[0] == "miss"


def _comparisons(outcome_of: dict[tuple[str, str, str], dict]) -> list[dict]:
    base = {"diff": -0.1, "low": -0.2, "high": -0.05, "perm_p_greater": 0.99, "perm_p_less": 0.01,
            "perm_p_two_sided": 0.02, "perm_p_min": 0.004}
    keys = [ra.PRIMARY, *ra.SECONDARY]
    return [{"metric": m, "a": a, "b": b, **outcome_of.get((m, a, b), base)} for m, a, b in keys]


def test_experience_only_is_lowest_only_when_each_of_its_three_comparisons_says_so():
    last = ("auc", "exp_only with exp", "static_exp with exp")
    claims = {c["claim"]: c for c in ra.claims(_comparisons({}))}
    lowest = claims["Experience-only the lowest of the four"]
    assert lowest["outcome"] == "hit" and [p["outcome"] for p in lowest["parts"]] == ["hit"] * 3
    # a comp_rl − grpo difference below 0 at p 0.01: the first claim reversed
    assert claims["Comp. RL above the baseline"]["outcome"] == "reverse"
    assert claims["Static online experience below the baseline"]["outcome"] == "hit"
    pending = {c["claim"]: c for c in ra.claims(_comparisons(
        {last: {"pending": "pending (5 + 3 of 5 + 5 seeds)"}}))}
    assert pending["Experience-only the lowest of the four"]["outcome"] == "pending"
    missed = {c["claim"]: c for c in ra.claims(_comparisons(
        {last: {"diff": -0.1, "low": -0.2, "high": 0.01, "perm_p_greater": 0.9,
                "perm_p_less": 0.1, "perm_p_two_sided": 0.2, "perm_p_min": 0.004}}))}
    assert missed["Experience-only the lowest of the four"]["outcome"] == "miss"


# -- per run -----------------------------------------------------------------------------------

def test_entropy_top_move_and_episodes_without_an_action_turn():
    assert ra.action_entropy({"north": 16, "south": 16}) == pytest.approx(1.0)
    four = {m: 8 for m in ("north", "south", "east", "west")}
    assert ra.action_entropy(four) == pytest.approx(2.0)
    assert ra.action_entropy({"north": 32}) == 0.0
    assert ra.top_move({"west": 21, "north": 3, "westwest": 1}) == ("west", 21 / 25)
    header = {"train_actions": {"1": {"north": 25}, "2": {"south": 32}, "3": {"east": 30}},
              "train_examples": {"1": {"episodes": 32}, "2": {"episodes": 32}}}
    assert ra.no_action_turns(header) == {1: 7, 2: 0, 3: 2}  # step 3: the plan's 32 episodes


def test_collapsed_seeds_and_gaps_are_reported_from_a_record(tmp_path):
    """exp_only seed 0 (a copy of the committed grpo record, its outcomes changed): 29 of its
    last step's 30 action turns north (97%), end 0/128 with experience and 16/128 without (both
    <= 0.175): collapsed in both series; 32 - 30 = 2 episodes without an action turn."""
    records = tmp_path / "reader" / "records"
    steps = (0, 5, 10, 15, 20)
    path = synthetic_run(records, "exp_only", 0, {**{(s, 1): 0 for s in steps},
                                                  **{(s, 0): 16 for s in steps}})
    lines = path.read_text().splitlines()
    head = json.loads(lines[0])
    head["run"]["train_actions"]["20"] = {"north": 29, "south": 1}
    head["run"]["train_examples"]["20"]["episodes"] = 32
    path.write_text("\n".join([json.dumps(head)] + lines[1:]) + "\n")
    result = ra.analyse(records, seeds=(0,))
    assert {(c["series"], c["seed"]) for c in result["collapsed"]} == {
        ("exp_only with exp", 0), ("exp_only without exp", 0)}
    gaps = next(g for g in result["no_action_turns"] if g["agent"] == "exp_only")
    assert gaps["per_step"]["20"] == 2
    md = ra.summary_markdown(result)
    assert "exp_only with exp seed 0 (north 97%, end 0.000)" in md
    assert result["means"]["exp_only with exp"]["auc"]["mean"] == 0.0
    assert result["verdict"] == "pending"


def test_why_an_episode_sent_no_action_is_read_from_its_turn():
    """The turn of static_exp seed 0's step-4 episode on level 17 (its trajectory, exported to
    no_action/static_exp__seed0_no_action.jsonl): the reply ran to the 16-token cap repeating
    moves and never closed its answer block."""
    turn = {"kind": "invalid", "finish_reason": "length", "completion_ids": [28234] * 16,
            "completion_text": "south<southwest</southwest</southwest</southwestwest</south",
            "observation": "Invalid format (the answer block is not closed); the environment "
                           "did not change."}
    assert ra.no_action_reason(turn) == "the answer block is not closed, at the token cap"
    assert ra.no_action_reason({**turn, "finish_reason": "stop",
                                "observation": "Invalid format (no answer block found); x"}) \
        == "no answer block found"
    assert ra.no_action_reason({"kind": "ask"}) == "asked (Search-and-Ask), no action"


def test_no_action_episodes_are_exported_from_a_real_run_and_tabled(tmp_path):
    """A real tiny grpo run whose replies are cut at one token (so none closes its answer block):
    one exported row per training episode without an action in episodes.jsonl, each with the
    reason read from its turn; the page's table gives the reasons and warns where the exported
    rows do not number the records' total."""
    pytest.importorskip("torch")
    pytest.importorskip("nle")
    from crl_bench.runner.api import run_experiment

    run = tmp_path / "run"
    run_experiment("grpo", "minihack", "tiny", 0, run, steps=1, progress=False,
                   overrides={"threads": 1, "rollout.max_new_tokens": 1})
    out = tmp_path / "reader" / "no_action"
    assert er.main(["no-action", str(run), "--out", str(out)]) == 0
    (path,) = out.iterdir()
    assert path.name == "grpo__seed0_no_action.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    episodes = [json.loads(x) for x in (run / "episodes.jsonl").read_text().splitlines()]
    silent = Counter(e["step"] for e in episodes if e["phase"] == "train" and not e["n_actions"])
    assert rows and Counter(r["step"] for r in rows) == silent
    assert {(r["finish_reason"], r["tokens"]) for r in rows} == {("length", 1)}
    assert all(r["reason"].endswith(", at the token cap") for r in rows)
    why = ra.no_action_reasons(out)["grpo__seed0"]
    assert why["episodes"] == len(rows) and sum(why["reasons"].values()) == len(rows)
    records = tmp_path / "reader" / "records"
    synthetic_run(records, "grpo", 0, {(s, 0): 16 for s in (0, 5, 10, 15, 20)})
    result = ra.analyse(records, seeds=(0,))
    gaps = next(g for g in result["no_action_turns"] if g["agent"] == "grpo")
    assert gaps["why"] == why
    cell = ra._why(gaps)
    assert all(f"{n}: {reason}" in cell for reason, n in why["reasons"].items())
    assert "(1 token)" in cell and f"0 of {len(rows)} shown experience" in cell
    assert (f"{len(rows)} exported, the records count {gaps['total']}" in cell) == \
        (len(rows) != gaps["total"])  # the tiny run's rows against the copied grpo record
    assert ra._why({**gaps, "why": None}) == "—"


def test_what_the_evaluation_episodes_were_shown_and_did():
    """Level 1,000,000 has the fountain (rule: southwest), 1,000,001 the altar (rule: north),
    crl_bench.envs.minihack.landmark."""
    rows = [{"seed": 1_000_000, "claim": ["success", "southwest"], "actions": ["Southwest"],
             "success": 1},
            {"seed": 1_000_001, "claim": ["success", "south"], "actions": ["north"], "success": 1},
            {"seed": 1_000_001, "claim": ["failure", "north"], "actions": ["east"], "success": 0},
            {"seed": 1_000_000, "claim": ["failure", "east"], "actions": ["east"], "success": 0},
            {"seed": 1_000_000, "claim": None, "actions": ["west"], "success": 0}]
    assert ra.eval_claims(rows) == {"episodes": 5, "shown": 4, "success": 2, "success_rule": 1,
                                    "sent_success": 1, "sent_success_solved": 1, "failure": 2,
                                    "failure_right": 1, "avoided": 1}


def test_reader_records_pick_the_reader_plan():
    assert er.reader_plan("auto", ROOT / "results/experience_helps/reader/records")
    assert not er.reader_plan("auto", ROOT / "results/experience_helps/keyed_merge/records")
    assert er.reader_plan("reader", Path("anything")) and not er.reader_plan("earlier", ra.RECORDS)


# -- bank entries ------------------------------------------------------------------------------

def test_every_bank_entry_is_exported_and_its_title_checked(tmp_path):
    """A real bank: an added success entry titled as a success (agrees), an added entry with no
    claim, and two merged entries, one titled 'what went wrong' over a success claim (the title
    bug fixed in crl_bench.extractor.merge: disagrees) and one failure titled as a failure."""
    np = pytest.importorskip("numpy")
    from crl_bench.experience.bank import ExperienceBank

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"agent": "comp_rl", "seed": 3}))
    goal = "Reach the staircase down"
    rows = [(f"{goal}: what worked", "To succeed, take the action north.", "add"),
            (f"{goal}: what worked", "error", "add"),
            (f"{goal}: what went wrong", "To succeed, take the action south.", "merge"),
            (f"{goal}: what went wrong", "To avoid this failure, do not take the action east.",
             "merge")]
    bank = ExperienceBank(run / "bank.sqlite", dim=4)
    try:
        ids = bank.add([{"title": t, "content": c, "family": "minihack", "origin": o,
                         "task_ids": ["7"]} for t, c, o in rows],
                       np.eye(4, dtype=np.float32), step=1)
    finally:
        bank.close()
    (tmp_path / "no_bank").mkdir()
    banks = tmp_path / "banks"
    assert er.main(["bank-entries", str(run), str(tmp_path / "no_bank"), "--out", str(banks)]) == 0
    assert [p.name for p in banks.iterdir()] == ["comp_rl__seed3_entries.jsonl"]
    written = (banks / "comp_rl__seed3_entries.jsonl").read_text().splitlines()
    lines = [json.loads(x) for x in written]
    assert [(x["title"], x["content"], x["kind"]) for x in lines] == rows
    assert [x["id"] for x in lines] == ids
    check = ra.bank_agreement(banks)["comp_rl__seed3"]
    assert check["entries"] == 4 and check["disagreeing_ids"] == [ids[2]]
    assert check["merge"] == {"agrees": 1, "disagrees": 1, "no claim": 0, "no outcome title": 0}
    assert check["add"] == {"agrees": 1, "disagrees": 0, "no claim": 1, "no outcome title": 0}
    # the samples: per outcome title the lowest-id merged entry, else the lowest-id entry
    assert [(x["id"], x["kind"], x["verdict"]) for x in check["samples"]] == [
        (ids[0], "add", "agrees"), (ids[2], "merge", "disagrees")]
    result = ra.analyse(tmp_path / "records", banks=banks)
    page = ra.summary_markdown(result)
    assert f"| comp_rl__seed3 | 4 | 1 / 1 / 0 / 0 | 1 / 0 / 1 / 0 | {ids[2]} |" in page
    assert (f"| comp_rl__seed3 | {ids[2]} | merge | {goal}: what went wrong: To succeed, take "
            "the action south. | disagrees |") in page
    empty = ra.analyse(tmp_path / "records", banks=tmp_path / "none")
    assert "No entry file committed yet" in ra.summary_markdown(empty)


# -- the committed page ------------------------------------------------------------------------

def test_the_committed_page_is_what_the_committed_records_give():
    """analysis.json and analysis.md beside the page are the analysis of the committed records
    (rerun after each record lands: results/experience_helps/reader/run_all.sh)."""
    if not (ra.FOLDER / "analysis.json").is_file():
        pytest.skip("the reader comparison's analysis is not committed yet")
    result = ra.analyse(ra.RECORDS)
    assert json.dumps(result, indent=1) + "\n" == (ra.FOLDER / "analysis.json").read_text()
    assert ra.summary_markdown(result) == (ra.FOLDER / "analysis.md").read_text()


def test_a_bank_content_file_without_a_later_field_is_tabled_with_a_dash(tmp_path):
    """bank_content.json as written by an older export (no landmark-kind count): the row is
    still tabled, the missing cell a dash."""
    banks = tmp_path / "banks"
    banks.mkdir()
    fields = {"entries": 56, "keys": 56, "keys_with_a_success_naming_the_rule": 9, "merged": 53,
              "success": 9, "success_naming_the_rule": 9, "failure": 47,
              "failure_naming_another_move": 47, "other_text": 0}
    (banks / "bank_content.json").write_text(json.dumps({"comp_rl__seed0": fields}))
    md = ra.summary_markdown(ra.analyse(tmp_path / "records", banks=banks))
    assert "| comp_rl__seed0 | 56 | 56 | 9 | —/8 | 53 | 9 (9) | 47 (47) | 0 |" in md


def test_runs_started_more_than_once_are_listed_from_the_launcher_log(tmp_path):
    """The driver's log, not a hand-written note, says which runs were stopped and resumed."""
    log = tmp_path / "launcher_log.txt"
    log.write_text("2026-12-07T16:51:05Z start static_exp seed 0\n"
                   "2026-12-07T16:52:55Z start static_exp seed 0\n"
                   "2026-12-07T16:53:10Z start static_exp seed 1\n"
                   "2026-12-07T17:40:00Z end static_exp seed 1: done\n"
                   "2026-12-07T17:41:00Z committed static_exp seed 1\n")
    assert ra.launches(log) == {"static_exp__seed0": ["2026-12-07T16:51:05Z", "2026-12-07T16:52:55Z"],
                                "static_exp__seed1": ["2026-12-07T16:53:10Z"]}
    assert ra.launches(tmp_path / "absent.txt") == {}


def test_held_out_levels_are_split_by_whether_a_training_level_had_their_layout():
    """Layout = landmark kind and square (``landmark_layout``: level seed mod 128). Training on
    level seeds 0 and 1; evaluation levels 128 (layout of 0: trained), 2 and 130 (never):
    step 0 left out, successes and success claims (right = the level's rule move) counted."""
    from crl_bench.envs.minihack.landmark import landmark_layout

    rule = {s: landmark_layout(s)[2] for s in (128, 2)}
    wrong = next(m for m in ("north", "south") if m != rule[2])
    episodes = [
        {"step": 0, "seed": 128, "success": 1, "claim": ["success", rule[128]]},  # step 0: out
        {"step": 5, "seed": 128, "success": 1, "claim": ["success", rule[128].upper()]},
        {"step": 5, "seed": 2, "success": 0, "claim": ["success", wrong]},
        {"step": 10, "seed": 130, "success": 1, "claim": ["failure", wrong]},
        {"step": 10, "seed": 2, "success": 1, "claim": None},
    ]
    split = ra.layout_split({"train_levels": [0, 1]}, episodes)
    assert split["trained"] == {"episodes": 1, "solved": 1, "success_claims": 1,
                                "success_claims_right": 1}
    assert split["never"] == {"episodes": 3, "solved": 2, "success_claims": 1,
                              "success_claims_right": 0}
