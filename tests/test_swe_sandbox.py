"""The local sandbox contains what an agent's command may do, reports it, and keeps working.

The hostile commands (a write outside the workspace, a fork bomb, an endless loop, 100 MB of
output, a memory hog, a huge file, a network call, a symlink out of the workspace) run for real,
through the env's ``run`` action and through :class:`LocalSandbox` directly, in every isolation
mode this host supports (``namespaces`` where the OS allows it, ``unsafe-rlimits`` everywhere).
Waits are on conditions with generous ceilings, never on fixed sleeps or tight time windows.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crl_bench.envs.swe.env import SWETextEnv
from crl_bench.envs.swe.sandbox import (LocalSandbox, SandboxLimits, SandboxPathError,
                                        namespaces_available)

NAMESPACES, WHY_NOT = namespaces_available()
MODES = ["unsafe-rlimits"] + (["namespaces"] if NAMESPACES else [])
IS_ROOT = os.geteuid() == 0
ROOT = Path(__file__).resolve().parents[1]
needs_namespaces = pytest.mark.skipif(not NAMESPACES, reason=f"no namespaces here: {WHY_NOT}")


def _uid_processes(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as fh:
                    status = fh.read()
            except OSError:
                continue
            uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
            state = next(line for line in status.splitlines() if line.startswith("State:"))
            if int(uid_line.split()[1]) == uid and "Z" not in state.split()[1]:
                pids.append(int(entry))
    return pids


@pytest.fixture(scope="module")
def env():
    e = SWETextEnv(task_set="mini", split="all", command_timeout_s=3,
                   sandbox_limits={"timeout_s": 3, "max_processes": 64, "memory_mb": 1024,
                                   "max_file_mb": 8})
    e.reset(options={"task_id": "handykit__handykit-101"})
    yield e
    e.close()


def _wait_until(condition, ceiling_s: float = 30.0) -> bool:
    deadline = time.monotonic() + ceiling_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def _writes_confined(sb) -> bool:
    """Host files are safe: a fresh root (namespaces), or a uid of the sandbox's own."""
    d = sb.describe()
    return d["isolation"] == "namespaces" or d["uid"] is not None


def _processes_limited(sb) -> bool:
    """RLIMIT_NPROC applies: to the sandbox uid, or to a non-root user. Root is exempt."""
    return sb.describe()["uid"] is not None or not IS_ROOT


def _still_works(env) -> None:
    obs, _r, terminated, truncated, info = env.step(
        "run echo still-alive && python -c 'print(6*7)'")
    assert obs.startswith("still-alive\n42\n") and info["action_valid"]
    assert not terminated and not truncated


def test_write_outside_the_workspace_is_refused_and_reported(env, tmp_path):
    if not _writes_confined(env.sandbox):
        pytest.skip(f"no write confinement on this host: {env.sandbox.describe()}")
    target = tmp_path / "escape.txt"  # a folder the host user can write to
    obs, *_ = env.step(f"run echo owned > {target}; echo rc=$?; echo x > /etc/crl-swe-test; "
                       "echo rc=$?")
    assert not target.exists() and not Path("/etc/crl-swe-test").exists()
    assert obs.count("rc=1") == 2 or "rc=2" in obs  # the shell says why each write failed
    for action in ("create ../escape.py\nx = 1", f"create {target}\nx = 1",
                   "create /etc/crl-swe-test\nx"):
        obs, *_, info = env.step(action)
        assert obs.startswith("Error:") and not info["action_valid"]
    assert not target.exists()
    _still_works(env)


def test_symlink_out_of_the_workspace_is_not_followed_by_the_tools(env):
    env.step("run ln -sf /etc/hostname host_link && ln -sfn /etc etc_link")
    for action in ("view host_link", "create host_link\nowned", "view etc_link/passwd",
                   "replace etc_link/hostname\n<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE"):
        obs, *_, info = env.step(action)
        assert "resolves outside the repository" in obs and not info["action_valid"], obs
    _still_works(env)


def test_fork_bomb_is_contained(env):
    if not _processes_limited(env.sandbox):
        pytest.skip("commands run as root here (see describe()['uid_note']): no process limit")
    start = time.monotonic()
    obs, *_, info = env.step("run bomb() { bomb | bomb & }; bomb; sleep 1; echo after-bomb")
    assert time.monotonic() - start < 120
    # either the process limit stopped the forks (and the shell finished) or the timeout hit
    assert "Resource temporarily unavailable" in obs or "timed out" in obs, obs[-500:]
    assert info["action_valid"]
    if env.sandbox.uid is not None:  # nothing of the command is left running
        assert _wait_until(lambda: _uid_processes(env.sandbox.uid) == [])
    _still_works(env)


