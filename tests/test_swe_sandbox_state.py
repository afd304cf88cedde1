"""The local sandbox's resources add up and its task data stays out of reach.

* Memory at submit is bounded by the patch cap, not by what the workspace holds.
* All sandboxes of a host share one memory budget (a parent cgroup) that charges their
  processes and their quota tmpfs files alike.
* A full workspace leaves room to run ``rm``, and the observation says why writes fail.
* A non-editable install (a wheel in the interpreter prefix the sandbox binds) exposes no file
  holding a task's gold patch inside the sandbox.

Everything is driven through the env's own actions or :class:`LocalSandbox`, for real.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from pathlib import Path

import pytest

from crl_bench.envs.swe.sandbox import LocalSandbox, SandboxLimits, namespaces_available
from crl_bench.envs.swe.sandbox_fs import fs_usage
from crl_bench.envs.swe.sandbox_proc import memory_cgroup_root

NAMESPACES, WHY_NOT = namespaces_available()
ROOT = Path(__file__).resolve().parents[1]
TASK = "handykit__handykit-101"
MiB = 2**20


def _run_script(code: str, timeout: float = 240, env: dict[str, str] | None = None,
                python: str = sys.executable, cwd: Path | None = None) -> dict:
    proc = subprocess.run([python, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd,
                          env={k: v for k, v in {**os.environ, **(env or {})}.items() if v})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- memory at submit --------------------------------------------------------------------------

def test_memory_at_submit_is_bounded_by_the_patch_cap_not_the_workspace():
    """256 MiB of random bytes written with the env's own ``run``: refused before git reads it;
    40 MiB (under the input cap): git runs, the diff is read in pieces and refused past twice
    the patch cap. The peak RSS of the process that grades, and of its git children, stay within
    a few caps (before: 711 MiB and 516 MiB for the 256 MiB workspace)."""
    out = _run_script("""
        import json, resource
        from crl_bench.envs.swe.env import SWETextEnv
        e = SWETextEnv(task_set="mini", split="all", command_timeout_s=60,
                       sandbox_limits={"timeout_s": 60, "max_file_mb": 512})
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        seen = {}
        for mib in (40, 256):
            e.reset(options={"task_id": "%s"})
            obs = e.step(f"run head -c {mib * 2**20} /dev/urandom > blob.bin && echo written")[0]
            assert obs.startswith("written"), obs
            obs, reward, terminated, _t, info = e.step("submit")
            seen[mib] = [obs, reward, terminated, e.max_patch_bytes]
        e.close()
        print(json.dumps({"seen": seen, "base": base,
                          "self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                          "children": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
                          * 1024}))
    """ % TASK)
    cap = out["seen"]["256"][3]
    for mib, (obs, reward, terminated, _cap) in out["seen"].items():
        assert terminated and reward == 0.0, obs
    assert "so they were not diffed" in out["seen"]["256"][0], out["seen"]["256"][0]
    assert f"over the {cap:,}-byte limit" in out["seen"]["40"][0], out["seen"]["40"][0]
    grown = out["self"] - out["base"]
    assert grown <= 2 * cap + 16 * MiB, (grown / MiB, out)
    assert out["children"] <= 4 * cap + 64 * MiB, (out["children"] / MiB, out)


# -- one budget for all sandboxes --------------------------------------------------------------

def _cgroup_or_skip():
    root, why = memory_cgroup_root()
    if root is None or not NAMESPACES:
        pytest.skip(f"no writable memory cgroup or no namespaces here: {why or WHY_NOT}")
    return root


def test_all_sandboxes_together_stay_within_one_budget(tmp_path, monkeypatch):
    """Two sandboxes, each allowed 160 MiB and 88 MiB of files, under a 160 MiB budget: the
    second one's files cannot take the sum past the budget; the kernel stops the writer, the
    observation names the shared budget, and the budget's peak use is within it."""
    root = _cgroup_or_skip()
    group = f"crl-sandboxes-test-{os.getpid()}"
    monkeypatch.setenv("CRL_SWE_SANDBOX_GROUP", group)
    monkeypatch.setenv("CRL_SWE_SANDBOX_BUDGET_MB", "160")
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "a.txt").write_text("x\n")
    limits = SandboxLimits(timeout_s=30, sandbox_memory_mb=160, shm_mb=8, memory_mb=1024)
    boxes = [LocalSandbox(limits=limits), LocalSandbox(limits=limits)]
    try:
        for sb in boxes:
            sb.prepare(tmp_path / "tpl")
            assert sb._cgroup.parent == root / group, sb.describe()
            assert sb.describe()["budget_mb"] == 160 and sb.describe()["quota"].startswith("tmpfs")
        first = boxes[0].run("head -c 88000000 /dev/zero > f; echo rc=$?")
        assert "rc=0" in first.output, first.output
        second = boxes[1].run("head -c 88000000 /dev/zero > f; echo rc=$?")
        status = second.status_line()
        assert "rc=0" not in second.output, second.output
        assert "the memory of all sandboxes on this host together (160 MiB" in status, status
        peak = int((root / group / "memory.max_usage_in_bytes").read_text()) \
            if (root / group / "memory.max_usage_in_bytes").exists() \
            else int((root / group / "memory.peak").read_text())
        assert peak <= 160 * MiB, peak / MiB
        files = sum(fs_usage(sb._dir)[0] for sb in boxes)
        assert files <= 160 * MiB, files / MiB
    finally:
        for sb in boxes:
            sb.close()
        try:
            (root / group).rmdir()
        except OSError:
            pass


