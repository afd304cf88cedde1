"""The agent's tools as text actions: syntax, parser and execution against a :class:`Sandbox`.

An action is free text whose first word names the tool (see :data:`TOOL_HELP`, which is also
what the agent is shown). Whatever does not parse is returned as feedback that says what was
wrong and how to write it, never as an exception.
"""

from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from crl_bench.envs.swe.sandbox import Sandbox, SandboxError, SandboxPathError, truncate_middle

TOOL_NAMES: tuple[str, ...] = ("run", "view", "search", "create", "replace", "submit", "help")

TOOL_HELP = """\
Tools (one action per turn; the first word names the tool):
  run <command>
      Run a bash command in the repository root (/testbed), e.g. `run python -m pytest tests -x -q`.
      The command may span several lines. No network. Output is truncated if long.
  view <path> [<start>-<end>]
      Show a file with line numbers (100 lines from <start> by default), or list a directory.
  search <text> [<path>]
      Find lines containing <text> (plain text, not a regex) under <path> (default: everything).
      Quote text with spaces: search "def parse(" src/
  create <path>
  <the whole new file content on the following lines>
      Create a file, or overwrite it with exactly the lines that follow the first line.
  replace <path>
  <<<<<<< SEARCH
  <lines to find: copied exactly, they must occur once in the file>
  =======
  <lines to put in their place>
  >>>>>>> REPLACE
      Replace one exact occurrence. Several SEARCH/REPLACE blocks may follow one another.
  submit
      Finish. Hidden tests are run on your changes and the episode ends.
  help
      Show this text."""

VIEW_WINDOW = 100
SEARCH_MAX_MATCHES = 50
SEARCH_LINE_CHARS = 200

_FENCE_RE = re.compile(r"^```[\w.+-]*[ \t]*\n(.*?)\n?```$", re.DOTALL)
_RANGE_RE = re.compile(r"^(\d+)(?:\s*(?:-|:|,|\s)\s*(\d+|\$|end)?)?$")
SEARCH_MARK = "<<<<<<< SEARCH"
DIVIDER = "======="
REPLACE_MARK = ">>>>>>> REPLACE"


class ActionError(ValueError):
    """The action text does not follow the syntax; the message is shown to the agent."""


@dataclass
class Action:
    """A parsed action: ``tool`` and its arguments."""

    tool: str
    path: str = ""
    text: str = ""                      # run: command; search: text; create: content
    start: int | None = None            # view range (1-based, inclusive)
    end: int | None = None
    blocks: list[tuple[list[str], list[str]]] = field(default_factory=list)  # replace


def strip_fence(text: str) -> str:
    """Drop one markdown code fence around the whole action (models often add one)."""
    m = _FENCE_RE.match(text.strip())
    return m.group(1) if m else text


def parse_action(raw: str) -> Action:
    """Parse action text.

    Raises:
        ActionError: the message says what is wrong and shows the right syntax.
    """
    text = strip_fence(raw).strip("\n\r")
    if not text.strip():
        raise ActionError("Empty action. Write one tool call, e.g. `view README.md` or "
                          "`run ls`. Type `help` for all tools.")
    first, _, rest = text.lstrip().partition("\n")
    word, _, args = first.strip().partition(" ")
    tool = word.lower()
    args = args.strip()
    if tool not in TOOL_NAMES:
        close = difflib.get_close_matches(tool, TOOL_NAMES, n=1)
        hint = f" Did you mean `{close[0]}`?" if close else ""
        shown = word if len(word) <= 40 else word[:40] + "..."
        raise ActionError(f"Unknown tool {shown!r}.{hint} Start the action with one of: "
                          f"{', '.join(TOOL_NAMES)}. Type `help` for the syntax.")
    if tool == "run":
        command = (args + ("\n" + rest if rest else "")).strip()
        if not command:
            raise ActionError("`run` needs a command, e.g. `run ls -la`.")
        return Action("run", text=command)
    if tool in ("submit", "help"):
        if args or rest.strip():
            raise ActionError(f"`{tool}` takes no arguments; write just `{tool}`.")
        return Action(tool)
    if tool == "view":
        return _parse_view(args, rest)
    if tool == "search":
        return _parse_search(args, rest)
    if tool == "create":
        path = _single_path(args, "create", "create src/new_module.py\n<file content>")
        return Action("create", path=path, text=rest)
    return _parse_replace(args, rest)