def test_endless_loop_is_killed_at_the_timeout(env):
    start = time.monotonic()
    obs, *_, info = env.step("run while true; do :; done")
    elapsed = time.monotonic() - start
    assert elapsed >= 3 * 0.9  # not stopped early; no upper bound tighter than the ceiling below
    assert elapsed < 120
    assert "[command timed out after 3 s: it and every process it started were killed]" in obs
    assert info["timed_out"] and info["exit_code"] is None
    _still_works(env)


def test_100_mb_of_output_is_cut_and_marked(env):
    obs, *_, info = env.step("run yes | head -c 100000000")
    # 100 MB is past the hard cap (32 MiB): the command is stopped, the head and tail shown
    assert "[command stopped after" in obs and "(the limit is 33,554,432)" in obs
    assert "bytes of output omitted" in obs
    assert len(obs) <= env.max_observation_chars
    assert info["output_bytes"] > 32 * 1024 * 1024
    _still_works(env)


def test_memory_and_file_size_limits(env):
    obs, *_ = env.step("run python -c 'bytearray(3 * 1024**3)'")
    assert "MemoryError" in obs
    obs, *_ = env.step("run head -c 20000000 /dev/zero > big.bin; echo rc=$?; wc -c < big.bin")
    assert "File too large" in obs and "8388608" in obs  # max_file_mb=8
    env.step("run rm -f big.bin")
    _still_works(env)


@needs_namespaces
def test_no_network_in_the_namespaced_sandbox(env):
    obs, *_ = env.step("run python -c \"import socket; socket.create_connection(('1.1.1.1', 53),"
                       " timeout=2)\"; python -c \"import socket; s = socket.socket(); "
                       "s.bind(('127.0.0.1', 0)); print('loopback ok')\"")
    assert "Network is unreachable" in obs and "loopback ok" in obs
    obs, *_ = env.step("run ps -e --no-headers | wc -l")
    assert int(obs.split()[0]) <= 4  # only this command's processes are visible


# -- the sandbox itself, in each isolation mode ------------------------------------------------

@pytest.fixture(params=MODES)
def sandbox(request, tmp_path):
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "a.txt").write_text("hello\n")
    sb = LocalSandbox(limits=SandboxLimits(timeout_s=3, max_processes=64, memory_mb=1024,
                                           max_file_mb=8, output_hard_bytes=256 * 1024 * 1024),
                      isolation=request.param)
    sb.prepare(tmp_path / "tpl")
    yield sb
    sb.close()


def test_sandbox_runs_in_the_workspace_with_a_scrubbed_environment(sandbox, monkeypatch):
    monkeypatch.setenv("CRL_SECRET_TOKEN", "do-not-leak")
    result = sandbox.run("cat a.txt; env | sort")
    assert result.ok and result.output.startswith("hello\n")
    assert "CRL_SECRET_TOKEN" not in result.output and "HOME=" in result.output


def test_sandbox_100_mb_below_the_hard_cap_completes_with_head_and_tail(sandbox):
    result = sandbox.run("head -c 100000000 /dev/zero | tr '\\0' y; echo; echo THE-END",
                         output_keep_bytes=64 * 1024)
    assert result.exit_code == 0 and not result.output_flood
    assert result.output_bytes == 100_000_000 + len("\nTHE-END\n")
    assert result.output_truncated and "bytes of output omitted" in result.output
    assert result.output.startswith("yyyy") and result.output.endswith("y\nTHE-END\n")
    assert len(result.output) < 70 * 1024


def test_sandbox_kills_what_a_command_leaves_behind(sandbox):
    result = sandbox.run("setsid sleep 60 > /dev/null 2>&1 & echo started")
    assert result.output == "started\n" and result.duration_s < 60
    if sandbox.uid is not None:
        assert _wait_until(lambda: _uid_processes(sandbox.uid) == [])


def test_sandbox_fork_bomb_then_reset(sandbox):
    if not _processes_limited(sandbox):
        pytest.skip("commands run as root here: no process limit")
    result = sandbox.run("bomb() { bomb | bomb & }; bomb; sleep 5")
    assert result.timed_out or "Resource temporarily unavailable" in result.output
    sandbox.run("echo changed > a.txt")
    sandbox.reset()
    assert sandbox.run("cat a.txt").output == "hello\n"


def test_sandbox_paths_stay_inside(sandbox):
    with pytest.raises(SandboxPathError):
        sandbox.read_file("../outside")
    with pytest.raises(SandboxPathError):
        sandbox.write_file("/etc/passwd", "x")
    sandbox.write_file("deep/new/file.txt", "made\n")
    assert sandbox.run("cat deep/new/file.txt").output == "made\n"
    assert sandbox.read_file("/testbed/deep/new/file.txt") == "made\n"