def test_a_sandbox_larger_than_its_own_files_allow_is_refused():
    with pytest.raises(ValueError, match="lower disk_mb"):
        SandboxLimits(sandbox_memory_mb=4096, disk_mb=4096)
    with pytest.raises(ValueError, match="finite"):
        SandboxLimits(timeout_s=float("inf"))
    # the default leaves a quarter of the memory to commands
    lim = SandboxLimits(sandbox_memory_mb=4096)
    assert lim.disk_mb == 4096 - 1024 - lim.shm_mb
    # a memory too small for any file is refused, not given a 1 MiB workspace
    with pytest.raises(ValueError, match="sandbox_memory_mb=128 leaves no room for files"):
        SandboxLimits(sandbox_memory_mb=128)


# -- a full workspace ------------------------------------------------------------------------

def test_a_full_workspace_leaves_room_for_rm_and_says_why():
    """With 200 MiB of sandbox memory (the old default disk quota, 4 GiB, was larger than that),
    filling the workspace ends in 'No space left', the note names the quota, and ``rm`` and
    later commands run (before: every later command was SIGKILLed, with no word)."""
    _cgroup_or_skip()
    from crl_bench.envs.swe.env import SWETextEnv

    env = SWETextEnv(task_set="mini", split="all", command_timeout_s=30,
                     sandbox_limits={"timeout_s": 30, "sandbox_memory_mb": 200, "shm_mb": 8,
                                     "memory_mb": 1024, "max_file_mb": 512})
    try:
        env.reset(options={"task_id": TASK})
        assert env.sandbox.describe()["quota"].startswith("tmpfs"), env.sandbox.describe()
        obs, *_ = env.step("run head -c 300000000 /dev/zero > big.bin; echo rc=$?")
        assert "No space left on device" in obs and "rc=1" in obs, obs
        assert f"its quota is {env.sandbox.limits.disk_mb:,} MiB" in obs, obs
        obs, *_ = env.step("run rm -f big.bin && echo removed")
        assert obs.startswith("removed"), obs
        obs, *_ = env.step("run python -c 'print(6 * 7)'")
        assert obs.startswith("42"), obs
    finally:
        env.close()


# -- task data out of reach ------------------------------------------------------------------

def _needle(patch: str) -> str:
    """An added line of the gold patch, as it appears in the task file's JSON too."""
    lines = [ln[1:].strip() for ln in patch.splitlines()
             if ln.startswith("+") and not ln.startswith("+++")]
    lines = [ln for ln in lines if len(ln) > 12 and '"' not in ln and "\\" not in ln]
    return max(lines, key=len)


def _copy_source(src: Path) -> None:
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], capture_output=True,
                           check=True).stdout.split(b"\0")
    for rel in files:
        if not rel:
            continue
        path = ROOT / rel.decode()
        if path.is_file():
            (src / rel.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / rel.decode())


