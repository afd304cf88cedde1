"""Unified diffs (the ``patch`` / ``test_patch`` fields of SWE-bench records) in plain Python.

Only what the env needs: the files a diff touches, its hunks as (old text, new text) pairs, and
turning a diff into the env's own ``replace`` / ``create`` actions (used by tests and by the
scripted gold-patch check, so that the gold patch goes through the same tools an agent uses).
Applying a diff to a workspace is ``git apply``'s job, run inside the sandbox.
"""

from __future__ import annotations

import re
from typing import Callable
from dataclasses import dataclass, field

_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchParseError(ValueError):
    """The text is not a unified diff this parser understands."""


@dataclass
class Hunk:
    """One ``@@`` block. ``old`` / ``new`` are the lines before / after (context included),
    each line with its newline."""

    old_start: int
    new_start: int
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)


@dataclass
class FilePatch:
    """The changes to one file. ``old_path`` is None for a new file, ``new_path`` for a
    deleted one."""

    old_path: str | None
    new_path: str | None
    hunks: list[Hunk] = field(default_factory=list)
    binary: bool = False

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""

    @property
    def is_new(self) -> bool:
        return self.old_path is None

    @property
    def is_deleted(self) -> bool:
        return self.new_path is None


def _strip_prefix(name: str) -> str | None:
    name = name.strip().split("\t")[0]
    if name == "/dev/null":
        return None
    if name.startswith(("a/", "b/")):
        return name[2:]
    return name


def parse_patch(text: str) -> list[FilePatch]:
    """Parse a (git-style) unified diff into per-file hunks.

    Raises:
        PatchParseError: a hunk header or hunk body is malformed.
    """
    files: list[FilePatch] = []
    lines = text.splitlines(keepends=True)
    i = 0
    current: FilePatch | None = None
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            m = re.match(r"diff --git a/(.*) b/(.*)$", line.rstrip("\n"))
            current = FilePatch(m.group(1) if m else None, m.group(2) if m else None)
            files.append(current)
            i += 1
            continue
        if line.startswith("new file mode") and current is not None:
            current.old_path = None
        elif line.startswith("deleted file mode") and current is not None:
            current.new_path = None
        elif line.startswith(("Binary files", "GIT binary patch")) and current is not None:
            current.binary = True
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = _strip_prefix(line[4:]), _strip_prefix(lines[i + 1][4:])
            if current is None or current.hunks:
                current = FilePatch(old, new)
                files.append(current)
            else:
                current.old_path, current.new_path = old, new
            i += 2
            continue
        elif line.startswith("@@"):
            if current is None:
                raise PatchParseError(f"hunk before any file header: {line.strip()}")
            m = _HUNK_RE.match(line)
            if not m:
                raise PatchParseError(f"bad hunk header: {line.strip()}")
            old_n = int(m.group(2)) if m.group(2) is not None else 1
            new_n = int(m.group(4)) if m.group(4) is not None else 1
            hunk = Hunk(int(m.group(1)), int(m.group(3)))
            i += 1
            while (old_n > 0 or new_n > 0) and i < len(lines):
                body = lines[i]
                if body.startswith("\\"):  # "\ No newline at end of file"
                    i += 1
                    continue
                tag, content = body[:1], body[1:]
                if tag == " " or body in ("\n", "\r\n"):
                    content = content if tag == " " else body
                    hunk.old.append(content)
                    hunk.new.append(content)
                    old_n -= 1
                    new_n -= 1
                elif tag == "-":
                    hunk.old.append(content)
                    old_n -= 1
                elif tag == "+":
                    hunk.new.append(content)
                    new_n -= 1
                else:
                    raise PatchParseError(f"unexpected line in hunk: {body.rstrip()!r}")
                i += 1
            if old_n != 0 or new_n != 0:
                raise PatchParseError(f"hunk {line.strip()} ends early")
            if i < len(lines) and lines[i].startswith("\\"):
                # the last line of the hunk has no newline at end of file
                _drop_final_newline(hunk, lines[i - 1][:1])
                i += 1
            current.hunks.append(hunk)
            continue
        i += 1
    return files


def _drop_final_newline(hunk: Hunk, tag: str) -> None:
    targets = {"-": [hunk.old], "+": [hunk.new], " ": [hunk.old, hunk.new]}.get(tag, [])
    for side in targets:
        if side and side[-1].endswith("\n"):
            side[-1] = side[-1][:-1]


def patch_files(text: str) -> list[str]:
    """Paths (relative to the repository root) that a diff touches, in order."""
    seen: list[str] = []
    for fp in parse_patch(text):
        for p in (fp.old_path, fp.new_path):
            if p and p not in seen:
                seen.append(p)
    return seen


def apply_hunks(original: str, hunks: list[Hunk]) -> str:
    """Apply hunks to a file's text by exact matching of each hunk's old lines.

    Raises:
        PatchParseError: a hunk's old text is not found.
    """
    out = original
    for h in hunks:
        old, new = "".join(h.old), "".join(h.new)
        if not old:
            out = new + out if h.old_start <= 1 else out + new
            continue
        pos = out.find(old)
        if pos < 0:
            raise PatchParseError(f"hunk at line {h.old_start} does not match the file")
        out = out[:pos] + new + out[pos + len(old):]
    return out


def replace_action(path: str, old: str, new: str) -> str:
    """The env's ``replace`` action text for one exact substitution."""
    return (f"replace {path}\n<<<<<<< SEARCH\n{_block(old)}=======\n{_block(new)}"
            ">>>>>>> REPLACE")


def create_action(path: str, content: str) -> str:
    """The env's ``create`` action text for a whole file."""
    return f"create {path}\n{content}"


def _block(text: str) -> str:
    return text if text.endswith("\n") or not text else text + "\n"


def patch_to_actions(text: str, read_file: Callable[[str], str] | None = None) -> list[str]:
    """Turn a diff into the env's edit actions, hunk by hunk.

    Each hunk becomes one ``replace`` whose SEARCH block is the hunk's old lines (context
    included). A hunk whose old text is empty or not unique in the file becomes a ``create``
    with the whole patched file, which needs ``read_file(path)`` (the current file text). New
    files become ``create``; deleted files become ``run rm -f``.

    Raises:
        PatchParseError: the diff is binary, or a hunk cannot be placed.
    """
    actions: list[str] = []
    for fp in parse_patch(text):
        if fp.binary:
            raise PatchParseError(f"{fp.path}: binary diffs cannot be replayed as text edits")
        if fp.is_deleted:
            actions.append(f"run rm -f -- {fp.old_path}")
            continue
        if fp.is_new:
            actions.append(create_action(fp.path, "".join("".join(h.new) for h in fp.hunks)))
            continue
        current = read_file(fp.path) if read_file is not None else None
        edits: list[str] = []
        simulated = current
        for h in fp.hunks:
            old, new = "".join(h.old), "".join(h.new)
            unique = simulated is None or simulated.count(old) == 1
            if not old or not new or "\r" in old or not unique:
                edits = []
                break
            edits.append(replace_action(fp.path, old, new))
            if simulated is not None:
                simulated = simulated.replace(old, new, 1)
        if edits:
            actions.extend(edits)
            continue
        if current is None:
            raise PatchParseError(f"{fp.path}: a hunk is empty or ambiguous; pass read_file "
                                  "to rewrite the whole file instead")
        actions.append(create_action(fp.path, apply_hunks(current, fp.hunks)))
    return actions
