"""SWE env parts that need no sandbox: pytest-log parsing, grading arithmetic, diffs, action
syntax and SWE-bench record loading. Expected values are worked out by hand."""

from __future__ import annotations

import json

import pytest

from _data_paths import missing_data_reason, shared_data_dir
from crl_bench.envs.swe.grading import MISSING, grade, parse_pytest_log
from crl_bench.envs.swe.patches import (PatchParseError, apply_hunks, parse_patch, patch_files,
                                        patch_to_actions)
from crl_bench.envs.swe.sandbox import SandboxLimits, truncate_middle
from crl_bench.envs.swe.tasks import SWETask, TaskFormatError, load_instances
from crl_bench.envs.swe.tools import ActionError, parse_action

LOG = """\
============================= test session starts ==============================
tests/test_a.py::test_one PASSED                                         [ 20%]
=========================== short test summary info ============================
PASSED tests/test_a.py::test_one
PASSED tests/test_a.py::test_param[a b]
FAILED tests/test_a.py::test_two - AssertionError: assert 1 == 2
ERROR tests/test_b.py::test_fixture - fixture 'db' not found
SKIPPED [1] tests/test_b.py:10: needs network
XFAIL tests/test_b.py::test_known - reason: flaky
=================== 1 failed, 2 passed, 1 skipped, 1 xfailed ===================
"""


def test_parse_pytest_log_takes_the_second_token_of_status_lines():
    assert parse_pytest_log(LOG) == {
        "tests/test_a.py::test_one": "PASSED",
        # an id with a space is cut at the space, exactly as the datasets' ids are
        "tests/test_a.py::test_param[a": "PASSED",
        "tests/test_a.py::test_two": "FAILED",
        "tests/test_b.py::test_fixture": "ERROR",
        "[1]": "SKIPPED",
        "tests/test_b.py::test_known": "XFAIL",
    }


def test_parse_pytest_log_failed_line_with_dash_before_the_message():
    # " - " is removed before splitting, so the id is still token 1
    assert parse_pytest_log("FAILED t.py::x - boom") == {"t.py::x": "FAILED"}
    assert parse_pytest_log("PASSED") == {}
    assert parse_pytest_log("PASSEDX t.py::y") == {}


def test_grade_counts_passed_and_xfail_and_missing_by_hand():
    statuses = parse_pytest_log(LOG)
    report = grade(statuses,
                   fail_to_pass=["tests/test_a.py::test_two", "tests/test_b.py::test_known"],
                   pass_to_pass=["tests/test_a.py::test_one", "tests/test_a.py::test_param[a",
                                 "tests/test_c.py::never_ran"])
    # passing: test_one, test_param[a -> 2 of 5 (test_known is FAIL_TO_PASS and XFAIL: an
    # expected failure is not a fix, so it does not pass)
    assert report.n_tests == 5 and report.n_passed == 2
    assert report.score == pytest.approx(0.4)
    assert not report.resolved
    assert report.pass_to_pass["tests/test_c.py::never_ran"] == MISSING
    assert sorted(report.failing()) == ["tests/test_a.py::test_two", "tests/test_b.py::test_known",
                                        "tests/test_c.py::never_ran"]
    assert "(FAIL_TO_PASS): 0/2" in report.summary()


def test_grade_all_passing_is_resolved():
    report = grade({"a": "PASSED", "b": "XFAIL"}, ["a"], ["b"])
    assert report.resolved and report.score == 1.0


DIFF = """\
diff --git a/pkg/mod.py b/pkg/mod.py
index 1111111..2222222 100644
--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -1,4 +1,4 @@
 def f(x):
-    return x + 1
+    return x + 2
 
 
@@ -8,3 +8,4 @@ def g():
 def h():
     pass
 # end
+# added
diff --git a/pkg/new.py b/pkg/new.py
new file mode 100644
index 0000000..3333333
--- /dev/null
+++ b/pkg/new.py
@@ -0,0 +1,2 @@
+A = 1
+B = 2
diff --git a/old.txt b/old.txt
deleted file mode 100644
index 4444444..0000000
--- a/old.txt
+++ /dev/null
@@ -1 +0,0 @@
-gone
"""