def _interpreter_prefix(prefix: Path) -> Path:
    """A Python prefix of its own (hard links to this interpreter's): a wheel installed into its
    site-packages lies under ``sys.base_prefix``, which the sandbox binds."""
    base = Path(sys.base_prefix)
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "lib").mkdir()
    exe = Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))
    os.link(exe, prefix / "bin" / ver)
    subprocess.run(["cp", "-al", str(base / "lib" / ver), str(prefix / "lib" / ver)],
                   check=True)
    shutil.rmtree(prefix / "lib" / ver / "site-packages")
    (prefix / "lib" / ver / "site-packages").mkdir()
    for lib in (base / "lib").glob("libpython*"):
        os.link(lib, prefix / "lib" / lib.name)
    return prefix / "bin" / ver


@pytest.mark.slow
def test_a_wheel_install_exposes_no_task_data_inside_the_sandbox(tmp_path):
    """crl-bench built as a wheel and installed (no deps) into an interpreter prefix of its own;
    the env runs on that interpreter, so the sandbox binds the prefix that holds the installed
    package with ``envs/swe/data/mini/tasks.jsonl``. From inside the sandbox, no file under the
    bound interpreter prefixes and venvs (and the places a system-wide install goes) contains
    an added line of the task's gold patch; on the host the installed file does."""
    if not NAMESPACES:
        pytest.skip(f"no namespaces here: {WHY_NOT}")
    # not under /tmp: the sandbox's own /tmp covers it
    work = Path(tempfile.mkdtemp(prefix="crl-wheel-test-", dir="/var/tmp"))
    try:
        _wheel_install_check(tmp_path, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _wheel_install_check(tmp_path: Path, work: Path) -> None:
    src, wheels = tmp_path / "src", tmp_path / "wheels"
    src.mkdir()
    _copy_source(src)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(wheels), str(src)], check=True,
                   capture_output=True, timeout=300)
    wheel = next(wheels.glob("crl_bench-*.whl"))
    python = _interpreter_prefix(work / "prefix")
    site = work / "prefix" / "lib" / python.name / "site-packages"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                    "--target", str(site), str(wheel)], check=True, capture_output=True,
                   timeout=300)
    # the dependencies (gymnasium, numpy, pytest) from this venv, after the installed package
    (site / "zz_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    import crl_bench.envs.swe.tasks as tasks_mod

    needle = _needle(tasks_mod.MiniTaskSet().task(TASK).patch)
    installed = site / "crl_bench" / "envs" / "swe" / "data" / "mini" / "tasks.jsonl"
    assert needle in installed.read_text(), "the wheel ships the task file (else nothing to hide)"
    out = _run_script("""
        import glob, json, shlex, sys
        import crl_bench
        from crl_bench.envs.swe.env import SWETextEnv
        e = SWETextEnv(task_set="mini", split="all")
        e.reset(options={"task_id": %r})
        system = {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"}
        dirs = [p for p in e.sandbox._ro if p not in system]
        dirs += glob.glob("/usr/local/lib/python3*") + glob.glob("/usr/lib/python3*")
        obs = e.step("run grep -rlF -e " + shlex.quote(%r) + " "
                     + " ".join(map(shlex.quote, dirs)) + " 2>/dev/null; echo END")[0]
        e.close()
        print(json.dumps({"obs": obs, "dirs": dirs, "file": crl_bench.__file__,
                          "base_prefix": sys.base_prefix}))
    """ % (TASK, needle), python=str(python),
        env={"CRL_BENCH_CACHE": str(work / "cache"), "PYTHONPATH": ""},
        timeout=600, cwd=tmp_path)  # not the checkout: its crl_bench would shadow the wheel
    prefix = os.path.realpath(work / "prefix")
    assert out["file"].startswith(str(site)) and out["base_prefix"] == prefix, out
    assert prefix in out["dirs"], out["dirs"]
    assert out["obs"].startswith("END"), out["obs"]


# -- settings, checked before a run writes anything -------------------------------------------

@pytest.mark.parametrize("kwargs, named", [
    ({"eval_timeout_s": float("1e999")}, "eval_timeout_s=inf"),
    ({"command_timeout_s": 0}, "command_timeout_s=0"),
    ({"sandbox_limits": {"disk_mb": 10**9}}, "lower disk_mb"),
    ({"isolation": "none"}, "isolation must be"),
])
def test_swe_settings_are_refused_before_the_run_folder_is_written(tmp_path, kwargs, named):
    from crl_bench.runner.api import run_experiment
    from crl_bench.config.schema import ConfigError, build_config

    overrides = {"rollout.env_kwargs": {"swe": kwargs}}
    with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
        build_config(tasks="swe", preset="cpu", overrides=overrides)
    with pytest.raises(ConfigError, match="rollout.env_kwargs"):
        run_experiment("grpo", "swe", "cpu", 0, tmp_path / "run", overrides=overrides,
                       progress=False)
    assert not (tmp_path / "run").exists()


# -- the user-namespace path cannot leave its root --------------------------------------------

ESCAPE = """python3 -c '
import os
os.makedirs("/tmp/x", exist_ok=True)
os.chroot("/tmp/x")
for _ in range(40):
    os.chdir("..")
os.chroot(".")
print("ESCAPED", sorted(os.listdir("/")))
'"""


def test_a_non_root_sandbox_cannot_chroot_its_way_back_to_the_host(tmp_path):
    """A non-root host user gets a user namespace, in which the command is uid 0. With the
    fresh root entered by chroot, ``chroot(subdir)`` and enough ``..`` led back to the host's
    tree (the task data included). The root is now entered with pivot_root, the old one
    detached, and the capability bounding set emptied. Run as uid 65534 with the system
    Python (the launcher needs only the standard library)."""
    from crl_bench.envs.swe.sandbox_proc import LAUNCHER, _base_config

    if os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs root (to become another user), setpriv and /usr/bin/python3")
    base = Path(tempfile.mkdtemp(prefix="crl-userns-", dir="/var/tmp"))
    try:
        for d in ("ws", "tmp", "root"):
            (base / d).mkdir()
        os.chmod(base, 0o755)
        shutil.copy(LAUNCHER, base / "launcher.py")
        os.chmod(base / "launcher.py", 0o644)
        for path in [base, *base.iterdir()]:
            os.lchown(path, 65534, 65534)
        binds = [p for p in ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc")
                 if os.path.lexists(p)]
        cfg = _base_config("namespaces", str(base / "root"), str(base / "ws"), str(base / "tmp"),
                           binds, SandboxLimits(timeout_s=20), uid=None,
                           command=ESCAPE + "; grep CapEff /proc/self/status",
                           env={"PATH": "/usr/bin:/bin"}, timeout_s=20)
        cfg.update(user_ns=True, host_uid=65534, host_gid=65534, rlimits={"nofile": 1024})
        proc = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534",
                               "--clear-groups", "/usr/bin/python3", "-I", "-S",
                               str(base / "launcher.py"), json.dumps(cfg)],
                              capture_output=True, text=True, timeout=60)
        out = proc.stdout + proc.stderr
        if "setup error" in out and "unshare" in out:
            pytest.skip(f"no unprivileged user namespaces here: {out[-300:]}")
        assert "ESCAPED" not in out, out[-2000:]
        assert "Operation not permitted" in out and "CapEff:\t0000000000000000" in out, out
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_capped_diff_reader_does_not_stall_on_a_chatty_stderr(tmp_path):
    """The workspace diff reads git's stdout in pieces; its stderr goes to a file. With a pipe
    nobody read until stdout ended, a command writing over 64 KiB to stderr first stalled
    until the deadline, and the error kept the head of stderr instead of its tail."""
    import time

    from crl_bench.envs.swe.local_sandbox import _capped_output
    from crl_bench.envs.swe.sandbox import SandboxError

    chatty = "head -c 300000 /dev/zero | tr '\\0' e >&2; printf TAIL >&2; "
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    start = time.monotonic()
    out = _capped_output(["sh", "-c", chatty + "echo done"], cwd=tmp_path, env=env,
                         deadline=start + 8, timeout_s=8, cap=1024, max_bytes=512)
    assert out == "done\n" and time.monotonic() - start < 6
    with pytest.raises(SandboxError, match="eeeTAIL$") as err:
        _capped_output(["sh", "-c", chatty + "exit 3"], cwd=tmp_path, env=env,
                       deadline=time.monotonic() + 8, timeout_s=8, cap=1024, max_bytes=512)
    assert len(str(err.value)) < 700