def test_sandbox_cannot_write_host_files(sandbox, tmp_path):
    if not _writes_confined(sandbox):
        pytest.skip("a non-root user without namespaces cannot be kept out of its own files")
    victim = tmp_path / "victim.txt"
    victim.write_text("safe\n")
    result = sandbox.run(f"echo owned > {victim}; rm -f {victim}; echo done")
    assert victim.read_text() == "safe\n" and result.output.endswith("done\n")


# -- trees, quotas, host git and memory: driven through the env's own actions ----------------

TASK = "handykit__handykit-101"
DEEP = "run mkdir -p $(printf 'd/%.0s' $(seq 1100)) && echo made"


def _fresh_env(**limits):
    return SWETextEnv(task_set="mini", split="all", command_timeout_s=30, eval_timeout_s=120,
                      sandbox_limits={"timeout_s": 30, **limits} if limits else None)


def test_a_tree_1100_levels_deep_breaks_nothing_on_the_host():
    """Host walks are iterative and removal is rm -rf: no RecursionError in a later command,
    submit or reset; folders past max_path_depth are removed and the command's note says so."""
    env = _fresh_env()
    try:
        env.reset(options={"task_id": TASK})
        obs, _r, _t, _tr, info = env.step(DEEP)
        assert info["action_valid"] and "nested more than 128 levels deep were removed" in obs, obs
        obs, *_ = env.step("run echo alive && ls d | head -1")
        assert obs.startswith("alive\nd\n"), obs
        obs, reward, terminated, _tr, info = env.step("submit")
        assert terminated and reward == 0.0 and "NOT RESOLVED" in obs
        obs, _info = env.reset(options={"task_id": TASK})
        assert env.step("run echo again")[0].startswith("again")
    finally:
        env.close()


def test_a_killed_run_with_a_deep_tree_leaves_nothing_that_breaks_the_next_process(tmp_path):
    # the command makes the tree inside one command, then the process is killed before any
    # host-side cleanup could run; the next process's first env must clean it up and work
    script = ("import os, sys\nfrom crl_bench.envs.swe.env import SWETextEnv\n"
              "e = SWETextEnv(task_set='mini', split='all', command_timeout_s=30)\n"
              f"e.reset(options={{'task_id': {TASK!r}}})\n"
              "sb = e.sandbox\nprint(sb._dir, flush=True)\n"
              "import subprocess\n"
              "subprocess.run(['mkdir', '-p', 'd/' * 1100], cwd=sb.ws, check=True)\n"
              "os.kill(os.getpid(), 9)\n")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    first = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           env=env, timeout=300)
    left = Path(first.stdout.strip().splitlines()[0])
    try:
        _next_process_cleans_up(first, left, env)
    finally:  # whatever happened, leave no deep tree for pytest's own tmp_path cleanup
        subprocess.run(["rm", "-rf", str(left)], check=False)


def _next_process_cleans_up(first, left, env):
    assert first.returncode == -9 and left.is_dir(), first.stderr[-2000:]
    second = subprocess.run(
        [sys.executable, "-c", "from crl_bench.envs.swe.env import SWETextEnv\n"
         "e = SWETextEnv(task_set='mini', split='all')\n"
         f"e.reset(options={{'task_id': {TASK!r}}})\n"
         "print(e.step('run echo works')[0].splitlines()[0]); e.close()\n"],
        capture_output=True, text=True, env=env, timeout=300)
    assert second.returncode == 0 and second.stdout.strip() == "works", second.stderr[-3000:]
    assert not left.exists()


FLOOD = ("run for i in 1 2 3 4 5 6; do head -c 60000000 /dev/zero > f$i 2>/dev/null & done; "
         "wait; du -sk . | cut -f1")


