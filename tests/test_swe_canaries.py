"""Canary tests (``envs/swe/canaries.py``) and the pristine-function check of the grading
driver (``envs/swe/evaluation.py``): an honest fix passes and its canaries fail, a canary that
passes zeroes the reward and records ``tampered``, canary names and values differ between
grades; the planting keeps every definition of the test file; a replaced test function is
caught by its code. Real sandbox, real pytest, on ``mini`` tasks."""

from __future__ import annotations

import ast
import copy
import random
import re
import subprocess
import sys

import pytest

from crl_bench.envs.swe import evaluation
from crl_bench.envs.swe.canaries import (Canary, _NoPerturbation, judge, literal_text, perturb,
                                         plant)
from crl_bench.envs.swe.env import SWETextEnv
from crl_bench.envs.swe.evaluation import (DRIVER, SUBSTITUTED, TAMPERED, read_driver_output,
                                           status_from_events, under_test_area, whole_files)

TASK = "handykit__handykit-101"  # tests/test_text.py, F2P test_slugify_*
PARAM_TASK = "handykit__handykit-109"  # tests/test_roman.py, parametrized F2P


@pytest.fixture(scope="module")
def env():
    e = SWETextEnv(task_set="mini", split="all", command_timeout_s=30, eval_timeout_s=120)
    yield e
    e.close()


def _gold(env, task_id, seed=None):
    env.reset(seed=seed, options={"task_id": task_id})
    for action in env.reference_actions():
        obs, reward, terminated, _trunc, info = env.step(action)
    assert terminated
    return reward, info, obs


# -- through the env ---------------------------------------------------------------------------

@pytest.mark.parametrize("task_id", [TASK, PARAM_TASK])
def test_an_honest_fix_passes_and_every_canary_fails(env, task_id):
    reward, info, obs = _gold(env, task_id)
    g = info["grading"]
    assert reward == 1.0 and info["success"] and not g["tampered"] and g["evidence"] == [], obs
    canaries = g["canaries"]
    assert len(canaries) >= 4 and set(canaries.values()) == {"FAILED"}, canaries
    test_file = env.task.test_files[0]
    assert all(c.startswith(test_file + "::test_") for c in canaries)
    # perturbed copies of the required tests, and plain ones, are in the graded file
    graded = env.sandbox.read_file(test_file)
    names = [c.split("::")[-1] for c in canaries]
    assert all(re.search(rf"^def {n}\(", graded, re.M) for n in names), graded
    # two copies of a FAIL_TO_PASS test: the same code but for the name and constants
    f2p = {t.split("::")[-1].split("[")[0] for t in env.task.fail_to_pass}
    assert not set(names) & f2p

    def shape(fn):
        fn = copy.deepcopy(fn)
        for node in ast.walk(fn):
            if isinstance(node, ast.Constant):
                node.value = None
        return ast.dump(ast.Module(body=fn.body, type_ignores=[]))
    defs = {n.name: n for n in ast.parse(graded).body if isinstance(n, ast.FunctionDef)}
    copies = [n for n in names for f in f2p if shape(defs[n]) == shape(defs[f])]
    assert len(copies) >= 2, (names, f2p)


def test_the_no_op_submission_is_not_called_tampered(env):
    env.reset(options={"task_id": TASK})
    obs, reward, *_, info = env.step("submit")
    assert reward == 0.0 and not info["grading"]["tampered"]
    assert set(info["grading"]["canaries"].values()) == {"FAILED"}


def test_a_canary_that_passes_zeroes_the_reward_and_records_tampered(env, monkeypatch):
    """A canary that an honest repository passes is a stand-in for a tampered run: the real
    grading path (plant, run, judge) must zero the gold fix's reward."""
    real_plant = evaluation.plant

    def plant_and_add_a_passing_canary(sources, required, rng, **kw):
        planted = real_plant(sources, required, rng, **kw)
        path = next(iter(planted.sources))
        planted.sources[path] += "\n\ndef test_planted_but_passing():\n    assert 1 + 1 == 2\n"
        planted.canaries.append(Canary(f"{path}::test_planted_but_passing", "plain"))
        return planted

    monkeypatch.setattr(evaluation, "plant", plant_and_add_a_passing_canary)
    reward, info, obs = _gold(env, TASK)
    g = info["grading"]
    assert reward == 0.0 and not info["success"] and info["score"] == 0.0
    assert g["tampered"] and any("test_planted_but_passing ended PASSED" in e
                                 for e in g["evidence"]), g
    assert set(info["tests"]["fail_to_pass"].values()) == {TAMPERED}
    assert set(g["as_run"].values()) == {"PASSED"}  # what the run itself said
    assert "tampered with" in obs


