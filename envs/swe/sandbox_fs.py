"""Host-side handling of a sandbox's files: the disk quota, walks and removal that no tree the
agent builds can break.

* **Quota** (:func:`mount_quota_fs`): where this process may mount (root), the sandbox folder is
  a tmpfs of its own, ``size`` = the byte quota and ``nr_inodes`` = the inode quota, so the
  kernel refuses the write (``ENOSPC``) that would go over, while the command runs, however
  many files or processes write at once. Elsewhere the quota is a checked budget: the command's
  output loop measures the tree every :data:`WATCH_INTERVAL_S` and kills the command when it is
  over (:class:`QuotaWatch`), and ``RLIMIT_FSIZE`` caps each file at what is left.
* **Walks** (:func:`tree_usage`) are iterative (an explicit stack), never ``os.walk`` or
  recursion: a tree 10,000 levels deep costs time, not a ``RecursionError``. They stop at
  ``max_depth`` and report what lies deeper; :func:`remove_tree` is ``rm -rf`` (no recursion
  in Python either).
* **Nested ``.git``** entries (a file ``gitdir: <elsewhere>``, a directory, a link) are
  reported by the walk: host git must never read a repository the agent points it at.
"""

from __future__ import annotations

import ctypes
import os
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

WATCH_INTERVAL_S = 0.25
MNT_DETACH = 2


@dataclass
class TreeUsage:
    """What a walk found under some folders."""

    bytes: int = 0
    inodes: int = 0
    too_deep: list[str] = field(default_factory=list)  # folders whose content lies past max_depth
    nested_git: list[str] = field(default_factory=list)  # ``.git`` entries below the top level