def _single_path(args: str, tool: str, example: str) -> str:
    if not args:
        raise ActionError(f"`{tool}` needs a path on its first line, e.g.:\n{example}")
    try:
        parts = shlex.split(args)
    except ValueError:
        parts = [args]
    if len(parts) != 1:
        raise ActionError(f"`{tool}` takes one path on its first line (got {args!r}); the content "
                          f"goes on the following lines, e.g.:\n{example}")
    return parts[0]


def _parse_view(args: str, rest: str) -> Action:
    if rest.strip():
        raise ActionError("`view` is one line: view <path> [<start>-<end>], e.g. `view src/a.py "
                          "40-80`.")
    if not args:
        raise ActionError("`view` needs a path, e.g. `view .` or `view src/a.py 40-80`.")
    try:
        parts = shlex.split(args)
    except ValueError:
        parts = args.split()
    if not parts:
        raise ActionError("`view` needs a path, e.g. `view .` or `view src/a.py 40-80`.")
    path, range_text = parts[0], " ".join(parts[1:])
    if not range_text:
        return Action("view", path=path)
    m = _RANGE_RE.match(range_text)
    if not m:
        raise ActionError(f"Bad line range {range_text!r}: write <start>-<end> with line numbers "
                          "from 1, e.g. `view src/a.py 40-80`.")
    start = int(m.group(1))
    end_text = m.group(2)
    # "$" / "end": to the end of the file (clipped when shown)
    end = None if end_text is None else 10**9 if end_text in ("$", "end") else int(end_text)
    if start < 1 or (end is not None and end < start):
        raise ActionError(f"Bad line range {range_text!r}: lines count from 1 and end >= start.")
    return Action("view", path=path, start=start, end=end)


def _parse_search(args: str, rest: str) -> Action:
    if rest.strip():
        raise ActionError("`search` is one line: search <text> [<path>].")
    if not args:
        raise ActionError("`search` needs text, e.g. `search parse_qs` or "
                          '`search "def parse(" src/`.')
    try:
        parts = shlex.split(args)
    except ValueError:
        raise ActionError("Unbalanced quotes in `search`. Quote text with spaces like this: "
                          'search "two words" src/') from None
    if not parts or len(parts) > 2:
        raise ActionError("`search` takes the text and at most one path. Quote text with spaces: "
                          'search "two words" src/')
    if not parts[0]:
        raise ActionError("`search` needs non-empty text.")
    return Action("search", text=parts[0], path=parts[1] if len(parts) == 2 else ".")


