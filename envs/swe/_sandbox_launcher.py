"""Start one sandboxed shell command. Run as a script by :class:`LocalSandbox`, never imported.

``python -I -S _sandbox_launcher.py CONFIG_JSON``. Only the standard library is used, so that the
interpreter starts in a few milliseconds. The config keys are written by
``LocalSandbox._launcher_config``; the two modes are:

``namespaces``
    ``unshare(2)`` new mount, PID, network, IPC and UTS namespaces (plus a user namespace when
    the host user is not root), fork, and in the child (PID 1 of the new namespace) build a
    fresh root on a small tmpfs: read-only bind mounts of the toolchain paths, the workspace
    read-write at ``/testbed``, the sandbox's own ``/tmp``, a few device nodes and a new
    ``/proc``. Then ``chroot`` into it, apply rlimits, drop to the sandbox uid (when the host
    is root), set no-new-privs and the parent-death signal, and ``exec`` the shell. When PID 1
    dies the kernel kills every process left in the namespace, so one kill of the launcher's
    process group ends a fork bomb or a daemon the command left behind.
``unsafe-rlimits``
    No namespaces (only when the user asked for it by this name): ``chdir``, rlimits, uid drop
    when root, ``exec``.

Either way the launcher first joins the sandbox's memory cgroup when the config names one.

Setup failures are printed to stdout with the prefix ``SETUP_ERROR_PREFIX`` and exit with
``SETUP_ERROR_EXIT``, so the host can tell them from the command's own failures.
"""

import ctypes
import json
import os
import resource
import signal
import socket
import struct
import sys

SETUP_ERROR_PREFIX = "crl-sandbox setup error: "
SETUP_ERROR_EXIT = 250

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38

DEVICES = ("null", "zero", "full", "random", "urandom", "tty")

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    pass


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)} (errno {err})")


def _mount(source, target, fstype, flags, data=None):
    _check(_libc.mount(source.encode() if source else None, target.encode(),
                       fstype.encode() if fstype else None, ctypes.c_ulong(flags),
                       data.encode() if data else None),
           f"mount {source or ''} -> {target} ({fstype or 'bind'})")


def _locked_flags(path):
    """Mount flags a remount must keep (a user namespace may not clear them)."""
    st = os.statvfs(path).f_flag
    flags = 0
    for st_bit, ms_bit in ((1, MS_RDONLY), (2, MS_NOSUID), (4, MS_NODEV), (8, MS_NOEXEC),
                           (1024, MS_NOATIME), (2048, MS_NODIRATIME), (4096, MS_RELATIME)):
        if st & st_bit:
            flags |= ms_bit
    return flags


def _bind(source, target, readonly):
    _mount(source, target, None, MS_BIND)
    if readonly:
        _mount(None, target, None,
               MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | _locked_flags(target))


def _make_mountpoint(root, inside, is_dir):
    target = root + inside
    if is_dir:
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            open(target, "w").close()
    return target


def _write(path, text):
    with open(path, "w") as fh:
        fh.write(text)


def _loopback_up():
    """Bring ``lo`` up in the new network namespace (tests may bind localhost sockets)."""
    import fcntl

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s.fileno(), siocgifflags, req))[1]
        fcntl.ioctl(s.fileno(), siocsifflags, struct.pack("16sH22x", b"lo", flags | iff_up))


