"""``envs/swe/grading.py`` against SWE-bench's own harness (pure functions, no sandbox).

Expected values are worked out from the original harness, github.com/SWE-bench/SWE-bench
(snapshot 7a21e05), not from our code:

- ``swebench/harness/log_parsers/python.py::parse_log_pytest``: a line counts when it
  ``startswith`` a ``TestStatus`` value (FAILED, PASSED, SKIPPED, ERROR, XFAIL); on ``FAILED``
  lines ``line.replace(" - ", " ")`` runs first; ``if len(test_case) <= 1: continue``; the id is
  ``test_case[1]``, the status ``test_case[0]``; ``test_status_map[id] = status`` (a later line
  overwrites an earlier one).
- ``swebench/harness/grading.py``: ``test_passed`` (PASSED or XFAIL), ``test_failed`` (absent,
  FAILED, ERROR or - since PR #598 - SKIPPED), ``test_maintained`` (P2P: passed or SKIPPED),
  ``get_eval_tests_report`` (F2P/P2P success and failure lists), ``compute_fail_to_pass`` /
  ``compute_pass_to_pass`` (1 when a list is empty) and ``get_resolution_status`` (FULL when both
  ratios are 1, PARTIAL when 0 < f2p < 1 and p2p == 1, NO otherwise).

Deliberate differences, pinned here (each test says so; 1 and 2 are stated in our module
docstring, 3 is ``resolved``'s ``n_tests > 0``):
1. A test listed on several lines keeps its WORST status (the original keeps the last line), so a
   ``PASSED`` line printed after a ``FAILED`` one cannot hide it.
2. ``SKIPPED`` never passes, for PASS_TO_PASS too (the original's ``test_maintained`` counts a
   skipped P2P test as maintained; ours does not, so a patch cannot keep "resolved" by making the
   regression tests skip - see ``tests/test_swe_hacks.py``). For FAIL_TO_PASS both agree.
3. An instance with no tests at all is not resolved (the original's ratios are 1 for empty lists,
   giving RESOLVED_FULL).
4. A FAIL_TO_PASS test passes only when ``PASSED``: ``XFAIL`` does not fix a failing test (the
   code under test can call ``pytest.xfail()``). For PASS_TO_PASS both agree (XFAIL passes).
Other differences, not pinned: we strip each line first (the original needs the status word
at column 0); the original drops ``SKIPPED [N] path:line: reason`` summary lines (ours keeps
``[N]`` as a SKIPPED id, which no dataset id matches and which never passes); the original
prefix-matches required ids truncated inside ``[...]`` (``_resolve_case``, issue #290) where
ours matches exactly (such a test counts as MISSING).
There is no PARTIAL status in ``GradeReport``: ``resolved`` is the original's RESOLVED_FULL and
``score`` the fraction of all required tests that pass.
"""

from __future__ import annotations

import pytest

from crl_bench.envs.swe.grading import (MISSING, PASSING, SEVERITY, STATUSES, GradeReport, grade,
                                        parse_pytest_log, worst)

# --------------------------------------------------------------------------- log parser


def test_status_words_are_the_originals_test_status_values():
    # swebench/harness/constants/__init__.py: class TestStatus
    assert set(STATUSES) == {"FAILED", "PASSED", "SKIPPED", "ERROR", "XFAIL"}
    # test_passed: sm[key] in [PASSED, XFAIL]
    assert PASSING == {"PASSED", "XFAIL"}


def test_rA_summary_lines_give_id_to_status():
    """parse_log_pytest: token 1 is the id, token 0 the status, " - msg" dropped on FAILED."""
    log = ("PASSED tests/t.py::test_a\n"
           "FAILED tests/t.py::test_b - AssertionError: assert 1 == 2\n"
           "ERROR tests/t.py::test_c - fixture 'db' not found\n"
           "XFAIL tests/t.py::test_d - reason: known bug\n"
           "SKIPPED tests/t.py::test_e\n")
    assert parse_pytest_log(log) == {"tests/t.py::test_a": "PASSED",
                                     "tests/t.py::test_b": "FAILED",
                                     "tests/t.py::test_c": "ERROR",
                                     "tests/t.py::test_d": "XFAIL",
                                     "tests/t.py::test_e": "SKIPPED"}


def test_failed_prefix_drops_the_dash_before_the_id():
    """parse_log_pytest: ``if line.startswith("FAILED"): line = line.replace(" - ", " ")``.

    "FAILED - t.py::x" becomes "FAILED t.py::x", so the id is t.py::x (not "-")."""
    assert parse_pytest_log("FAILED - t.py::x") == {"t.py::x": "FAILED"}