def _parse_replace(args: str, rest: str) -> Action:
    example = (f"replace src/a.py\n{SEARCH_MARK}\nold line\n{DIVIDER}\nnew line\n{REPLACE_MARK}")
    path = _single_path(args, "replace", example)
    lines = rest.split("\n")
    blocks: list[tuple[list[str], list[str]]] = []
    i = 0
    while i < len(lines):
        if not lines[i].strip():
            i += 1
            continue
        if lines[i].rstrip() != SEARCH_MARK:
            raise ActionError(f"Expected `{SEARCH_MARK}` on line {i + 2} of the action, got "
                              f"{lines[i][:60]!r}. The syntax is:\n{example}")
        try:
            close = next(j for j in range(i + 1, len(lines)) if lines[j].rstrip() == REPLACE_MARK)
        except StopIteration:
            raise ActionError(f"A `{SEARCH_MARK}` block is not closed by `{REPLACE_MARK}`. "
                              f"The syntax is:\n{example}") from None
        dividers = [j for j in range(i + 1, close) if lines[j].rstrip() == DIVIDER]
        if not dividers:
            raise ActionError(f"A SEARCH/REPLACE block has no `{DIVIDER}` line between the old "
                              f"and the new text. The syntax is:\n{example}")
        body = lines[i + 1:close]
        splits = [d - (i + 1) for d in dividers]
        # Several divider lines (a reStructuredText heading in the old text?): keep all
        # candidate splits; the one whose old text occurs in the file wins at execution time.
        blocks.append((body, splits))  # type: ignore[arg-type]
        i = close + 1
    if not blocks:
        raise ActionError(f"`replace` needs a SEARCH/REPLACE block after the path:\n{example}")
    return Action("replace", path=path, blocks=blocks)


# ---------------------------------------------------------------------------------------------
# Execution
# ---------------------------------------------------------------------------------------------

@dataclass
class ToolOutput:
    """The observation text of one tool call and whether the call did what was asked."""

    text: str
    ok: bool
    extra: dict[str, Any] = field(default_factory=dict)