def _walk(top: Path, max_depth: int, too_deep: list[str] | None = None,
          skip_top: str | None = None) -> Iterator[tuple[str, int, os.DirEntry[str],
                                                         os.stat_result]]:
    """``(folder, depth, entry, lstat)`` of every entry under ``top``, iteratively (an explicit
    stack); links not followed, unreadable entries passed over. Folders deeper than
    ``max_depth`` levels are not entered (their paths go to ``too_deep``); an entry of ``top``
    named ``skip_top`` is passed over whole."""
    stack: list[tuple[str, int]] = [(str(top), 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if depth == 0 and entry.name == skip_top:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            yield folder, depth, entry, st
            if stat.S_ISDIR(st.st_mode):
                if depth + 1 < max_depth:
                    stack.append((entry.path, depth + 1))
                elif too_deep is not None:
                    too_deep.append(entry.path)


def tree_usage(*tops: Path, max_depth: int = 10**9, git_top: Path | None = None) -> TreeUsage:
    """Bytes (allocated blocks) and inodes under ``tops``, iteratively; links not followed.

    Folders deeper than ``max_depth`` levels below a top are not entered: they are listed in
    ``too_deep``. Every entry named ``.git`` is listed in ``nested_git`` except ``git_top/.git``.
    """
    usage = TreeUsage()
    for top in tops:
        for folder, depth, entry, st in _walk(top, max_depth, usage.too_deep):
            usage.inodes += 1
            usage.bytes += max(st.st_blocks * 512, st.st_size if stat.S_ISREG(st.st_mode)
                               else 0)
            if entry.name == ".git" and not (git_top is not None and depth == 0
                                             and Path(folder) == git_top):
                usage.nested_git.append(entry.path)
    return usage


def changed_bytes(top: Path, template: Path, stop_at: int, max_depth: int = 10**9) -> int:
    """Bytes of the regular files under ``top`` that are new or differ from ``template`` by
    size or modification time (``top/.git`` aside), iteratively; stops counting past
    ``stop_at``. A workspace is a copy of its template with times kept, so this is what a diff
    would have to read."""
    total = 0
    top_s = str(top)
    for _folder, _depth, entry, st in _walk(top, max_depth, skip_top=".git"):
        if not stat.S_ISREG(st.st_mode):
            continue
        try:
            old = os.stat(str(template) + entry.path[len(top_s):], follow_symlinks=False)
            same = (old.st_size == st.st_size and old.st_mtime_ns == st.st_mtime_ns
                    and stat.S_ISREG(old.st_mode))
        except OSError:
            same = False
        if not same:
            total += st.st_size
            if total > stop_at:
                return total
    return total


def remove_tree(path: Path | str) -> None:
    """``rm -rf`` ``path`` (any depth); folders a command made unwritable are opened first.

    A tmpfs mounted on ``path`` (see :func:`mount_quota_fs`) is detached first.
    """
    path = str(path)
    if not os.path.lexists(path):
        return
    unmount(path)
    for attempt in range(2):
        proc = subprocess.run(["rm", "-rf", "--one-file-system", "--", path],
                              capture_output=True)
        if proc.returncode == 0 or not os.path.lexists(path) or attempt:
            return
        subprocess.run(["chmod", "-R", "u+rwX", "--", path], capture_output=True)


_libc = None


def _libc_call():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def mount_quota_fs(folder: Path, size_bytes: int, inodes: int) -> str:
    """Mount a tmpfs of ``size_bytes`` and ``inodes`` on ``folder``; '' on success, else why not."""
    if os.environ.get(NO_MOUNT_ENV) == "1":
        return f"disabled by {NO_MOUNT_ENV}=1"
    if os.geteuid() != 0:
        return "mounting a quota filesystem needs root"
    opts = f"size={int(size_bytes)},nr_inodes={int(inodes)},mode=0755"
    libc = _libc_call()
    ms_nosuid_nodev = 2 | 4
    ret = libc.mount(b"tmpfs", str(folder).encode(), b"tmpfs", ctypes.c_ulong(ms_nosuid_nodev),
                     opts.encode())
    if ret != 0:
        err = ctypes.get_errno()
        return f"mount tmpfs on {folder} failed: {os.strerror(err)}"
    return ""


def unmount(folder: Path | str) -> None:
    """Detach a filesystem mounted on ``folder`` (nothing when it is not a mount point)."""
    try:
        if not os.path.ismount(folder):
            return
    except OSError:
        return
    _libc_call().umount2(str(folder).encode(), MNT_DETACH)


NO_MOUNT_ENV = "CRL_SWE_NO_QUOTA_MOUNT"  # "1": use the checked budget, not a tmpfs


class QuotaWatch:
    """The checked budget: called from a command's output loop, says why to stop it, if so."""

    def __init__(self, tops: tuple[Path, ...], max_bytes: int, max_inodes: int) -> None:
        self.tops, self.max_bytes, self.max_inodes = tops, max_bytes, max_inodes
        self.next_at = time.monotonic() + WATCH_INTERVAL_S
        self.reason = ""

    def __call__(self) -> str:
        now = time.monotonic()
        if now < self.next_at:
            return ""
        used = tree_usage(*self.tops)
        self.next_at = time.monotonic() + max(WATCH_INTERVAL_S, 2 * (time.monotonic() - now))
        if used.bytes > self.max_bytes:
            self.reason = (f"stopped: the workspace reached {used.bytes / 2**20:,.1f} MiB, over "
                           f"its disk quota of {self.max_bytes / 2**20:,.0f} MiB")
        elif used.inodes > self.max_inodes:
            self.reason = (f"stopped: the workspace reached {used.inodes:,} files and folders, "
                           f"over its quota of {self.max_inodes:,}")
        return self.reason


def chown_tree(top: Path, uid: int) -> None:
    """``chown -R -h uid:uid top``, iteratively."""
    os.lchown(top, uid, uid)
    stack = [str(top)]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            os.lchown(entry.path, uid, uid)
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)


def fs_usage(folder: Path) -> tuple[int, int]:
    """Bytes and inodes in use on the filesystem holding ``folder`` (the quota tmpfs)."""
    st = os.statvfs(folder)
    return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_files - st.f_ffree