def test_dash_is_kept_on_lines_that_are_not_failed():
    """The replace only runs on FAILED lines: "PASSED - t.py::x" has id "-" in the original."""
    assert parse_pytest_log("PASSED - t.py::x") == {"-": "PASSED"}
    assert parse_pytest_log("ERROR - t.py::x") == {"-": "ERROR"}


def test_status_words_are_case_sensitive():
    """``line.startswith(x.value)`` with upper-case TestStatus values: lower case is not one."""
    assert parse_pytest_log("failed t.py::x - boom\npassed t.py::y") == {}


def test_a_bare_status_line_is_skipped_not_the_end_of_the_log():
    """``if len(test_case) <= 1: continue`` - the lines after it are still read."""
    log = "PASSED\nFAILED\nPASSED t.py::y\nFAILED t.py::z - boom"
    assert parse_pytest_log(log) == {"t.py::y": "PASSED", "t.py::z": "FAILED"}


def test_other_lines_are_ignored_and_parsing_continues():
    log = ("===== short test summary info =====\n"
           "tests/t.py::test_a PASSED   [ 50%]\n"
           "PASSED tests/t.py::test_a\n"
           "===== 1 passed =====\n"
           "FAILED tests/t.py::test_b - x\n")
    assert parse_pytest_log(log) == {"tests/t.py::test_a": "PASSED",
                                     "tests/t.py::test_b": "FAILED"}


@pytest.mark.parametrize("first,second,kept", [
    # our rule (module docstring: "the worst status wins"); the original keeps `second`
    ("FAILED", "PASSED", "FAILED"),
    ("ERROR", "XFAIL", "ERROR"),
    ("SKIPPED", "PASSED", "SKIPPED"),
    ("ERROR", "FAILED", "ERROR"),
    # the two rules agree when the later line is the worse one
    ("PASSED", "FAILED", "FAILED"),
    ("FAILED", "ERROR", "ERROR"),
    ("XFAIL", "SKIPPED", "SKIPPED"),
    ("PASSED", "PASSED", "PASSED"),
])
def test_a_test_on_several_lines_keeps_its_worst_status(first, second, kept):
    """Deliberate difference 1: the original's ``test_status_map[id] = status`` keeps the last
    line; ours keeps the worst, so a fake later PASSED cannot hide a real FAILED."""
    log = f"{first} t.py::x - a\nPASSED t.py::other\n{second} t.py::x - b\n"
    assert parse_pytest_log(log) == {"t.py::x": kept, "t.py::other": "PASSED"}


def test_three_lines_for_one_test():
    log = "PASSED t.py::x\nFAILED t.py::x - boom\nPASSED t.py::x\n"
    assert parse_pytest_log(log) == {"t.py::x": "FAILED"}


# --------------------------------------------------------------------------- worst()


def test_worst_follows_the_documented_severity_order():
    """Our own rule (no counterpart in the original, which keeps the last line):
    ERROR < FAILED < MISSING < XPASS < XFAIL-CALL < SKIPPED < XFAIL < PASSED, every non-passing
    status below every passing one."""
    assert SEVERITY == ("ERROR", "FAILED", "MISSING", "XPASS", "XFAIL-CALL", "SKIPPED", "XFAIL",
                        "PASSED")
    for i, a in enumerate(SEVERITY):
        for j, b in enumerate(SEVERITY):
            assert worst(a, b) == SEVERITY[min(i, j)], (a, b)
    assert all(SEVERITY.index(s) > SEVERITY.index(f)
               for s in PASSING for f in set(SEVERITY) - PASSING)


def test_worst_treats_unknown_statuses_as_the_worst():
    """worst()'s docstring: unknown ones count as the worst."""
    for known in SEVERITY:
        assert worst("XPASSED", known) == "XPASSED"
        assert worst(known, "XPASSED") == "XPASSED"
    # two unknown ones tie: the first is kept
    assert worst("XPASSED", "BOGUS") == "XPASSED"
    assert worst("BOGUS", "XPASSED") == "BOGUS"


# --------------------------------------------------------------------------- grading


def _f2p_p2p_ok(report: GradeReport) -> tuple[str, str]:
    text = report.summary()
    f2p = text.split("(FAIL_TO_PASS): ")[1].split("\n")[0]
    p2p = text.split("(PASS_TO_PASS): ")[1].split("\n")[0]
    return f2p, p2p