ORIGINAL = "def f(x):\n    return x + 1\n\n\ndef g():\n    pass\n\ndef h():\n    pass\n# end\n"


def test_parse_patch_files_and_hunks():
    files = parse_patch(DIFF)
    assert [(f.old_path, f.new_path) for f in files] == [
        ("pkg/mod.py", "pkg/mod.py"), (None, "pkg/new.py"), ("old.txt", None)]
    first = files[0].hunks[0]
    assert first.old == ["def f(x):\n", "    return x + 1\n", "\n", "\n"]
    assert first.new == ["def f(x):\n", "    return x + 2\n", "\n", "\n"]
    assert files[0].hunks[1].new[-1] == "# added\n"
    assert patch_files(DIFF) == ["pkg/mod.py", "pkg/new.py", "old.txt"]


def test_apply_hunks_matches_git_semantics_on_a_small_file():
    patched = apply_hunks(ORIGINAL, parse_patch(DIFF)[0].hunks)
    assert patched == ORIGINAL.replace("x + 1", "x + 2") + "# added\n"


def test_patch_to_actions_replays_with_the_env_syntax():
    actions = patch_to_actions(DIFF, read_file=lambda path: ORIGINAL)
    assert actions[0].startswith("replace pkg/mod.py\n<<<<<<< SEARCH\ndef f(x):\n")
    assert actions[2] == "create pkg/new.py\nA = 1\nB = 2\n"
    assert actions[3] == "run rm -f -- old.txt"
    parsed = parse_action(actions[0])
    (body, splits), = parsed.blocks
    assert "\n".join(body[:splits[0]]) == "def f(x):\n    return x + 1\n\n"


def test_patch_to_actions_falls_back_to_whole_file_when_a_hunk_is_ambiguous():
    twice = ORIGINAL + ORIGINAL
    actions = patch_to_actions(DIFF, read_file=lambda path: twice)
    assert actions[0].startswith("create pkg/mod.py\n")
    with pytest.raises(PatchParseError):
        patch_to_actions("@@ -1 +1 @@\n-a\n+b\n")


@pytest.mark.parametrize("text, tool", [
    ("run ls -la", "run"),
    ("```bash\nrun python -c 'print(1)'\n```", "run"),
    ("view handykit/text.py 10-20", "view"),
    ("VIEW .", "view"),
    ('search "def parse(" handykit', "search"),
    ("create a.py\nprint('hi')\n", "create"),
    ("submit", "submit"),
    ("  help  ", "help"),
])
def test_parse_valid_actions(text, tool):
    assert parse_action(text).tool == tool


def test_parse_action_details():
    view = parse_action("view src/a.py 40-80")
    assert (view.path, view.start, view.end) == ("src/a.py", 40, 80)
    assert parse_action("view a.py 5").end is None
    search = parse_action('search "two words" src/')
    assert (search.text, search.path) == ("two words", "src/")
    run = parse_action("run for i in 1 2; do\n  echo $i\ndone")
    assert run.text == "for i in 1 2; do\n  echo $i\ndone"


@pytest.mark.parametrize("text, fragment", [
    ("", "Empty action"),
    ("look", "Unknown tool 'look'"),
    ("serach foo", "Did you mean `search`"),
    ("view", "needs a path"),
    ("view a.py 9-3", "Bad line range"),
    ("view a.py lots", "Bad line range"),
    ("search", "needs text"),
    ('search "unbalanced', "Unbalanced quotes"),
    ("search a b c", "at most one path"),
    ("replace a.py\nold\nnew", "Expected `<<<<<<< SEARCH`"),
    ("replace a.py\n<<<<<<< SEARCH\nold\n=======\nnew", "not closed"),
    ("replace a.py\n<<<<<<< SEARCH\nold\nnew\n>>>>>>> REPLACE", "no `=======`"),
    ("create", "needs a path"),
    ("submit now", "takes no arguments"),
    ("run   ", "needs a command"),
])
def test_parse_invalid_actions_explain_the_fix(text, fragment):
    with pytest.raises(ActionError, match=None) as err:
        parse_action(text)
    assert fragment in str(err.value)