class ToolRunner:
    """Executes parsed actions in a sandbox and formats their observations.

    Args:
        sandbox: where commands run and files live.
        max_observation_chars: observations longer than this keep their head and tail, with a
            marker saying how much was left out.
        command_timeout_s: wall-clock limit of a ``run`` command.
    """

    def __init__(self, sandbox: Sandbox, max_observation_chars: int = 6000,
                 command_timeout_s: float = 60.0) -> None:
        if max_observation_chars < 200:
            raise ValueError("max_observation_chars must be at least 200")
        self.sandbox = sandbox
        self.max_chars = max_observation_chars
        self.command_timeout_s = command_timeout_s

    def execute(self, action: Action) -> ToolOutput:
        try:
            handler = getattr(self, f"_do_{action.tool}")
            out: ToolOutput = handler(action)
        except (SandboxPathError, UnicodeError) as exc:
            out = ToolOutput(f"Error: {exc}", ok=False)
        except OSError as exc:  # ENAMETOOLONG, ELOOP, ENOTDIR, EEXIST, EACCES, ENOSPC, EFBIG...
            what = exc.strerror or str(exc)
            where = f" ({action.path[:200]})" if action.path else ""
            out = ToolOutput(f"Error: {what}{where}; nothing was changed by this action unless "
                             "it says so. Check the path.", ok=False)
        out.text = truncate_middle(out.text, self.max_chars)
        return out

    # -- tools ---------------------------------------------------------------------------------
    def _do_help(self, action: Action) -> ToolOutput:
        return ToolOutput(TOOL_HELP, ok=True)

    def _do_run(self, action: Action) -> ToolOutput:
        # The sandbox keeps only what fits, so its marker (with the byte count) is the one shown.
        result = self.sandbox.run(action.text, timeout_s=self.command_timeout_s,
                                  output_keep_bytes=self.max_chars - 200)
        body = result.output.rstrip("\n")
        if len(body) > self.max_chars - 150:  # multi-byte characters decoded wider
            body = truncate_middle(body, self.max_chars - 150)
        status = result.status_line(getattr(self.sandbox, "limits", None)
                                    and _with_timeout(self.sandbox.limits, self.command_timeout_s))
        text = (body + "\n" if body else "") + status
        return ToolOutput(text, ok=True, extra={"exit_code": result.exit_code,
                                                "timed_out": result.timed_out,
                                                "output_bytes": result.output_bytes})

    def _do_view(self, action: Action) -> ToolOutput:
        rel = str(self.sandbox.inside_path(action.path))
        try:
            content = self.sandbox.read_file(rel)
        except IsADirectoryError:
            listing = self.sandbox.run(f"ls -1Ap -- {shlex.quote(rel)}", timeout_s=30)
            return ToolOutput(f"[directory {rel}]\n" + listing.output.rstrip("\n"),
                              ok=listing.exit_code == 0)
        lines = content.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        total = len(lines)
        start = action.start or 1
        end = min(action.end or (start + VIEW_WINDOW - 1), total)
        if total == 0:
            return ToolOutput(f"[{rel}: empty file]", ok=True)
        if start > total:
            return ToolOutput(f"Error: {rel} has {total} lines; start {start} is past the end.",
                              ok=False)
        width = len(str(end))
        shown = [f"{n:>{width}} | {lines[n - 1]}" for n in range(start, end + 1)]
        head = f"[{rel}: lines {start}-{end} of {total}]"
        next_end = min(end + VIEW_WINDOW, total)
        more = (f"\n[{total - end} more lines: view {rel} {end + 1}-{next_end}]"
                if end < total else "")
        return ToolOutput(head + "\n" + _encode_shown("\n".join(shown)) + more, ok=True)

    def _do_search(self, action: Action) -> ToolOutput:
        rel = str(self.sandbox.inside_path(action.path))
        cmd = (f"grep -rnIF --exclude-dir=.git -e {shlex.quote(action.text)} -- {shlex.quote(rel)}"
               f" | head -n {SEARCH_MAX_MATCHES + 1}")
        result = self.sandbox.run(cmd, timeout_s=30)
        if result.timed_out:
            return ToolOutput("Error: the search took too long; give a narrower path.", ok=False)
        hits = [h for h in result.output.split("\n") if h]
        if hits and "No such file or directory" in hits[0] and len(hits) == 1:
            return ToolOutput(f"Error: {rel}: no such file or directory", ok=False)
        if not hits:
            return ToolOutput(f"No matches for {action.text!r} in {rel}.", ok=True)
        more = len(hits) > SEARCH_MAX_MATCHES
        shown = [h if len(h) <= SEARCH_LINE_CHARS else h[:SEARCH_LINE_CHARS] + " [...]"
                 for h in hits[:SEARCH_MAX_MATCHES]]
        tail = (f"\n[more than {SEARCH_MAX_MATCHES} matches; search a narrower path or longer "
                "text]") if more else ""
        prefix = "./" if rel == "." else ""
        shown = [s[len(prefix):] if prefix and s.startswith(prefix) else s for s in shown]
        return ToolOutput("\n".join(shown) + tail, ok=True)

    def _do_create(self, action: Action) -> ToolOutput:
        rel = str(self.sandbox.inside_path(action.path))
        if rel == ".":
            return ToolOutput("Error: `create` needs a file path, not the repository root.",
                              ok=False)
        try:
            self.sandbox.read_file(rel)
            existed = True
        except FileNotFoundError:
            existed = False
        except (SandboxPathError, IsADirectoryError) as exc:
            return ToolOutput(f"Error: {exc}", ok=False)
        content = action.text
        if content and not content.endswith("\n"):
            content += "\n"
        self.sandbox.write_file(rel, content)
        n = content.count("\n")
        return ToolOutput(f"{'Overwrote' if existed else 'Created'} {rel} ({n} lines).", ok=True)

    def _do_replace(self, action: Action) -> ToolOutput:
        rel = str(self.sandbox.inside_path(action.path))
        original = self.sandbox.read_file(rel)
        crlf = "\r\n" in original and "\n" not in original.replace("\r\n", "")
        text = original.replace("\r\n", "\n") if crlf else original
        changed_at: list[int] = []
        first_new_lines = 1
        for number, (body, splits) in enumerate(action.blocks, start=1):
            where = f" (block {number})" if len(action.blocks) > 1 else ""
            chosen = None
            for split in splits:  # type: ignore[union-attr]
                if _line_occurrences(text, "\n".join(body[:split])):
                    chosen = split
                    break
            split = splits[0] if chosen is None else chosen  # type: ignore[index]
            old, new = "\n".join(body[:split]), "\n".join(body[split + 1:])
            if not old.strip():
                return ToolOutput(f"Error{where}: the SEARCH part is empty; copy the exact lines "
                                  "to replace from `view` output (without line numbers).", ok=False)
            found = _line_occurrences(text, old)
            if not found:
                partial = text.find(old)
                hint = (f" It matches only part of line {text.count(chr(10), 0, partial) + 1}; "
                        "SEARCH must hold whole lines." if partial >= 0
                        else _closest_hint(text, old))
                return ToolOutput(f"Error{where}: the SEARCH text was not found in {rel} as whole "
                                  f"lines; nothing was changed.{hint}", ok=False)
            if len(found) > 1:
                lines = [text.count("\n", 0, p) + 1 for p in found]
                return ToolOutput(f"Error{where}: the SEARCH text occurs {len(found)} times in "
                                  f"{rel} (at lines {', '.join(map(str, lines))}); add surrounding "
                                  "lines so it occurs once. Nothing was changed.", ok=False)
            pos = found[0]
            changed_at.append(text.count("\n", 0, pos) + 1)
            if len(changed_at) == 1:
                first_new_lines = len(new.split("\n"))
            text = text[:pos] + new + text[pos + len(old):]
        self.sandbox.write_file(rel, text.replace("\n", "\r\n") if crlf else text)
        snippet = _numbered_excerpt(text, changed_at[0], context=3, length=first_new_lines)
        return ToolOutput(f"Edited {rel} ({len(changed_at)} replacement"
                          f"{'s' if len(changed_at) > 1 else ''}). Now:\n{snippet}", ok=True)