# (status map, F2P, P2P, the original's get_resolution_status, its F2P success/total,
#  P2P success/total in ours, our score). Worked out with get_eval_tests_report + test_passed /
#  test_failed / test_maintained and compute_fail_to_pass / compute_pass_to_pass.
CASES = [
    # all F2P PASSED and P2P PASSED/XFAIL: f2p = 1, p2p = 1 -> RESOLVED_FULL
    ({"a": "PASSED", "b": "PASSED", "c": "XFAIL"}, ["a", "b"], ["c"], "FULL", "2/2", "1/1", 1.0),
    # one of the two F2P FAILED: 0 < f2p = 0.5 < 1, p2p = 1 -> RESOLVED_PARTIAL
    ({"a": "PASSED", "b": "FAILED", "c": "PASSED"}, ["a", "b"], ["c"], "PARTIAL", "1/2", "1/1",
     2 / 3),
    # F2P ERROR: test_failed -> failure; f2p = 0 -> RESOLVED_NO
    ({"a": "ERROR", "c": "PASSED"}, ["a"], ["c"], "NO", "0/1", "1/1", 0.5),
    # every F2P SKIPPED: test_failed counts SKIPPED (PR #598) -> f2p = 0 -> RESOLVED_NO
    ({"a": "SKIPPED", "b": "SKIPPED", "c": "PASSED"}, ["a", "b"], ["c"], "NO", "0/2", "1/1",
     1 / 3),
    # F2P absent from the log: _resolve_case -> None -> test_failed -> RESOLVED_NO
    ({"c": "PASSED"}, ["a"], ["c"], "NO", "0/1", "1/1", 0.5),
    # P2P FAILED / ERROR / absent: p2p < 1 -> RESOLVED_NO even with every F2P passing
    ({"a": "PASSED", "c": "FAILED"}, ["a"], ["c"], "NO", "1/1", "0/1", 0.5),
    ({"a": "PASSED", "c": "ERROR", "d": "PASSED"}, ["a"], ["c", "d"], "NO", "1/1", "1/2", 2 / 3),
    ({"a": "PASSED"}, ["a"], ["c"], "NO", "1/1", "0/1", 0.5),
    # partial F2P but a P2P regression: p2p < 1 -> RESOLVED_NO (not PARTIAL)
    ({"a": "PASSED", "b": "FAILED", "c": "FAILED"}, ["a", "b"], ["c"], "NO", "1/2", "0/1",
     1 / 3),
    # no P2P tests: compute_pass_to_pass returns 1 -> FULL with F2P passing
    ({"a": "PASSED"}, ["a"], [], "FULL", "1/1", "0/0", 1.0),
    # no F2P tests: compute_fail_to_pass returns 1 -> FULL with P2P passing
    ({"c": "PASSED"}, [], ["c"], "FULL", "0/0", "1/1", 1.0),
]


@pytest.mark.parametrize("sm,f2p,p2p,status,f2p_ok,p2p_ok,score", CASES)
def test_grade_matches_the_originals_resolution_status(sm, f2p, p2p, status, f2p_ok, p2p_ok,
                                                       score):
    report = grade(sm, f2p, p2p)
    # resolved is RESOLVED_FULL (ours has no PARTIAL: that is resolved=False, 0 < score < 1)
    assert report.resolved is (status == "FULL")
    if status == "PARTIAL":
        assert 0 < report.score < 1
    assert report.score == pytest.approx(score)
    # the summary's counts are len(report[FAIL_TO_PASS]["success"]) / len(F2P), same for P2P
    assert _f2p_p2p_ok(report) == (f2p_ok, p2p_ok)
    assert report.n_tests == len(f2p) + len(p2p)


def test_skipped_never_counts_as_passed():
    """F2P: the original's test_failed lists SKIPPED as a failure (PR #598). P2P: deliberate
    difference 2 - the original's test_maintained would make this RESOLVED_FULL; ours fails it."""
    f2p_skipped = grade({"a": "SKIPPED", "c": "PASSED"}, ["a"], ["c"])
    assert not f2p_skipped.resolved and f2p_skipped.n_passed == 1
    assert f2p_skipped.failing() == ["a"]
    p2p_skipped = grade({"a": "PASSED", "c": "SKIPPED"}, ["a"], ["c"])
    assert not p2p_skipped.resolved and p2p_skipped.score == 0.5
    assert p2p_skipped.failing() == ["c"]
    assert _f2p_p2p_ok(p2p_skipped) == ("1/1", "0/1")