def test_truncate_middle_keeps_head_and_tail_with_a_marker():
    text = "A" * 50 + "B" * 50
    out = truncate_middle(text, 20)
    assert out.startswith("A" * 10) and out.endswith("B" * 10)
    assert "80 characters of output omitted" in out
    assert truncate_middle("short", 20) == "short"


def test_sandbox_limits_reject_nonsense():
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ValueError, match="output_hard_bytes"):
        SandboxLimits(output_keep_bytes=10, output_hard_bytes=5)


RECORD = {"instance_id": "o__r-1", "repo": "o/r", "base_commit": "abc",
          "problem_statement": "p", "patch": DIFF, "test_patch": DIFF,
          "FAIL_TO_PASS": json.dumps(["t::a"]), "PASS_TO_PASS": ["t::b"], "custom": 7}


def test_load_instances_json_and_jsonl(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([RECORD]))
    (tmp_path / "b.jsonl").write_text(json.dumps(RECORD) + "\n\n")
    for name in ("a.json", "b.jsonl"):
        (task,) = load_instances(tmp_path / name)
        assert task.fail_to_pass == ("t::a",) and task.pass_to_pass == ("t::b",)
        assert task.extra == {"custom": 7}
        assert task.test_files == ("pkg/mod.py", "pkg/new.py", "old.txt")
        again = SWETask.from_record(task.to_record())
        assert again == task


@pytest.mark.parametrize("change, fragment", [
    ({"patch": None}, "missing SWE-bench field"),
    ({"FAIL_TO_PASS": "[oops"}, "not a JSON list"),
    ({"FAIL_TO_PASS": "[]"}, "FAIL_TO_PASS is empty"),
    ({"PASS_TO_PASS": [1, 2]}, "list of test-id strings"),
])
def test_bad_records_name_the_field(tmp_path, change, fragment):
    record = {k: v for k, v in {**RECORD, **change}.items() if v is not None}
    (tmp_path / "x.json").write_text(json.dumps([record]))
    with pytest.raises(TaskFormatError) as err:
        load_instances(tmp_path / "x.json")
    assert fragment in str(err.value)


def test_duplicate_ids_and_bad_json(tmp_path):
    (tmp_path / "d.jsonl").write_text(json.dumps(RECORD) + "\n" + json.dumps(RECORD) + "\n")
    with pytest.raises(TaskFormatError, match="duplicate instance_id"):
        load_instances(tmp_path / "d.jsonl")
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(TaskFormatError, match="bad.jsonl:1: bad JSON"):
        load_instances(tmp_path / "bad.jsonl")


SWE_DATA = shared_data_dir("swe")


@pytest.mark.skipif(SWE_DATA is None, reason=missing_data_reason("swe"))
def test_lite_dev_file_loads_and_the_recipe_task_set_lists_11():
    tasks = load_instances(SWE_DATA / "swebench_lite_dev.json")
    assert len(tasks) == 23
    from crl_bench.envs.swe.tasks import make_task_set

    lite = make_task_set("lite-dev-local", SWE_DATA)
    assert len(lite.task_ids("dev")) == 11 and lite.task_ids("all") == lite.task_ids("dev")
    task = lite.task("pvlib__pvlib-python-1154")
    assert task.test_files == ("pvlib/tests/test_irradiance.py",)
    assert task.fail_to_pass == ("pvlib/tests/test_irradiance.py::test_reindl",)
    with pytest.raises(ValueError, match="no split 'train'"):
        lite.task_ids("train")
