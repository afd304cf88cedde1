"""Grading the SWE-bench way: parse the pytest log, then check FAIL_TO_PASS and PASS_TO_PASS.

The log parser follows the rule SWE-bench's harness applies to ``pytest -rA`` output (our own
implementation): every line that starts with a status word gives one test id; for ``FAILED``
lines the `` - `` before the error message is dropped first; the id is the second
whitespace-separated token. Ids in the datasets that were cut at a space match, because the
token is cut at the same place.

A test counts as passing when its status is ``PASSED`` or ``XFAIL`` (an expected failure), as in
the harness, with one difference: a ``FAIL_TO_PASS`` test passes only when ``PASSED``. The
harness measures a model on fixed tests; here the reward trains a policy, and a patch that makes
the code under test call ``pytest.xfail()`` turns every failing test into ``XFAIL`` without fixing
anything. ``SKIPPED`` never passes. A test that does not appear in the log (not collected, a
crash before it ran) counts as failing. When a test appears more than once, the worst status
wins (a later ``PASSED`` line cannot hide a ``FAILED`` one).

The log is a weak channel: the code under test writes to it too. The local backend does not use
it: :mod:`crl_bench.envs.swe.evaluation` reads per-test outcomes from pytest's own reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

STATUSES: tuple[str, ...] = ("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL")
PASSING: frozenset[str] = frozenset({"PASSED", "XFAIL"})  # the harness's test_passed
# A FAIL_TO_PASS test must pass for real: ending XFAIL is not fixing it (see module doc).
PASSING_F2P: frozenset[str] = frozenset({"PASSED"})
MISSING = "MISSING"  # status reported for a test that is absent from the log


# worst first: when a test id has several statuses, the one that comes first here is kept
SEVERITY: tuple[str, ...] = ("ERROR", "FAILED", "MISSING", "XPASS", "XFAIL-CALL", "SKIPPED",
                             "XFAIL", "PASSED")


def worst(a: str, b: str) -> str:
    """The worse of two statuses (unknown ones count as the worst)."""
    rank = {s: i for i, s in enumerate(SEVERITY)}
    return a if rank.get(a, -1) <= rank.get(b, -1) else b


def parse_pytest_log(log: str) -> dict[str, str]:
    """Map test id -> status from a ``pytest -rA`` log; a test listed twice keeps its worst.

    >>> parse_pytest_log("PASSED tests/t.py::test_a\\nFAILED tests/t.py::test_b - assert 1 == 2")
    {'tests/t.py::test_a': 'PASSED', 'tests/t.py::test_b': 'FAILED'}
    """
    statuses: dict[str, str] = {}
    for raw in log.splitlines():
        line = raw.strip()
        if not line.startswith(STATUSES):
            continue
        if line.startswith("FAILED"):
            line = line.replace(" - ", " ")
        tokens = line.split()
        if len(tokens) < 2 or tokens[0] not in STATUSES:
            continue
        tid, status = tokens[1], tokens[0]
        statuses[tid] = worst(statuses[tid], status) if tid in statuses else status
    return statuses


@dataclass
class GradeReport:
    """The outcome of one graded submission.

    Attributes:
        fail_to_pass: id -> status for each FAIL_TO_PASS test (``MISSING`` when not in the log).
        pass_to_pass: id -> status for each PASS_TO_PASS test.
        resolved: every FAIL_TO_PASS and PASS_TO_PASS test passed.
        score: fraction of those tests that passed, in [0, 1].
        note: why grading could not run normally (test patch did not apply, timeout, ...).
    """

    fail_to_pass: dict[str, str] = field(default_factory=dict)
    pass_to_pass: dict[str, str] = field(default_factory=dict)
    note: str = ""

    @property
    def n_tests(self) -> int:
        return len(self.fail_to_pass) + len(self.pass_to_pass)

    def _passed(self) -> list[bool]:
        return ([s in PASSING_F2P for s in self.fail_to_pass.values()]
                + [s in PASSING for s in self.pass_to_pass.values()])

    @property
    def n_passed(self) -> int:
        return sum(self._passed())

    @property
    def resolved(self) -> bool:
        return self.n_tests > 0 and self.n_passed == self.n_tests

    @property
    def score(self) -> float:
        return self.n_passed / self.n_tests if self.n_tests else 0.0

    def failing(self) -> list[str]:
        return [t for t, ok in zip((*self.fail_to_pass, *self.pass_to_pass), self._passed())
                if not ok]

    def as_dict(self) -> dict[str, object]:
        return {"resolved": self.resolved, "score": self.score,
                "fail_to_pass": dict(self.fail_to_pass), "pass_to_pass": dict(self.pass_to_pass),
                "note": self.note}

    def summary(self) -> str:
        """A short text for the agent's final observation (which tests failed, not their code)."""
        f2p_ok = sum(s in PASSING_F2P for s in self.fail_to_pass.values())
        p2p_ok = sum(s in PASSING for s in self.pass_to_pass.values())
        lines = [f"Tests that should now pass (FAIL_TO_PASS): {f2p_ok}/{len(self.fail_to_pass)}",
                 f"Tests that must keep passing (PASS_TO_PASS): {p2p_ok}/{len(self.pass_to_pass)}",
                 "Result: " + ("RESOLVED" if self.resolved else "NOT RESOLVED")
                 + f" (score {self.score:.3f})"]
        if self.note:
            lines.insert(0, self.note)
        return "\n".join(lines)


def grade(statuses: Mapping[str, str], fail_to_pass: Iterable[str],
          pass_to_pass: Iterable[str], note: str = "") -> GradeReport:
    """Look up each required test in ``statuses`` (from :func:`parse_pytest_log`)."""
    return GradeReport(
        fail_to_pass={t: statuses.get(t, MISSING) for t in fail_to_pass},
        pass_to_pass={t: statuses.get(t, MISSING) for t in pass_to_pass},
        note=note)
