"""``crl/SWE-v0`` on the ``mini`` task set: contract, every task's base and gold patch through
the env's own actions, tools, grading rules and episode limits. Real sandbox, real pytest."""

from __future__ import annotations

import subprocess
import sys

import gymnasium
import pytest

import crl_bench  # noqa: F401  (registers the envs)
from crl_bench.env_check import FUZZ_ACTIONS, check_text_env
from crl_bench.envs.swe.env import SWETextEnv
from crl_bench.envs.swe.grading import PASSING
from crl_bench.envs.swe.sandbox import namespaces_available
from crl_bench.envs.swe.tasks import MINI_DIR, MiniTaskSet
from crl_bench.mixes import SWE

MINI = MiniTaskSet()
ALL_IDS = sorted(MINI.tasks)
NAMESPACES = namespaces_available()[0]


@pytest.fixture(scope="module")
def env():
    e = SWETextEnv(task_set="mini", split="all", command_timeout_s=20)
    yield e
    e.close()


def test_registration_is_cheap():
    code = ("import sys, crl_bench; from crl_bench.registry import ENVS; "
            "assert 'crl/SWE-v0' in ENVS; "
            "print([m for m in sys.modules if m.startswith('crl_bench.envs.swe.') "
            "and not m.endswith('registration')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_mini_has_at_least_12_tasks_split_into_disjoint_train_and_test():
    train, test = MINI.task_ids("train"), MINI.task_ids("test")
    assert len(train) + len(test) == len(ALL_IDS) >= 12
    assert not set(train) & set(test) and test
    for task in MINI.tasks.values():
        assert task.fail_to_pass and task.pass_to_pass and task.patch and task.test_patch
        assert task.test_files == (task.test_patch.split(" b/")[1].split("\n")[0],)


def test_mix_kwargs_build_the_train_and_test_envs():
    for kwargs, ids in ((SWE.train_kwargs, MINI.task_ids("train")),
                        (SWE.eval_kwargs, MINI.task_ids("test"))):
        e = gymnasium.make(SWE.env_id, **kwargs)
        try:
            assert e.unwrapped.task_ids == ids
            _obs, info = e.reset(seed=3)
            assert info["task_id"] in ids
        finally:
            e.close()


def test_bad_arguments_name_the_choices():
    with pytest.raises(ValueError, match="no split 'validation'"):
        SWETextEnv(split="validation")
    with pytest.raises(ValueError, match="Unknown SWE task set 'verified'"):
        SWETextEnv(task_set="verified")
    with pytest.raises(ValueError, match="backend must be"):
        SWETextEnv(backend="podman")


def test_check_text_env_passes():
    report = check_text_env("crl/SWE-v0", make_kwargs={"command_timeout_s": 20})
    assert len(report.checks) == 7


def test_fuzzed_actions_are_feedback_and_the_episode_goes_on(env):
    env.reset(seed=0)
    for action in (*FUZZ_ACTIONS, b"\xff\xfe", 12345, None, "run", "view /etc/passwd",
                   "view ../../outside", "create /tmp/x\nhi", "replace nowhere.py\n<<<<<<< SEARCH"
                   "\na\n=======\nb\n>>>>>>> REPLACE", "view handykit/text.py 9999-10000",
                   "search zzz_never_there_zzz", "submit please"):
        obs, reward, terminated, truncated, info = env.step(action)
        assert isinstance(obs, str) and obs
        assert reward == 0.0 and not terminated and not truncated
        if action != "search zzz_never_there_zzz":
            assert info["action_valid"] is False, (action, obs)
    assert env.step("help")[4]["action_valid"] is True


@pytest.mark.parametrize("iid", ALL_IDS)
def test_task_base_fails_and_gold_patch_through_the_tools_resolves(env, iid):
    obs, info = env.reset(options={"task_id": iid})
    assert info["task_id"] == iid and info["admissible_actions"] is None
    assert env.task.problem_statement.strip() in obs
    obs, reward, terminated, truncated, info = env.step("submit")
    tests = info["tests"]
    assert terminated and not truncated and reward == 0.0 and not info["success"]
    assert all(s not in PASSING for s in tests["fail_to_pass"].values()), tests
    assert all(s in PASSING for s in tests["pass_to_pass"].values()), tests
    assert info["score"] == pytest.approx(len(tests["pass_to_pass"]) /
                                          (len(tests["pass_to_pass"]) + len(tests["fail_to_pass"])))

    env.reset(options={"task_id": iid})
    actions = env.reference_actions()
    assert actions[-1] == "submit" and all(a.split()[0] in ("replace", "create", "run", "submit")
                                           for a in actions)
    for action in actions[:-1]:
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["action_valid"], obs
        assert not terminated
    obs, reward, terminated, truncated, info = env.step("submit")
    assert terminated and reward == 1.0 and info["success"] and info["score"] == 1.0, obs
    assert "RESOLVED" in obs
    assert info["patch"].startswith("diff --git")


def test_tools_view_search_replace_create_and_run(env):
    env.reset(options={"task_id": "handykit__handykit-117"})
    obs, *_ , info = env.step("view handykit/iterutils.py 8-12")
    assert obs.splitlines()[0].startswith("[handykit/iterutils.py: lines 8-12 of")
    assert " 8 | " in obs and info["action_valid"]
    obs, *_ = env.step("view .")
    assert "handykit/" in obs and "tests/" in obs and ".git/" in obs
    obs, *_ = env.step('search "def chunked(" handykit')
    assert obs.startswith("handykit/iterutils.py:") and ":def chunked(iterable, size):" in obs
    obs, *_ = env.step("replace handykit/iterutils.py\n<<<<<<< SEARCH\n  if len(chunk) < size\n"
                       "=======\nx\n>>>>>>> REPLACE")
    assert "not found" in obs and "only part of line 20" in obs
    obs, *_ = env.step("replace handykit/iterutils.py\n<<<<<<< SEARCH\n"
                       "        if len(chunk) <= size:\n=======\nx\n>>>>>>> REPLACE")
    assert "not found" in obs and "closest" in obs and "line 20" in obs
    obs, *_ = env.step("replace handykit/iterutils.py\n<<<<<<< SEARCH\n    if n < 1:\n=======\n"
                       "    if n < 0:\n>>>>>>> REPLACE")
    assert "Edited handykit/iterutils.py" in obs  # occurs once: windowed()
    obs, *_ = env.step("replace handykit/iterutils.py\n<<<<<<< SEARCH\n    for item in iterable:\n"
                       "=======\n    for x in iterable:\n>>>>>>> REPLACE")
    assert "occurs 2 times" in obs and "Nothing was changed" in obs
    obs, *_ , info = env.step("create scratch/check.py\nfrom handykit.iterutils import chunked\n"
                              "print(list(chunked(range(5), 2)))")
    assert obs == "Created scratch/check.py (2 lines)." and info["action_valid"]
    obs, *_ , info = env.step("run python scratch/check.py")
    assert "[[0, 1], [2, 3]]" in obs and "[exit code 0]" in obs and info["exit_code"] == 0
    obs, *_ , info = env.step("run exit 3")
    assert "[exit code 3]" in obs and info["action_valid"]  # a failing command is still valid
    obs, *_ = env.step("run git log --oneline | wc -l")
    assert obs.startswith("1\n")  # one commit: no history that would show the fix


@pytest.mark.parametrize("commit", [False, True])
def test_editing_the_tests_does_not_fool_the_grader(env, commit):
    iid = "handykit__handykit-106"
    env.reset(options={"task_id": iid})
    env.step("create tests/test_stats.py\ndef test_everything():\n    assert True\n")
    if commit:  # committing the edit must not move the base the test files are reset to
        obs = env.step("run git add -A && git commit -qm mine && git log --oneline | wc -l")[0]
        assert obs.startswith("2\n")
    _obs, reward, terminated, _trunc, info = env.step("submit")
    assert terminated and reward == 0.0 and not info["success"]
    assert all(s not in PASSING for s in info["tests"]["fail_to_pass"].values())
    assert all(s in PASSING for s in info["tests"]["pass_to_pass"].values())
    assert "+def test_everything():" in info["patch"]


def test_step_cap_truncates_and_grades_what_is_there():
    e = SWETextEnv(task_set="mini", split="test", max_steps=3, reward="score")
    try:
        e.reset(seed=1)
        for _ in range(2):
            assert e.step("help")[3] is False
        obs, reward, terminated, truncated, info = e.step("help")
        assert truncated and not terminated and "Step limit of 3 actions" in obs
        assert 0.0 < info["score"] < 1.0 and reward == pytest.approx(info["score"])
        obs, reward, terminated, truncated, info = e.step("submit")
        assert "episode is over" in obs and not info["action_valid"]
    finally:
        e.close()


def test_same_seed_same_task_and_reset_restores_the_workspace(env):
    a = env.reset(seed=11)[1]["task_id"]
    env.step("run echo junk > handykit/text.py")
    b = env.reset(seed=11)[1]["task_id"]
    assert a == b
    obs, *_ = env.step("run head -c 3 handykit/text.py")
    assert obs.startswith('"""')


@pytest.mark.skipif(not NAMESPACES, reason="namespaces sandbox unavailable on this host: "
                    + namespaces_available()[1])
def test_task_data_and_host_are_invisible_from_the_sandbox(env):
    env.reset(options={"task_id": "handykit__handykit-101"})
    obs, *_ = env.step(f"run ls {MINI_DIR} ; cat {MINI_DIR / 'tasks.jsonl'} | head -c 100")
    assert "No such file or directory" in obs and "FAIL_TO_PASS" not in obs
    obs, *_ = env.step("run pwd; ls /")
    assert obs.startswith("/testbed\n")


def test_a_task_resolves_in_the_unsafe_rlimits_mode_too():
    # the mode CI hosts without namespaces get; the per-task tests above use the best mode
    e = SWETextEnv(task_set="mini", split="all", isolation="unsafe-rlimits")
    try:
        e.reset(options={"task_id": "handykit__handykit-116"})
        assert e.sandbox.describe()["isolation"] == "unsafe-rlimits"
        assert e.step("submit")[4]["success"] is False
        e.reset(options={"task_id": "handykit__handykit-116"})
        for action in e.reference_actions():
            _obs, reward, terminated, _trunc, info = e.step(action)
        assert terminated and reward == 1.0 and info["success"]
    finally:
        e.close()