@pytest.mark.parametrize("quota", ["tmpfs", "checked"])
def test_the_disk_quota_holds_for_the_whole_workspace_while_the_command_runs(quota,
                                                                          monkeypatch):
    """Six files written at once (each under the per-file limit) cannot pass a 16 MiB quota: the
    tmpfs refuses the writes, the checked budget stops a command that keeps writing."""
    if quota == "checked":
        monkeypatch.setenv("CRL_SWE_NO_QUOTA_MOUNT", "1")
    env = _fresh_env(disk_mb=16, max_file_mb=64)
    try:
        env.reset(options={"task_id": TASK})
        if quota == "tmpfs":
            if not env.sandbox.describe().get("quota", "tmpfs").startswith("tmpfs"):
                pytest.skip(env.sandbox.describe()["quota"])
            obs, *_ = env.step(FLOOD)
            kib_seen_by_the_command = int(obs.split("\n")[0])
            assert kib_seen_by_the_command <= 16 * 1024 + 64, obs
        else:
            assert env.sandbox.describe().get("quota", "checked").startswith("checked")
            obs, *_ = env.step("run i=0; while :; do head -c 4000000 /dev/zero > f$i; "
                               "i=$((i+1)); done")
            assert "over its disk quota of 16 MiB" in obs and "timed out" not in obs, obs
        host_bytes = sum(p.stat().st_size for p in env.sandbox.ws.glob("f*"))
        # the checked budget is measured every 0.25 s: what one interval of writes adds on top
        # depends on the machine's load (measured 135 MiB on 2 shared cores); unbounded writing
        # would run to the command's timeout, which the assertion above already rules out
        limit = 16 * 2**20 if quota == "tmpfs" else 16 * 2**20 + 256 * 2**20
        assert host_bytes <= limit, host_bytes
        env.step("run rm -f f*")
        obs, *_ = env.step("run echo ok > small && cat small")
        assert obs.startswith("ok\n"), obs
    finally:
        env.close()


@pytest.mark.parametrize("quota", ["tmpfs", "checked"])
def test_empty_files_count_against_an_inode_quota(quota, monkeypatch):
    if quota == "checked":
        monkeypatch.setenv("CRL_SWE_NO_QUOTA_MOUNT", "1")
    env = _fresh_env(max_inodes=2000)
    try:
        env.reset(options={"task_id": TASK})
        obs, *_ = env.step("run mkdir e; for i in $(seq 60000); do : > e/$i || break; done; "
                           "ls e | wc -l")
        made = len(os.listdir(env.sandbox.ws / "e"))
        if quota == "tmpfs":
            assert made < 2000 and "2,000" in obs, (made, obs)
        else:  # stopped at the next measurement: a bounded overshoot
            assert made < 20000 and "over its quota of 2,000" in obs, (made, obs)
    finally:
        env.close()


def test_host_git_never_follows_a_nested_git_file(tmp_path):
    """A workspace ``.git`` file pointing at a repository on the host: the patch must not carry
    that repository's commit (host git never reads it); the grade says why it failed."""
    proj = tmp_path / "project"
    proj.mkdir()
    (proj / "f").write_text("x\n")
    git_env = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b",
               "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@b"}
    for args in (["init", "-q"], ["add", "f"], ["commit", "-qm", "secret"]):
        subprocess.run(["git", *args], cwd=proj, env=git_env, check=True, capture_output=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=proj, capture_output=True,
                          text=True, check=True).stdout.strip()
    env = _fresh_env()
    try:
        env.reset(options={"task_id": TASK})
        for action in env.reference_actions()[:-1]:
            env.step(action)
        obs, *_ = env.step(f"run mkdir sub && echo 'gitdir: {proj}/.git' > sub/.git && echo ok")
        assert obs.startswith("ok"), obs
        obs, reward, terminated, _tr, info = env.step("submit")
        assert terminated and head not in info["patch"] and "Subproject" not in info["patch"]
        assert reward == 0.0 and "nested .git (sub/.git)" in obs, obs
    finally:
        env.close()


def test_the_top_level_git_replaced_by_a_gitfile_is_not_followed_either(tmp_path):
    env = _fresh_env()
    try:
        env.reset(options={"task_id": TASK})
        for action in env.reference_actions()[:-1]:
            env.step(action)
        env.step(f"run rm -rf .git && echo 'gitdir: {ROOT}/.git' > .git && echo ok")
        obs, reward, _t, _tr, info = env.step("submit")
        assert reward == 1.0 and "Subproject" not in info["patch"], obs
        assert "+++ b/.git" not in info["patch"]
    finally:
        env.close()


def _mem_total_mib() -> int:
    with open("/proc/meminfo") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("MemTotal:")) // 1024


def test_the_sandbox_memory_default_is_sized_from_the_host(tmp_path):
    env = _fresh_env()
    try:
        env.reset(options={"task_id": TASK})
        mb = env.sandbox.limits.sandbox_memory_mb
        assert mb <= 16384 and mb <= max(1024, _mem_total_mib() // 4), mb
        assert f"{mb} MiB" in env.sandbox.describe()["memory"]
    finally:
        env.close()
    from crl_bench.envs.swe.sandbox_base import default_sandbox_memory_mb

    for kib, expected in ((24_683_664, 24_683_664 // 1024 // 4), (512 * 2**20, 16384),
                          (2 * 2**20, 1024)):
        (tmp_path / "meminfo").write_text(f"MemTotal:       {kib} kB\nMemFree: 1 kB\n")
        assert default_sandbox_memory_mb(str(tmp_path / "meminfo")) == expected