def _with_timeout(limits: Any, timeout: float) -> Any:
    from dataclasses import replace

    return replace(limits, timeout_s=timeout)


def _encode_shown(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8", "replace")


def _line_occurrences(text: str, needle: str) -> list[int]:
    """Start offsets where ``needle`` occurs as whole lines (line start to line end)."""
    out: list[int] = []
    if not needle:
        return out
    start = 0
    while (pos := text.find(needle, start)) >= 0:
        end = pos + len(needle)
        if (pos == 0 or text[pos - 1] == "\n") and (end == len(text) or text[end] == "\n"
                                                    or needle.endswith("\n")):
            out.append(pos)
        start = pos + 1
    return out


def _closest_hint(text: str, old: str) -> str:
    first = next((line for line in old.split("\n") if line.strip()), "")
    lines = text.split("\n")
    stripped = [line.strip() for line in lines]
    match = difflib.get_close_matches(first.strip(), stripped, n=1, cutoff=0.6)
    if not match:
        return " Use `view` to copy the exact lines (whitespace included)."
    n = stripped.index(match[0]) + 1
    return (f" The closest line to its first line is line {n}: {lines[n - 1].strip()[:120]!r}."
            " Copy the lines exactly (indentation included), without line numbers.")


def _numbered_excerpt(text: str, line: int, context: int, length: int) -> str:
    lines = text.split("\n")
    lo = max(1, line - context)
    hi = min(len(lines), line + length - 1 + context)
    width = len(str(hi))
    return "\n".join(f"{n:>{width}} | {lines[n - 1]}" for n in range(lo, hi + 1))


def run_action_text(runner: ToolRunner, raw: str) -> tuple[Action | None, ToolOutput]:
    """Parse and execute one action; parse errors come back as a failed :class:`ToolOutput`."""
    try:
        action = parse_action(raw)
    except ActionError as exc:
        return None, ToolOutput(str(exc), ok=False)
    if action.tool == "submit":
        return action, ToolOutput("", ok=True)
    try:
        return action, runner.execute(action)
    except SandboxError as exc:
        return action, ToolOutput(f"Error: the sandbox failed: {exc}", ok=False)