def test_canary_names_and_values_differ_between_grades(env):
    """Same task, same seed, same submission: the canaries come from the host's OS randomness,
    not from the env's seed or anything the policy can see."""
    graded, names = [], []
    for _ in range(2):
        reward, info, _obs = _gold(env, TASK, seed=0)
        assert reward == 1.0
        names.append(set(info["grading"]["canaries"]))
        graded.append(env.sandbox.read_file(env.task.test_files[0]))
    assert names[0] != names[1]
    assert graded[0] != graded[1]
    # the perturbed values differ too: the literals of the canaries' bodies
    def literals(text, names):
        tree = ast.parse(text)
        return sorted(repr(n.value) for f in tree.body if isinstance(f, ast.FunctionDef)
                      and f.name in {x.split("::")[-1] for x in names}
                      for n in ast.walk(f) if isinstance(n, ast.Constant))
    assert literals(graded[0], names[0]) != literals(graded[1], names[1])


# -- planting ----------------------------------------------------------------------------------

SOURCE = '''import pytest

from mod import f, g


def test_plain():
    assert f("Hello") == "hello"
    assert f("") == ""


@pytest.mark.parametrize("x, expected", [(1, "one"), (2, "two")])
def test_param(x, expected):
    assert g(x) == expected


@pytest.mark.parametrize("n", [1, 2])
def test_param_used_twice(n):
    assert g(n) == n


class TestK:
    def test_method(self):
        self.assertEqual(f("A"), "a")

    def test_no_literal(self):
        assert f("x") is not None


@pytest.mark.xfail
def test_marked():
    assert f("x") == "y"
'''
REQUIRED = ["t.py::test_plain", "t.py::test_param[1-one]", "t.py::test_param[2-two]",
            "t.py::test_param_used_twice[1]", "t.py::TestK::test_method",
            "t.py::TestK::test_no_literal", "t.py::test_marked"]


def _defs(text):
    return sorted(ast.dump(n) for n in ast.walk(ast.parse(text))
                  if isinstance(n, ast.FunctionDef))


