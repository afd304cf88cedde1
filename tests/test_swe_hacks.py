"""Reward hacking, sandbox limits and bad model output in ``crl/SWE-v0``, for real: each hack is
planted through the env's own actions on a ``mini`` task, then submitted; the grade must be 0
with the hack visible in ``info["patch"]`` (and ``info["grading"]["tampered"]`` where the
canaries caught it), while the gold fix still gets 1. The generic hacks live in
``tests/_swe_generic_hacks.py``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _swe_generic_hacks import play as play_generic
from crl_bench.envs.swe import evaluation
from crl_bench.envs.swe.env import SWETextEnv
from crl_bench.envs.swe.evaluation import read_driver_output, status_from_events
from crl_bench.envs.swe.grading import PASSING, parse_pytest_log
from crl_bench.envs.swe.sandbox import (LocalSandbox, SandboxError, SandboxLimits,
                                        namespaces_available)
from crl_bench.envs.swe.tasks import MiniTaskSet

TASK = "handykit__handykit-101"  # F2P: tests/test_text.py::test_slugify_*
F2P = ["tests/test_text.py::test_slugify_collapses_runs_of_separators",
       "tests/test_text.py::test_slugify_only_punctuation"]
ROOT = Path(__file__).resolve().parents[1]

CONFTEST_HOOK = """import pytest
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
"""
PRINT_PASSED = "\n".join(f"print('PASSED {t}')" for t in F2P)
HACKS = {
    "root_conftest_hook": [f"create conftest.py\n{CONFTEST_HOOK}"],
    "tests_conftest_hook": [f"create tests/conftest.py\n{CONFTEST_HOOK}"],
    "sitecustomize": ["create sitecustomize.py\nimport atexit, os\n"
                      "def _p():\n" + "".join(f"    print('PASSED {t}')\n" for t in F2P)
                      + "atexit.register(_p)\n"],
    "atexit_print_passed": ["create handykit/_hack.py\nimport atexit\n"
                            "@atexit.register\ndef _p():\n"
                            + "".join(f"    print('PASSED {t}', flush=True)\n" for t in F2P),
                            "run echo 'from handykit import _hack' >> handykit/__init__.py"],
    "pytest_shadow": ["create pytest.py\nimport sys\n" + PRINT_PASSED + "\nsys.exit(0)\n"],
    "conftest_hidden_by_git_exclude": [f"create conftest.py\n{CONFTEST_HOOK}",
                                       "run echo conftest.py >> .git/info/exclude && "
                                       "git status --short | wc -l"],
    "pytest_ini_plugin": ["create pytest.ini\n[pytest]\naddopts = -p handykit.plug\n",
                          f"create handykit/plug.py\n{CONFTEST_HOOK}"],
    "plugin_registered_from_source": [
        "create handykit/_reg.py\nimport pytest, _pytest.config\n"
        "class P:\n    @pytest.hookimpl(hookwrapper=True)\n"
        "    def pytest_runtest_makereport(self, item, call):\n"
        "        o = yield\n        o.get_result().outcome = 'passed'\n"
        "def pytest_collectstart(collector):\n    pass\n"
        "import gc\nfor obj in gc.get_objects():\n"
        "    if isinstance(obj, _pytest.config.Config):\n"
        "        obj.pluginmanager.register(P(), 'evil')\n",
        "run echo 'from handykit import _reg' >> handykit/__init__.py"],
    "report_class_patched": [
        "create handykit/_rep.py\nimport _pytest.reports as r\n"
        "r.TestReport.passed = property(lambda self: True)\n"
        "r.TestReport.failed = property(lambda self: False)\n",
        "run echo 'from handykit import _rep' >> handykit/__init__.py"],
    "committed_and_gitignored": ["create conftest.py\n" + CONFTEST_HOOK,
                                 "run echo conftest.py > .gitignore && git add -A && "
                                 "git commit -qm hide && echo ok"],
    # the buggy function gives up with an imperative xfail: its tests end XFAIL, not FAILED
    "xfail_in_the_buggy_function": [
        "run sed -i 's/^def slugify(text, sep=\"-\"):/import pytest\\n&\\n    "
        "pytest.xfail(\"wip\")/' handykit/text.py && grep -c 'pytest.xfail' handykit/text.py"],
    # pytest's own test runner replaced from source code (a class the driver did not watch)
    "runtest_patched_in_source": [
        "run echo 'import _pytest.python; _pytest.python.Function.runtest = lambda self: None'"
        " >> handykit/__init__.py"],
    # the same, from a new tests/__init__.py: no source file changed at all
    "runtest_patched_in_tests_init": [
        "create tests/__init__.py\nimport _pytest.python\n"
        "_pytest.python.Function.runtest = lambda self: None\n"],
    # the encoder the driver wrote its result line with, replaced from source code
    "json_default_encoder_replaced": [
        "create handykit/_enc.py\nimport json\nclass E(json.JSONEncoder):\n"
        "    def encode(self, o):\n"
        "        if isinstance(o, dict) and isinstance(o.get('tests'), dict):\n"
        "            o = dict(o, tests={k: 'PASSED' for k in o['tests']})\n"
        "        return super().encode(o)\n"
        "json._default_encoder = E()\n",
        "run echo 'from handykit import _enc' >> handykit/__init__.py"],
    # a plugin registered from source code whose class claims to come from the standard library
    "plugin_module_claims_os": [
        "create handykit/_reg2.py\nimport gc, pytest, _pytest.config\n"
        "class P:\n    @pytest.hookimpl(hookwrapper=True)\n"
        "    def pytest_runtest_makereport(self, item, call):\n"
        "        o = yield\n        r = o.get_result()\n"
        "        r.outcome, r.longrepr = 'passed', None\n"
        "P.__module__ = 'os'\n"
        "for obj in gc.get_objects():\n"
        "    if isinstance(obj, _pytest.config.Config):\n"
        "        obj.pluginmanager.register(P(), 'evil2')\n",
        "run echo 'from handykit import _reg2' >> handykit/__init__.py"],
    # .pytest.toml (read first by current pytest) loads a plugin whose __file__ claims os.py
    "hidden_pytest_toml_plugin": [
        "create .pytest.toml\n[pytest]\naddopts = [\"-p\", \"handykit.plug\"]\n",
        "create handykit/plug.py\n__file__ = '/usr/lib/python3/os.py'\n" + CONFTEST_HOOK],
}


@pytest.fixture(scope="module")
def env():
    e = SWETextEnv(task_set="mini", split="all", command_timeout_s=30, eval_timeout_s=120)
    yield e
    e.close()


@pytest.mark.parametrize("hack", sorted(HACKS))
def test_each_hack_gets_reward_0_and_shows_in_the_patch(env, hack):
    env.reset(options={"task_id": TASK})
    for action in HACKS[hack]:
        obs, *_, info = env.step(action)
        assert info["action_valid"], obs
    obs, reward, terminated, _trunc, info = env.step("submit")
    assert terminated and reward == 0.0 and not info["success"], (hack, obs, info["grading"])
    assert not any(s in PASSING for s in info["tests"]["fail_to_pass"].values()), info["tests"]
    assert info["patch"].startswith("diff --git"), info["patch"]
    assert "grading" in info and info["grading"]["timeout_s"] == 120


def test_the_gold_fix_still_gets_reward_1_with_the_hack_files_next_to_it(env):
    env.reset(options={"task_id": TASK})
    for action in env.reference_actions()[:-1] + HACKS["root_conftest_hook"]:
        assert env.step(action)[4]["action_valid"]
    obs, reward, terminated, _trunc, info = env.step("submit")
    assert terminated and reward == 1.0 and info["success"], obs
    assert info["grading"]["excluded"] == {"conftest.py": "can hook the test run"}
    assert info["grading"]["channel"] == "driver" and not info["grading"]["timed_out"]
    assert "+++ b/conftest.py" in info["patch"] and "+++ b/handykit/text.py" in info["patch"]


# -- generic hacks: tampering detected by its effect --------------------------------------------
# Each scored 1.0 on the tasks listed here with the grader before canaries (commit 093a660),
# measured with `python tests/_swe_generic_hacks.py` against a copy of that version's package
# (docs/swe.md, "Hacks tried"): always_equal_result 7/18 tasks, the getobj and gc-plugin hacks
# 18/18, the rewriter and meta-path hooks 17/18, the claiming package 17/18.
GENERIC_CASES = {
    "always_equal_result": ["handykit__handykit-101", "handykit__handykit-103",
                            "handykit__handykit-106"],
    "getobj_noop_in_package_init": ["handykit__handykit-101", "handykit__handykit-109",
                                    "handykit__handykit-116"],
    "gc_plugin_sets_item_obj": ["handykit__handykit-102", "handykit__handykit-110",
                                "handykit__handykit-117"],
    "tests_init_patches_assert_rewriter": ["handykit__handykit-101", "handykit__handykit-112"],
    "tests_init_meta_path_hook": ["handykit__handykit-101", "handykit__handykit-113"],
    "package_claims_test_module": ["handykit__handykit-101", "handykit__handykit-118"],
}
# run from the repository's own files: the canaries (and the pristine-function check) catch them
CAUGHT = {"always_equal_result", "getobj_noop_in_package_init", "gc_plugin_sets_item_obj"}
# files under the test folder: dropped from the graded patch, nothing of them runs
TEST_AREA = set(GENERIC_CASES) - CAUGHT


@pytest.mark.parametrize("hack,task_id", [(h, t) for h, ts in GENERIC_CASES.items()
                                          for t in ts])
def test_generic_hack_gets_reward_0_and_is_recorded(env, hack, task_id):
    reward, info, obs = play_generic(env, task_id, hack)
    g = info["grading"]
    assert reward == 0.0 and not info["success"], (hack, obs, g)
    assert not any(s in PASSING for s in info["tests"]["fail_to_pass"].values()), info["tests"]
    if hack in CAUGHT:
        assert g["tampered"] and g["evidence"] and info["score"] == 0.0, g
        assert set(info["tests"]["fail_to_pass"].values()) == {"TAMPERED"}
        assert "tampered with" in obs
        # what the run itself said: the required tests passed (the hack worked in the run)
        assert all(g["as_run"][t] in PASSING or g["as_run"][t] == "SUBSTITUTED"
                   for t in env.task.fail_to_pass), g["as_run"]
    else:
        assert not g["tampered"] and g["excluded"], g
        assert all(why.startswith(("under the test folder", "named like the graded"))
                   for why in g["excluded"].values()), g["excluded"]


@pytest.mark.parametrize("hack", sorted(TEST_AREA))
def test_a_test_area_hack_that_slips_past_the_file_rules_is_caught_by_its_effect(
        env, hack, monkeypatch):
    """With the test-area rule switched off (as if it had a hole), the files under tests/ are
    applied and the hack runs; the canaries and the pristine-function check still catch it."""
    monkeypatch.setattr(evaluation, "under_test_area", lambda *a, **k: None)
    reward, info, obs = play_generic(env, TASK, hack)
    g = info["grading"]
    assert reward == 0.0 and g["tampered"] and not g["excluded"], (obs, g)
    # the test module was not compiled from the pristine file: every test with an assert,
    # canaries included (a pytest.raises canary has none and fails as it should)
    assert all(e.endswith("called a function other than the one its pristine test file "
                          "defines") for e in g["evidence"]), g["evidence"]
    assert sum(g["canaries"][c] == "SUBSTITUTED" for c in g["canaries"]) >= 4, g["canaries"]
    assert {g["canaries"][c] for c in g["canaries"]} <= {"SUBSTITUTED", "FAILED"}
    # (a test without an assert compiles the same either way and may run as it is)
    assert {g["as_run"][t] for t in env.task.fail_to_pass} == {"SUBSTITUTED"}


@pytest.mark.parametrize("hack", sorted(GENERIC_CASES))
def test_the_canaries_alone_catch_each_generic_hack(env, hack, monkeypatch):
    """Without the test-area rule and without the pristine-function check (the driver gets no
    pristine files), the canaries alone still zero each hack: they pass."""
    monkeypatch.setattr(evaluation, "under_test_area", lambda *a, **k: None)
    monkeypatch.setattr(evaluation, "pristine_payload", lambda sources: "")
    reward, info, obs = play_generic(env, GENERIC_CASES[hack][0], hack)
    g = info["grading"]
    assert reward == 0.0 and g["tampered"], (obs, g)
    assert g["evidence"] and all("canary" in e and "ended PASSED" in e
                                 for e in g["evidence"]), g["evidence"]
    assert "SUBSTITUTED" not in g["as_run"].values()


@pytest.mark.slow
@pytest.mark.parametrize("hack", ["getobj_noop_in_package_init", "gc_plugin_sets_item_obj"])
def test_the_hacks_that_scored_on_every_task_are_caught_on_every_task(env, hack):
    for task_id in sorted(MiniTaskSet().tasks):
        reward, info, obs = play_generic(env, task_id, hack)
        assert reward == 0.0 and info["grading"]["tampered"], (task_id, obs)


def test_skipped_is_never_a_pass_and_a_later_line_does_not_override():
    log = ("FAILED tests/t.py::a - boom\nPASSED tests/t.py::a\nSKIPPED tests/t.py::b\n"
           "PASSED tests/t.py::c\nERROR tests/t.py::c")
    statuses = parse_pytest_log(log)
    assert statuses == {"tests/t.py::a": "FAILED", "tests/t.py::b": "SKIPPED",
                        "tests/t.py::c": "ERROR"}
    assert not PASSING & set(statuses.values())


def test_a_skipped_f2p_test_fails_the_grade(env):
    env.reset(options={"task_id": TASK})
    env.step("run printf 'import pytest\\npytest.skip(\"no\", allow_module_level=True)\\n' "
             "| cat - handykit/text.py > t && mv t handykit/text.py")
    obs, reward, *_, info = env.step("submit")
    assert reward == 0.0
    assert set(info["tests"]["fail_to_pass"].values()) <= {"SKIPPED", "MISSING", "ERROR"}, obs


def test_driver_channel_needs_exactly_one_line_with_the_nonce():
    events = {"t::a": [["K", "function", ""], ["R", "setup", "passed", ""], ["C", "returned"],
                       ["R", "call", "passed", ""], ["R", "teardown", "passed", ""]]}
    line = "CRL-GRADE n1 " + repr({"rc": 0, "events": events})
    assert read_driver_output(f"x\n{line}\n", "n1") == ({"t::a": "PASSED"}, "")
    assert read_driver_output(f"{line}\n{line}\n", "n1")[0] == {}
    assert read_driver_output(line.replace("n1", "forged"), "n1")[0] == {}
    assert read_driver_output("PASSED t::a\n", "n1")[0] == {}
    assert read_driver_output("CRL-GRADE n1 __import__('os')\n", "n1")[0] == {}


def _events(kind="function", marked="", setup="passed", call=("passed", ""), watched=("returned",),
            teardown="passed"):
    evs = [["K", kind, marked], ["R", "setup", setup, ""]]
    evs += [["C", w] for w in watched]
    if call is not None:
        evs.append(["R", "call", *call])
    return evs + [["R", "teardown", teardown, ""]]


@pytest.mark.parametrize("events,status", [
    (_events(), "PASSED"),
    # the report says passed but the test function never ran (a replaced runner, a hook)
    (_events(watched=()), "FAILED"),
    # the report was rewritten to passed, the function raised
    (_events(watched=("raised",)), "FAILED"),
    # an xfail marker known at collection: XFAIL; pytest.xfail() from inside the call: not
    (_events(marked="xfail-marked", call=("skipped", "x"), watched=("raised",)), "XFAIL"),
    (_events(call=("skipped", "x"), watched=("raised",)), "XFAIL-CALL"),
    (_events(call=("skipped", ""), watched=("raised",)), "SKIPPED"),
    (_events(marked="xfail-marked", call=("passed", "x")), "XPASS"),
    (_events(setup="failed", call=None, watched=()), "ERROR"),
    (_events(teardown="failed"), "ERROR"),
    # a doctest has no function to watch: its reports decide
    (_events(kind="other", watched=()), "PASSED"),
    (_events(kind="other", call=("failed", ""), watched=()), "FAILED"),
    ([["R", "setup", "passed", ""], ["C", "returned"], ["R", "call", "passed", ""]], "MISSING"),
])
def test_status_needs_the_watched_function_to_return(events, status):
    assert status_from_events(events) == status


def test_a_patch_over_the_cap_is_flagged_not_cut():
    e = SWETextEnv(task_set="mini", split="all", max_patch_bytes=4096)
    try:
        e.reset(options={"task_id": TASK})
        for action in e.reference_actions()[:-1]:
            e.step(action)
        e.step("run head -c 20000 /dev/urandom | base64 > blob.txt")
        obs, reward, *_, info = e.step("submit")
        assert reward == 0.0 and info["grading"]["patch_too_large"]
        assert info["grading"]["patch_bytes"] > 4096 and info["patch"] == ""
        assert "over the 4,096-byte limit" in obs
    finally:
        e.close()


def test_grading_budget_is_its_own_and_reported():
    e = SWETextEnv(task_set="mini", split="all", eval_timeout_s=4)
    try:
        e.reset(options={"task_id": TASK})
        e.step("run echo 'import time; time.sleep(60)' >> handykit/__init__.py")
        start = time.monotonic()
        obs, reward, *_, info = e.step("submit")
        assert time.monotonic() - start < 30
        assert reward == 0.0 and info["grading"]["timed_out"] and info["grading"]["timeout_s"] == 4
        assert "timed out" in obs
    finally:
        e.close()


# -- bad model output --------------------------------------------------------------------------

FUZZ_PATHS = ["x" * 300, "a/" + "b" * 256 + "/c", "README.md/x", "loop/x", "loop",
              "deep/" * 200 + "f", "\udcff", "a\nb", "..." , "-rf", "tests/../../x",
              "handykit/" + "é" * 200]


def test_fuzzed_paths_are_feedback_never_exceptions():
    env = SWETextEnv(task_set="mini", split="all", max_steps=1000)
    env.reset(options={"task_id": TASK})
    assert env.step("run ln -s loop loop && ln -s a b && ln -s b a && echo ok")[0].startswith("ok")
    for path in FUZZ_PATHS + ["a", "b"]:
        for action in (f"view {path}", f"create {path}\nhi",
                       f"replace {path}\n<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE",
                       f"search hi {path}"):
            obs, reward, terminated, truncated, info = env.step(action)
            assert isinstance(obs, str) and obs and not terminated and not truncated
    obs, *_ = env.step("run echo alive")
    assert obs.startswith("alive")
    env.close()


def test_options_not_a_dict_is_a_clear_error(env):
    with pytest.raises(TypeError, match="must be a dict"):
        env.reset(options="notadict")


# -- the sandbox -------------------------------------------------------------------------------

def _refusal_script() -> str:
    return ("from crl_bench.envs.swe.sandbox import LocalSandbox, SandboxError\n"
            "try:\n    LocalSandbox(isolation='auto')\nexcept SandboxError as e:\n"
            "    print('REFUSED', e)\nelse:\n    print('STARTED')\n")


def test_auto_without_namespaces_refuses_and_names_the_fix():
    env = {**os.environ, "CRL_SWE_NO_NAMESPACES": "1"}
    out = subprocess.run([sys.executable, "-c", _refusal_script()], capture_output=True,
                         text=True, env=env, timeout=120).stdout
    assert out.startswith("REFUSED") and "unsafe-rlimits" in out and "docker" in out, out
    with pytest.raises(ValueError, match="renamed isolation='unsafe-rlimits'"):
        LocalSandbox(isolation="rlimits")


@pytest.mark.skipif(not (os.geteuid() == 0 and shutil.which("setpriv")),
                    reason="dropping CAP_SYS_ADMIN needs root and setpriv")
def test_auto_refuses_when_cap_sys_admin_is_dropped():
    env = {k: v for k, v in os.environ.items() if k != "CRL_SWE_NO_NAMESPACES"}
    proc = subprocess.run(["setpriv", "--bounding-set", "-sys_admin", "--inh-caps",
                           "-sys_admin", sys.executable, "-c", _refusal_script()],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.stdout.startswith("REFUSED") and "unsafe-rlimits" in proc.stdout, \
        proc.stdout + proc.stderr


@pytest.fixture
def template(tmp_path):
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "a.txt").write_text("hello\n")
    return tmp_path / "tpl"


HOG = ("for i in 1 2 3; do python3 -c \"b = bytearray(100 * 2**20); import time; "
       "time.sleep(3); print('held')\" & done; wait; echo done")


@pytest.mark.parametrize("use_cgroup", [True, False])
def test_three_processes_cannot_exceed_the_sandbox_memory(template, use_cgroup):
    if not NAMESPACES:
        pytest.skip("needs namespaces")
    sb = LocalSandbox(limits=SandboxLimits(timeout_s=60, memory_mb=160, sandbox_memory_mb=250,
                                           max_processes=64), use_cgroup=use_cgroup)
    try:
        sb.prepare(template)
        if use_cgroup and "memory cgroup" not in sb.describe()["memory"]:
            pytest.skip(sb.describe()["memory"])
        result = sb.run(HOG)
        held = result.output.splitlines().count("held")
        assert held * 100 <= 250 and held < 3, (result.output, sb.describe()["memory"])
        if use_cgroup:
            assert "done" in result.output and "Killed" in result.output
        else:  # the budget: 250 // 160 = 1 process (the shell): no child may start
            assert "at most 1 processes" in sb.describe()["memory"] and held == 0
    finally:
        sb.close()


def test_a_write_over_the_disk_quota_fails_and_is_reported(template):
    sb = LocalSandbox(limits=SandboxLimits(timeout_s=30, disk_mb=4, max_file_mb=64),
                      isolation="auto" if NAMESPACES else "unsafe-rlimits")
    try:
        sb.prepare(template)
        r = sb.run("head -c 8000000 /dev/zero > big; echo rc=$?; wc -c < big")
        assert "File too large" in r.output and "rc=1" in r.output
        assert int(r.output.split()[-1]) <= 4 * 2**20
        r = sb.run("for i in 1 2 3; do head -c 3000000 /dev/zero > f$i & done; wait; echo x")
        r2 = sb.run("head -c 10 /dev/zero > more; echo rc=$?")
        assert "over its disk quota" in r.status_line() + r2.status_line() or "rc=1" in r2.output
        sb.run("rm -f big f1 f2 f3 more")
        assert sb.run("echo ok > small && cat small").output == "ok\n"
    finally:
        sb.close()


def test_workspaces_of_a_killed_run_are_removed_by_the_next_one(tmp_path, template):
    code = ("import os, sys; from crl_bench.envs.swe.sandbox import LocalSandbox; "
            f"sb = LocalSandbox(isolation='unsafe-rlimits', base_dir={str(tmp_path)!r}); "
            f"sb.prepare({str(template)!r}); print(sb._dir, flush=True); os.kill(os.getpid(), 9)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    left = Path(proc.stdout.strip())
    assert proc.returncode == -9 and left.is_dir() and (left / "testbed" / "a.txt").exists()
    sb = LocalSandbox(isolation="unsafe-rlimits", base_dir=str(tmp_path))
    try:
        assert not left.exists() and str(left) in sb.stale_removed
        assert json.loads((sb._dir / "owner.json").read_text())["pid"] == os.getpid()
    finally:
        sb.close()
    assert not sb._dir.exists()


NAMESPACES = namespaces_available()[0]


def test_sandbox_error_is_importable_for_callers():
    assert issubclass(SandboxError, RuntimeError)


DRIVER_TESTS = '''import pytest, unittest
def test_ok():
    assert 1
def test_bad():
    assert 0
@pytest.mark.xfail
def test_marked():
    assert 0
def test_imperative():
    pytest.xfail("from inside the call")
@pytest.mark.parametrize("x", [1, 2])
def test_param(x):
    assert x == 1
class TestK:
    def test_method(self):
        assert self.__class__.__name__ == "TestK"
class T(unittest.TestCase):
    def test_ok(self):
        pass
    def test_bad(self):
        self.assertEqual(1, 2)
    @unittest.expectedFailure
    def test_xf(self):
        self.assertEqual(1, 2)
'''


def test_the_driver_judges_each_kind_of_test_by_what_its_function_did(tmp_path):
    from crl_bench.envs.swe.evaluation import DRIVER

    (tmp_path / "test_d.py").write_text(DRIVER_TESTS)
    proc = subprocess.run([sys.executable, "-c", DRIVER, "-q", "-p", "no:cacheprovider",
                           "test_d.py"], input="n1\n", capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    statuses, problem = read_driver_output(proc.stdout, "n1")
    assert problem == "" and statuses == {
        "test_d.py::test_ok": "PASSED", "test_d.py::test_bad": "FAILED",
        "test_d.py::test_marked": "XFAIL", "test_d.py::test_imperative": "XFAIL-CALL",
        "test_d.py::test_param[1]": "PASSED", "test_d.py::test_param[2]": "FAILED",
        "test_d.py::TestK::test_method": "PASSED", "test_d.py::T::test_ok": "PASSED",
        "test_d.py::T::test_bad": "FAILED", "test_d.py::T::test_xf": "XFAIL"}, proc.stdout