def test_xfail_counts_as_passed_for_pass_to_pass_only():
    """test_passed: ``sm[key] in [PASSED, XFAIL]`` - kept for P2P. Deliberate difference 4: an
    F2P test that ends XFAIL was not fixed (the original would call this RESOLVED_FULL)."""
    report = grade({"a": "PASSED", "c": "XFAIL"}, ["a"], ["c"])
    assert report.resolved and report.n_passed == 2 and report.failing() == []
    f2p_xfail = grade({"a": "XFAIL", "c": "XFAIL"}, ["a"], ["c"])
    assert not f2p_xfail.resolved and f2p_xfail.failing() == ["a"]
    assert _f2p_p2p_ok(f2p_xfail) == ("0/1", "1/1") and f2p_xfail.score == 0.5


def test_a_single_passing_test_resolves():
    report = grade({"a": "PASSED"}, ["a"], [])
    assert report.n_tests == 1 and report.resolved and report.score == 1.0


def test_no_tests_is_not_resolved():
    """Deliberate difference 3: the original's empty ratios are 1 (RESOLVED_FULL); ours refuses
    to call an instance with nothing to check resolved."""
    report = grade({"a": "PASSED"}, [], [])
    assert report.n_tests == 0 and not report.resolved and report.score == 0.0


def test_missing_tests_are_reported_as_missing_in_both_lists():
    """Absent from the log -> _resolve_case None -> test_failed in the original."""
    report = grade({}, ["f"], ["p"])
    assert report.fail_to_pass == {"f": MISSING} and report.pass_to_pass == {"p": MISSING}
    assert report.failing() == ["f", "p"] and report.n_passed == 0


def test_grade_keeps_the_note_and_defaults_to_empty():
    assert grade({}, [], []).note == ""
    assert grade({}, [], [], note="test patch did not apply").note == "test patch did not apply"


def test_end_to_end_from_a_log():
    """A log through parse_pytest_log then grade: F2P b FAILED then PASSED (ours keeps FAILED,
    difference 1), F2P c XFAIL does not pass (difference 4), P2P a PASSED, P2P d never ran."""
    log = ("PASSED tests/t.py::a\nFAILED tests/t.py::b - AssertionError\n"
           "XFAIL tests/t.py::c - known\nPASSED tests/t.py::b\n")
    report = grade(parse_pytest_log(log), ["tests/t.py::b", "tests/t.py::c"],
                   ["tests/t.py::a", "tests/t.py::d"])
    assert report.fail_to_pass == {"tests/t.py::b": "FAILED", "tests/t.py::c": "XFAIL"}
    assert report.pass_to_pass == {"tests/t.py::a": "PASSED", "tests/t.py::d": MISSING}
    assert report.failing() == ["tests/t.py::b", "tests/t.py::c", "tests/t.py::d"]
    assert not report.resolved and report.score == 0.25


# --------------------------------------------------------------------------- report output


def test_as_dict_keys_and_values():
    report = grade({"a": "PASSED", "b": "FAILED"}, ["a"], ["b"], note="n")
    d = report.as_dict()
    assert d == {"resolved": False, "score": 0.5, "fail_to_pass": {"a": "PASSED"},
                 "pass_to_pass": {"b": "FAILED"}, "note": "n"}
    # copies: editing the dict does not change the report
    d["fail_to_pass"]["a"] = "FAILED"
    d["pass_to_pass"]["b"] = "PASSED"
    assert report.fail_to_pass == {"a": "PASSED"} and report.pass_to_pass == {"b": "FAILED"}
    assert grade({"a": "PASSED"}, ["a"], []).as_dict() == {
        "resolved": True, "score": 1.0, "fail_to_pass": {"a": "PASSED"}, "pass_to_pass": {},
        "note": ""}


def test_summary_text():
    """Our observation text (no counterpart in the original): counts, result, score; the note,
    when there is one, comes first."""
    report = grade({"a": "PASSED", "b": "SKIPPED", "c": "PASSED", "d": "FAILED"},
                   ["a", "b"], ["c", "d", "e"])
    assert report.summary() == (
        "Tests that should now pass (FAIL_TO_PASS): 1/2\n"
        "Tests that must keep passing (PASS_TO_PASS): 1/3\n"
        "Result: NOT RESOLVED (score 0.400)")
    ok = grade({"a": "PASSED", "c": "XFAIL"}, ["a"], ["c"], note="timeout after 60 s")
    assert ok.summary() == (
        "timeout after 60 s\n"
        "Tests that should now pass (FAIL_TO_PASS): 1/1\n"
        "Tests that must keep passing (PASS_TO_PASS): 1/1\n"
        "Result: RESOLVED (score 1.000)")