def _hide(root, cfg):
    """Cover each ``hide`` path (the task data: crl-bench's own package and data folders) that a
    read-only bind made visible: an empty read-only tmpfs on a folder, ``/dev/null`` on a file.
    """
    binds = [(p, os.path.realpath(p)) for p in cfg["ro_binds"] if os.path.lexists(p)]
    for hidden in cfg.get("hide") or ():
        for inside, real in binds:
            if hidden != real and not hidden.startswith(real.rstrip("/") + "/"):
                continue
            target = root + inside.rstrip("/") + hidden[len(real.rstrip("/")):]
            if os.path.isdir(target) and not os.path.islink(target):
                _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                       "size=4k,nr_inodes=1,mode=0555")
                _mount(None, target, None,
                       MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
            elif os.path.isfile(target):
                _mount("/dev/null", target, None, MS_BIND)


def _build_root(cfg):
    root = cfg["root"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")
    for path in cfg["ro_binds"]:
        if not os.path.lexists(path):
            continue
        if os.path.islink(path) and os.path.dirname(path) == "/":
            # merged-/usr systems: /bin -> usr/bin etc. Recreate the link, bind nothing.
            os.symlink(os.readlink(path), root + path)
            continue
        real = os.path.realpath(path)
        target = _make_mountpoint(root, path, os.path.isdir(real))
        _bind(real, target, readonly=True)
    _hide(root, cfg)
    for source, inside in cfg["rw_binds"]:
        target = _make_mountpoint(root, inside, True)
        _bind(source, target, readonly=False)
    os.makedirs(root + "/dev", exist_ok=True)
    for name in DEVICES:
        if os.path.exists("/dev/" + name):
            _bind("/dev/" + name, _make_mountpoint(root, "/dev/" + name, False), readonly=False)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, root + "/dev/" + name)
    os.makedirs(root + "/dev/shm")
    _mount("tmpfs", root + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={cfg['shm_bytes']},mode=1777")
    os.makedirs(root + "/proc")
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    # The skeleton (mountpoints only) becomes read-only: writes outside /testbed and /tmp fail.
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    _enter_root(root)


SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}
MNT_DETACH = 2


def _enter_root(root):
    """Make ``root`` the root of this mount namespace and detach the old one.

    Not ``chroot``: a process with ``CAP_SYS_CHROOT`` in its namespace (uid 0 of a user
    namespace has it) leaves a chroot with ``chroot(subdir); chdir('..')...``, back to the host's
    tree, which stays mounted. ``pivot_root(".", ".")`` stacks the old root under the new one and
    the lazy unmount removes it from the namespace altogether."""
    os.chdir(root)
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise SetupError(f"pivot_root: unknown syscall number on {os.uname().machine}")
    _check(_libc.syscall(ctypes.c_long(number), b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", ctypes.c_int(MNT_DETACH)), "umount the old root")
    os.chdir("/")


PR_CAPBSET_DROP = 24


def _drop_bounding_set():
    """Empty the capability bounding set: what the shell execs (as uid 0 of a user namespace,
    or after the uid drop) can never hold a capability, even by exec."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:
            break  # EINVAL: past the last capability this kernel knows


def _apply_rlimits(limits):
    names = {"cpu": resource.RLIMIT_CPU, "as": resource.RLIMIT_AS,
             "nproc": resource.RLIMIT_NPROC, "fsize": resource.RLIMIT_FSIZE,
             "nofile": resource.RLIMIT_NOFILE, "core": resource.RLIMIT_CORE}
    for key, value in limits.items():
        which = names[key]
        _soft, hard = resource.getrlimit(which)
        value = int(value)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        # CPU: SIGXCPU at the soft limit, SIGKILL one second later.
        new_hard = value + 1 if key == "cpu" and (hard == resource.RLIM_INFINITY or value < hard) \
            else value
        resource.setrlimit(which, (value, new_hard))


def _drop_privileges(cfg):
    uid, gid = cfg.get("uid"), cfg.get("gid")
    if cfg["mode"] == "namespaces":
        _drop_bounding_set()
    if uid is not None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    # Set after setuid: a credential change clears the parent-death signal.
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")


def _exec_command(cfg):
    os.chdir(cfg["workdir"])
    _apply_rlimits(cfg["rlimits"])
    _drop_privileges(cfg)
    os.umask(0o022)
    shell = cfg["shell"]
    os.execve(shell, [os.path.basename(shell), "-c", cfg["command"]], cfg["env"])


def _fail(exc):
    sys.stdout.write(f"{SETUP_ERROR_PREFIX}{type(exc).__name__}: {exc}\n")
    sys.stdout.flush()
    os._exit(SETUP_ERROR_EXIT)


def _run_namespaced(cfg):
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    if cfg["network_off"]:
        flags |= CLONE_NEWNET
    if cfg["user_ns"]:
        flags |= CLONE_NEWUSER
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")
    if cfg["user_ns"]:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"0 {cfg['host_uid']} 1")
        _write("/proc/self/gid_map", f"0 {cfg['host_gid']} 1")
    child = os.fork()
    if child == 0:
        try:
            _build_root(cfg)
            socket.sethostname("sandbox")
            if cfg["network_off"]:
                try:
                    _loopback_up()
                except OSError:
                    pass  # without lo the command still runs; only localhost sockets fail
            _exec_command(cfg)
        except BaseException as exc:  # noqa: BLE001 - report every setup failure the same way
            _fail(exc)
    # The launcher stays outside the namespace and relays PID 1's fate as an exit status.
    _pid, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


def main():
    cfg = json.loads(sys.argv[1])
    try:
        if cfg.get("cgroup_procs"):
            # Join the sandbox's memory cgroup first: everything the command starts inherits it.
            _write(cfg["cgroup_procs"], str(os.getpid()))
        if cfg["mode"] == "namespaces":
            _run_namespaced(cfg)
        else:
            _exec_command(cfg)
    except BaseException as exc:  # noqa: BLE001
        _fail(exc)


if __name__ == "__main__":
    main()
