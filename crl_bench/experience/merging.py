"""The periodic merge: the prompt that shows the extractor a window of bank entries and the
strict parser of its decisions (merge / rewrite / discard / keep).

Answer format, a JSON list inside ``<answer>...</answer>``; ids not mentioned are kept:

    [{"op": "merge", "ids": [3, 7], "title": "...", "content": "..."},
     {"op": "rewrite", "ids": [5], "title": "...", "content": "..."},
     {"op": "discard", "ids": [9]},
     {"op": "keep", "ids": [11]}]
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

from crl_bench.experience.bank import ExperienceEntry
from crl_bench.experience.extraction import MAX_CONTENT_CHARS, MAX_TITLE_CHARS, extract_answer

MergeKind = Literal["merge", "rewrite", "discard", "keep"]


@dataclass
class MergeDecision:
    """What to do with some entries of a merge window."""

    kind: MergeKind
    ids: list[int]
    title: str = ""
    content: str = ""


_SYSTEM = """You curate the experience library of an agent that solves tasks in text-based \
environments. The library has grown by many small additions; your job now is to tidy a few \
entries at a time so that it stays short, general and correct.

For the entries you are shown, decide:
- merge: several entries say overlapping things -> one entry that keeps every useful point.
- rewrite: one entry is useful but vague, too specific or badly worded -> a better version.
- discard: an entry is wrong, useless, or fully covered by another one.
- keep: an entry is fine as it is (entries you do not mention are kept too).

A good entry says in which situation it applies and what to do there, in one to four sentences.

Think first if you want, then give your decisions as a JSON list between <answer> and </answer>, \
using only these keys:
<answer>[{"op": "merge", "ids": [3, 7], "title": "...", "content": "..."}, \
{"op": "rewrite", "ids": [5], "title": "...", "content": "..."}, {"op": "discard", "ids": [9]}, \
{"op": "keep", "ids": [11]}]</answer>
Each id may appear at most once. An answer that does not follow this format changes nothing."""


def build_merge_messages(entries: Sequence[ExperienceEntry], family: str
                         ) -> list[dict[str, str]]:
    """Chat messages asking the extractor what to do with one window of ``entries``."""
    if not entries:
        raise ValueError("a merge window needs at least one entry")
    listing = "\n".join(
        f"[id {e.id}] {e.render()} (retrieved {e.times_retrieved}x"
        + (f", mean outcome {e.mean_outcome:+.2f} over {e.n_used} uses" if e.n_used else "")
        + ")" for e in entries)
    user = (f"## Environment family\n{family}\n\n## Entries\n{listing}\n\n"
            f"## Your task\nDecide merge / rewrite / discard / keep for these entries, as a JSON "
            f"list inside <answer></answer>.")
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]


def parse_merge_decisions(text: str, window_ids: Sequence[int]
                          ) -> tuple[list[MergeDecision], bool]:
    """Strictly parse a merge answer. Returns ``(decisions, malformed)``; malformed -> ``([],
    True)``: no answer block, not a non-empty JSON list, unknown op or keys, ids not from the
    window or repeated, merge with fewer than 2 ids, rewrite with other than 1 id, bad text."""
    body = extract_answer(text)
    if body is None:
        return [], True
    try:
        items = json.loads(body)
    except json.JSONDecodeError:
        return [], True
    if not isinstance(items, list) or not items:
        return [], True
    allowed = set(window_ids)
    seen: set[int] = set()
    out: list[MergeDecision] = []
    for item in items:
        decision = _parse_item(item, allowed)
        if decision is None or set(decision.ids) & seen:
            return [], True
        seen.update(decision.ids)
        out.append(decision)
    return out, False


def _parse_item(item: Any, allowed: set[int]) -> MergeDecision | None:
    if not isinstance(item, dict):
        return None
    kind = item.get("op")
    with_text = kind in ("merge", "rewrite")
    if kind not in ("merge", "rewrite", "discard", "keep"):
        return None
    if set(item) != ({"op", "ids", "title", "content"} if with_text else {"op", "ids"}):
        return None
    ids = item["ids"]
    if (not isinstance(ids, list) or not ids
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
            or len(set(ids)) != len(ids) or not set(ids) <= allowed):
        return None
    if kind == "merge" and len(ids) < 2 or kind == "rewrite" and len(ids) != 1:
        return None
    if not with_text:
        return MergeDecision(kind, list(ids))
    title, content = item["title"], item["content"]
    if not (isinstance(title, str) and isinstance(content, str)):
        return None
    title, content = title.strip(), content.strip()
    if not title or not content or len(title) > MAX_TITLE_CHARS or len(content) > MAX_CONTENT_CHARS:
        return None
    return MergeDecision(kind, list(ids), title, content)


@dataclass
class MergeSample:
    """One extractor call of a merge, kept so the loop can train on it."""

    family: str
    messages: list[dict[str, str]]
    generation: Any
    window_ids: list[int]
    decisions: list[MergeDecision] = field(default_factory=list)
    malformed: bool = False
    stale: bool = False
    """The window changed (another write) before the decisions could be stored: nothing done."""
    created_ids: list[int] = field(default_factory=list)
    deleted_ids: list[int] = field(default_factory=list)


@dataclass
class MergeResult:
    """Everything one merge pass did."""

    samples: list[MergeSample] = field(default_factory=list)
    size_before: int = 0
    size_after: int = 0
    n_windows: int = 0
    n_malformed: int = 0
    n_stale: int = 0
    merged: int = 0
    """Original entries folded into merged entries."""
    rewritten: int = 0
    discarded: int = 0
    created_ids: list[int] = field(default_factory=list)
    deleted_ids: list[int] = field(default_factory=list)

    def generations(self) -> list[Any]:
        """The raw generation objects (with ``.text``), one per extractor call."""
        return [s.generation for s in self.samples]