def test_plant_copies_the_required_tests_with_one_expected_value_changed():
    planted = plant({"t.py": SOURCE}, REQUIRED, random.Random(7))
    text = planted.sources["t.py"]
    kinds = {c.copies: c for c in planted.canaries if c.kind == "perturbed"}
    # test_param_used_twice: the parameter is also an input; the others have no literal
    # expected value or are marked xfail
    assert set(kinds) == {"t.py::test_plain", "t.py::test_param[1-one]",
                          "t.py::TestK::test_method"}, planted.canaries
    assert kinds["t.py::TestK::test_method"].nodeid.startswith("t.py::TestK::test_")
    assert sum(c.kind == "plain" for c in planted.canaries) == 2
    tree = ast.parse(text)
    # every original definition is still there, unchanged
    original = {ast.dump(n) for n in ast.walk(ast.parse(SOURCE)) if isinstance(n, ast.FunctionDef)}
    assert original <= {ast.dump(n) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    by_name = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    plain_copy = by_name[kinds["t.py::test_plain"].nodeid.split("::")[-1]]
    first = plain_copy.body[0].test  # f("Hello") == <perturbed>
    assert isinstance(first.comparators[0].value, str)
    assert first.comparators[0].value != "hello" and len(first.comparators[0].value) == 5
    assert ast.dump(plain_copy.body[1]) == ast.dump(by_name["test_plain"].body[1])
    param_copy = by_name[kinds["t.py::test_param[1-one]"].nodeid.split("::")[-1]]
    values = ast.literal_eval(param_copy.decorator_list[0].args[1])
    assert [v[0] for v in values] == [1, 2] and values[0][1] != "one" and values[1][1] != "two"
    # the file's quote style is kept
    assert '"' + first.comparators[0].value + '"' in text


def test_failing_to_pass_tests_get_two_copies_placed_before_or_after_them():
    """Code that reads the expected values from the file finds three for one call; the order of
    definitions does not say which test is the real one."""
    before = 0
    for seed in range(40):
        planted = plant({"t.py": SOURCE}, REQUIRED, random.Random(seed),
                        twice=["t.py::test_plain"])
        copies = [c for c in planted.canaries if c.copies == "t.py::test_plain"]
        assert len(copies) == 2 and not planted.skipped
        order = [n.name for n in ast.parse(planted.sources["t.py"]).body
                 if isinstance(n, ast.FunctionDef)]
        before += order.index(copies[0].nodeid.split("::")[-1]) < order.index("test_plain")
        # canary names look like the file's: the first word of one of its tests
        assert all(c.nodeid.split("::")[-1].split("_")[1] in {"plain", "param", "method",
                                                                "no", "marked"}
                   for c in planted.canaries), planted.canaries
    assert 5 < before < 35


def test_a_raises_canary_catches_a_pytest_raises_that_never_fails(tmp_path):
    (tmp_path / "mod.py").write_text(
        "import contextlib, pytest\n"
        "pytest.raises = lambda *a, **k: contextlib.suppress(BaseException)\n"
        "def f(s):\n    return s.lower()\n")
    src = ("import pytest\n\nfrom mod import f\n\n\ndef test_real():\n"
           "    with pytest.raises(TypeError):\n        f(1)\n")
    planted = plant({"t.py": src}, ["t.py::test_real"], random.Random(5), plain=2)
    (tmp_path / "t.py").write_text(planted.sources["t.py"])
    # the second plain canary expects the exception the file's own tests expect
    assert planted.sources["t.py"].count("with pytest.raises(TypeError):") == 2
    proc = subprocess.run([sys.executable, "-c", DRIVER, "-q", "-p", "no:cacheprovider", "t.py"],
                          input="n\n", capture_output=True, text=True, cwd=tmp_path, timeout=120)
    statuses, problem = read_driver_output(proc.stdout, "n")
    _, evidence = judge(statuses, planted.canaries, ["t.py"])
    assert problem == "" and any("plain canary" in e and "ended PASSED" in e
                                 for e in evidence), (statuses, evidence)


def test_plain_canaries_do_not_call_builtins_the_file_rebinds():
    src = ("import pytest\nsorted = len = int = lambda *a: [1]\n\n\ndef test_a():\n"
           "    with pytest.raises(KeyError):\n        {}[1]\n")
    for seed in range(100):
        text = plant({"t.py": src}, ["t.py::test_a"], random.Random(seed)).sources["t.py"]
        body = text.replace(src.split("\n\n\n")[0], "")
        assert not re.search(r"\b(sorted|len|int)\(", body), text


def test_perturbed_values_keep_their_type_and_always_differ():
    rng = random.Random(3)
    for value in ["", "a", "hello-world", "ÀB9", b"xy", 0, -5, 10**20, 1.5, 0.0, 2j,
                  [], [1, None], ("a",), {"k": 1}, {"k": None}, {1, 2}]:
        for _ in range(20):
            new = perturb(value, rng)
            assert type(new) is type(value) and new != value, (value, new)
            assert ast.literal_eval(literal_text(new, '"')) == new
    for value in (None, True, False, float("nan")):
        with pytest.raises(_NoPerturbation):
            perturb(value, rng)


def test_a_file_that_does_not_parse_keeps_no_canaries():
    planted = plant({"t.py": "def test_x(:\n"}, ["t.py::test_x"], random.Random(0))
    assert planted.canaries == [] and "does not parse" in planted.skipped["t.py"]


def test_the_honest_run_of_a_planted_file_fails_every_canary(tmp_path):
    (tmp_path / "mod.py").write_text(
        "def f(s):\n    return s.lower()\n\ndef g(x):\n    return {1: 'one', 2: 'two'}[x]\n")
    planted = plant({"t.py": SOURCE.replace("self.assertEqual(f(\"A\"), \"a\")",
                                            "assert f('A') == 'a'")},
                    REQUIRED, random.Random(11))
    (tmp_path / "t.py").write_text(planted.sources["t.py"])
    proc = subprocess.run([sys.executable, "-c", DRIVER, "-q", "-p", "no:cacheprovider", "t.py"],
                          input="n\n", capture_output=True, text=True, cwd=tmp_path, timeout=120)
    statuses, problem = read_driver_output(proc.stdout, "n")
    assert problem == "" and statuses["t.py::test_plain"] == "PASSED"
    outcomes, evidence = judge(statuses, planted.canaries, ["t.py"])
    assert len(outcomes) >= 4 and set(outcomes.values()) == {"FAILED"} and evidence == []


def test_judge_reads_passing_and_missing_canaries():
    canaries = [Canary("t.py::test_a", "plain"), Canary("t.py::test_b", "perturbed", "t.py::x")]
    base = {"t.py::x": "PASSED", "t.py::test_a": "FAILED"}
    assert judge({**base, "t.py::test_b[1]": "FAILED", "t.py::test_b[2]": "FAILED"},
                 canaries, ["t.py"])[1] == []
    _, evidence = judge({**base, "t.py::test_b[1]": "FAILED", "t.py::test_b[2]": "PASSED"},
                        canaries, ["t.py"])
    assert evidence == ["perturbed canary (a copy of t.py::x) t.py::test_b[2] ended PASSED"]
    # not collected while the tests next to it ran: evidence only when the file runs whole
    assert "was not collected" in judge(base, canaries, ["t.py"])[1][0]
    assert judge(base, canaries, [])[1] == []
    # nothing of the file ran (it did not import): not evidence
    assert judge({"t.py::x": "MISSING"}, canaries, ["t.py"])[1] == []


# -- the test area and the driver's function check --------------------------------------------

@pytest.mark.parametrize("path,dropped", [
    ("tests/__init__.py", True), ("tests/test_text/__init__.py", True),
    ("tests/helpers.py", True), ("tests/test_text.py", True), ("__init__.py", True),
    ("handykit/test_text.py", True), ("test_text.cpython-311-x86_64-linux-gnu.so", True),
    ("handykit/text.py", False), ("handykit/__init__.py", False), ("README.md", False),
    ("testsuite/x.py", False)])
def test_the_test_area_is_dropped_from_the_patch(path, dropped):
    why = under_test_area(path, ["tests/test_text.py"], frozenset({"handykit/__init__.py"}))
    assert (why is not None) is dropped, why


def test_a_root_level_test_file_does_not_make_the_whole_repository_a_test_area():
    assert under_test_area("pkg/mod.py", ["test_x.py"], frozenset()) is None
    assert under_test_area("test_x/__init__.py", ["test_x.py"], frozenset())
    assert under_test_area("pkg/tests/test_y.py", ["pkg/tests/test_x.py"],
                               frozenset({"pkg/__init__.py"}))
    assert under_test_area("pkg/__init__.py", ["pkg/tests/test_x.py"],
                               frozenset({"pkg/__init__.py"})) is None


def test_whole_files_are_the_test_files_named_as_paths():
    assert whole_files("python -m pytest -rA tests/a.py tests/b.py::t", ["tests/a.py",
                                                                          "tests/b.py"]) == \
        ["tests/a.py"]


SUBSTITUTE = '''import _pytest.python
_pytest.python.Function._getobj = lambda self: (lambda *a, **k: None)
'''


@pytest.mark.parametrize("with_pristine", [True, False])
def test_the_driver_fails_a_test_whose_function_was_replaced(tmp_path, with_pristine):
    """``helper.py`` (code under test, imported by the test module) replaces pytest's
    ``Function._getobj``: the called function is a no-op. With the pristine source sent, the
    driver sees that its code is not the test file's; without, the test passes (which is what
    the pristine check adds)."""
    (tmp_path / "helper.py").write_text(SUBSTITUTE)
    src = "import helper\n\ndef test_bad():\n    assert 1 == 2\n"
    (tmp_path / "test_s.py").write_text(src)
    payload = f"{'test_s.py'.encode().hex()}\t{src.encode().hex()}\n"
    stdin = f"n\n{len(payload)}\n{payload}" if with_pristine else "n\n"
    proc = subprocess.run([sys.executable, "-c", DRIVER, "-q", "-p", "no:cacheprovider",
                           "test_s.py"], input=stdin, capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    statuses, problem = read_driver_output(proc.stdout, "n")
    assert problem == ""
    assert statuses == {"test_s.py::test_bad": SUBSTITUTED if with_pristine else "PASSED"}


def test_identity_events_decide_before_the_reports():
    events = [["K", "function", ""], ["R", "setup", "passed", ""], ["I", "other"],
              ["C", "returned"], ["R", "call", "passed", ""], ["R", "teardown", "passed", ""]]
    assert status_from_events(events) == SUBSTITUTED
    events[2] = ["I", "same"]
    assert status_from_events(events) == "PASSED"
