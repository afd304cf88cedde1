"""The periodic merge: the prompt that shows the extractor a window of bank entries, the parser
of its answer and :func:`merge_bank`, which walks the bank and applies it.

Two answer formats (``extractor.merge_format``):

``items`` (official, ``async_memory_manager.py:69-135`` ``parse_answer_to_list`` and
``:2475-2580`` ``_merge_single_task``; prompts ``memory_prompts.yaml`` ``MERGING_PROMPT_*``): the
answer lists the knowledge items that REPLACE the whole window, each between
``<<<KNOWLEDGE_ITEM>>>`` and ``<<<END_ITEM>>>`` inside ``<answer>``; ``<answer>return</answer>``
keeps the window as it is; an answer without a valid item keeps it too (malformed). Items of 30
characters or fewer and placeholders are dropped, as officially. An entry the answer omits is
deleted.

``ops`` (this project's earlier format), a JSON list inside ``<answer>...</answer>``; ids not
mentioned are kept:

    [{"op": "merge", "ids": [3, 7], "title": "...", "content": "..."},
     {"op": "rewrite", "ids": [5], "title": "...", "content": "..."},
     {"op": "discard", "ids": [9]},
     {"op": "keep", "ids": [11]}]
"""

from __future__ import annotations

import json
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

import numpy as np

from crl_bench.experience.bank import ExperienceEntry, StaleEntriesError, render_entry_text
from crl_bench.experience.manager import ExperienceManager, Generate, generation_text
from crl_bench.extractor.extraction import (MAX_CONTENT_CHARS, MAX_TITLE_CHARS, SENTENCE_STOPS,
                                             ActionTemplate, answer_json_list, extract_answer,
                                             first_sentence, split_title_content)

MERGE_FORMATS = ("items", "ops")
MERGE_SCOPES = ("family", "key")
KEY_TOLERANCE = 1e-4
"""Two entries share a retrieval key when the cosine of their stored vectors is within this of 1
(one episode start embedded twice gives the same vector; two different starts stay far below)."""
ITEM_OPEN, ITEM_CLOSE = "<<<KNOWLEDGE_ITEM>>>", "<<<END_ITEM>>>"
_ITEM_RE = re.compile(re.escape(ITEM_OPEN) + r"(.*?)" + re.escape(ITEM_CLOSE), re.DOTALL)
# async_memory_manager.py:137-164 ``_is_placeholder``
_PLACEHOLDERS = [re.compile(p) for p in (
    r"^string\d*$", r"^item\s*\d*$", r"^knowledge\s*\d*$", r"^entry\s*\d*$",
    r"^your\s+(comprehensive\s+)?knowledge", r"^\[.*placeholder.*\]$", r"^<.*>$", r"^\.\.\.$",
    r"^xxx+$", r"^first\s+(merged\s+)?knowledge", r"^second\s+(merged\s+)?knowledge")]
_GENERIC = {"example", "sample", "test", "placeholder", "todo", "tbd", "na", "none"}

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
    items = answer_json_list(text)
    if items is None:
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


_ITEMS_SYSTEM = """You are a knowledge specialist who merges knowledge items distilled from an \
agent's experiences. Produce fewer, stronger items: merge overlapping ones, drop poor ones, and \
rewrite over-fitted rules into general decision logic.

Quality bar: every item you output must be accurate, actionable and general enough to help on \
other tasks of the same family (no coordinates, exact positions or one-run fixes). Prefer \
conditional language (when / if / consider) over absolutes, tie actions to signals the agent can \
observe, and give a fallback when the condition does not hold. Give enough detail to be directly \
useful, typically three sentences or more.

Decide:
- merge items that share one core principle, without losing their conditions;
- rewrite an item whose idea is useful but over-fitted or missing conditions or a fallback;
- discard an item that is wrong, contradictory or specific to a single instance (leave it out);
- return when the items are already good, distinct and well structured.

The items you output REPLACE all the items you were shown: an item you leave out is deleted.
Each item has the structure <title>...</title><content>...</content>.

Output format (strict): think in <think></think>, then
<answer>
<<<KNOWLEDGE_ITEM>>>
<title>[merged, principle-focused title]</title>
<content>[merged knowledge]</content>
<<<END_ITEM>>>
[more items the same way]
</answer>
or, to keep the items unchanged:
<answer>
return
</answer>"""
"""``MERGING_PROMPT_SYS_PROMPT_251207`` (``memory_prompts.yaml``), in our words."""


OFFICIAL_MERGE_SYSTEM = (
    'You are a world-class knowledge specialist merging knowledge items from agent '
    'experiences.\n'
    'Your goal is to produce fewer, stronger memories by merging overlaps, removing '
    'low-quality items, and rewriting overfitted rules into generalizable decision logic.\n'
    '\n'
    '## QUALITY BAR (MUST MEET)\n'
    '    **Generalizability Level: 3+ (REQUIRED)**\n'
    '    - 5: Universal across domains\n'
    '    - 4: Domain-family principles (TARGET)\n'
    '    - 3: Task-family principles (ACCEPTABLE)\n'
    '    - 2: Scenario-specific (REJECT)\n'
    '    - 1: Instance-specific (REJECT)\n'
    '\n'
    '    Each merged item must be **accurate**, **actionable**, and **generalizable**:\n'
    '    - Avoid coordinates/exact locations, and single-run fixes.\n'
    '    - Prefer conditional language ("when/if/consider") over absolutes ("always/never").\n'
    '    - Include enough detail to be directly useful (typically 3+ sentences).\n'
    '\n'
    '## DECISION RULES\n'
    '    - **MERGE** when items share the same core principle and can be unified without '
    'losing key conditions.\n'
    '    - **REWRITE** when the core idea is useful but phrased as an overfitted rule or '
    'missing conditions/fallbacks.\n'
    '    - **DISCARD** when information is incorrect, contradictory, or too specific to a '
    'single instance.\n'
    '    - **RETURN** when items are already high-quality (3+), non-redundant, '
    'well-structured, and merging/rewriting would not materially improve them.\n'
    '\n'
    '## ANTI-OVERFITTING (CRITICAL; ALL DOMAINS)\n'
    '    Do NOT preserve hard-coded action orders or unverified priors as universal rules '
    '(directions/UI clicks are just examples).\n'
    '    Rewrite into robust, observation-driven logic:\n'
    '    - Tie actions to **observable signals** (inputs, constraints, tool outputs, '
    'environment feedback).\n'
    '    - Use explicit **if-then** decision criteria and a clear **fallback** when '
    'conditions are not met.\n'
    '    - If invalid/idle actions are penalized: prefer any valid, low-risk action that '
    'increases information or makes progress, then re-evaluate.\n'
    '    - For search/exploration tasks: track what was tried, avoid loops, expand '
    'systematically, and switch strategies when progress stalls.\n'
    '\n'
    '## REQUIRED MEMORY STRUCTURE\n'
    '    <title>...</title><content>...</content>\n'
    '\n'
    '## OUTPUT FORMAT (STRICT)\n'
    '    <think>[Your analysis of what to merge/rewrite/discard/return, and why]</think>\n'
    '    <answer>\n'
    '    <<<KNOWLEDGE_ITEM>>>\n'
    '    <title>[Merged, principle-focused title]</title>\n'
    '    <content>[Merged knowledge content]</content>\n'
    '    <<<END_ITEM>>>\n'
    '    <<<KNOWLEDGE_ITEM>>>\n'
    '    <title>[Second merged title]</title>\n'
    '    <content>[Second merged knowledge content]</content>\n'
    '    <<<END_ITEM>>>\n'
    '    </answer>\n'
    '    or\n'
    '    <answer>\n'
    '    return\n'
    '    </answer>\n')
"""``MERGING_PROMPT_SYS_PROMPT_251207`` (``memory_prompts.yaml:873-922``, the launched
``merging_system_prompt``, yaml :236), verbatim."""

OFFICIAL_MERGE_USER = (
    'Knowledge items to merge:\n'
    '\n'
    '{entries}\n'
    '\n'
    'Merge related items and output using this EXACT format:\n'
    '<think>[your analysis]</think>\n'
    '<answer>\n'
    '<<<KNOWLEDGE_ITEM>>>\n'
    '[Your merged knowledge content]\n'
    '<<<END_ITEM>>>\n'
    '</answer>\n')
"""``MERGING_PROMPT_USE_PROMPT_251201`` (``memory_prompts.yaml:698-709``, the launched
``merging_user_prompt``, yaml :237), verbatim; ``{entries}``: the ``--- Entry i ---`` blocks."""

MERGE_STYLES = ("ours", "official")


def render_item(entry: ExperienceEntry) -> str:
    """An entry as the official memory value: ``<title>...</title><content>...</content>``."""
    return f"<title>{entry.title}</title><content>{entry.content}</content>"


def build_item_merge_messages(entries: Sequence[ExperienceEntry], official: bool = False
                              ) -> list[dict[str, str]]:
    """``_call_merge_llm`` (``async_memory_manager.py:2644-2660``): the items as ``--- Entry i
    ---`` blocks in ``MERGING_PROMPT_USE_PROMPT_251201`` (the model sees only their text).
    ``official``: the launched prompts verbatim (:data:`OFFICIAL_MERGE_SYSTEM`,
    :data:`OFFICIAL_MERGE_USER`); else our shorter system prompt."""
    if not entries:
        raise ValueError("a merge window needs at least one entry")
    listing = "\n\n".join(f"--- Entry {i + 1} ---\n{render_item(e)}" for i, e in enumerate(entries))
    if official:
        return [{"role": "system", "content": OFFICIAL_MERGE_SYSTEM},
                {"role": "user", "content": OFFICIAL_MERGE_USER.format(entries=listing)}]
    user = (f"Knowledge items to merge:\n\n{listing}\n\nMerge related items and output using "
            f"this EXACT format:\n<think>[your analysis]</think>\n<answer>\n{ITEM_OPEN}\n"
            f"[your merged knowledge]\n{ITEM_CLOSE}\n</answer>")
    return [{"role": "system", "content": _ITEMS_SYSTEM}, {"role": "user", "content": user}]


def _is_placeholder(text: str) -> bool:
    low = text.lower().strip()
    return low in _GENERIC or any(p.match(low) for p in _PLACEHOLDERS)


def parse_merge_items(text: str) -> list[tuple[str, str]] | None:
    """``parse_answer_to_list``: the items of the last ``<answer>`` block as (title, content);
    ``[]`` for an explicit ``return`` (plain or ``{"function_name": "return"}``); None when the
    answer has no block, is empty or holds no valid item (the window is kept)."""
    body = extract_answer(text)
    if not body:
        return None
    if body.strip().lower() == "return":
        return []
    if body.startswith("{") and body.endswith("}"):
        try:
            obj = json.loads(body)
            if isinstance(obj, dict) and str(obj.get("function_name", "")).lower() == "return":
                return []
        except json.JSONDecodeError:
            pass
    items = [m.strip() for m in _ITEM_RE.findall(body)]
    items = [split_title_content(m) for m in items if len(m) > 30 and not _is_placeholder(m)]
    return items or None


@dataclass(frozen=True)
class ItemTemplate:
    """The merge answer skeleton for extractors too small to write the format themselves (with
    ``extractor.answer_template`` content or sentence).

    ``one_sentence=True`` (default): the assistant turn is pre-filled up to one item's content,
    its title fixed (the title most of the window's entries share, else the oldest entry's); the
    model writes one sentence of merged knowledge, ended by its first sentence end
    (:data:`~crl_bench.extractor.extraction.SENTENCE_STOPS`) or a closing tag, and
    :meth:`answer` closes the item. A sentence cut by the token cap (or not a sentence) stays
    unparseable (malformed).

    ``one_sentence=False``: pre-filled with ``<answer>`` and the opening of one item only; the
    model writes the item (title and content) until ``<<<`` / ``</answer>`` or its end; a text cut
    by the token cap keeps its complete sentences. With SmolLM2-135M and 48 new tokens most such
    answers ran into the cap before a sentence ended (``experiments/extractor_format.py``)."""

    one_sentence: bool = True
    prefill_text: str = f"<answer>\n{ITEM_OPEN}\n"
    stem: str = "When"
    """The content's pre-filled start (``one_sentence``): a conditional, as the prompt asks."""

    @property
    def stop(self) -> tuple[str, ...]:
        return ("<",) + SENTENCE_STOPS if self.one_sentence else ("<<<", "</answer>")

    @staticmethod
    def title(entries: Sequence[ExperienceEntry]) -> str:
        """The window's title: the one most entries share (ties: the oldest), one line."""
        titles = [" ".join(str(e.title).split()) for e in entries if str(e.title).strip()]
        if not titles:
            return "Merged knowledge"
        return max(titles, key=lambda t: (titles.count(t), -titles.index(t)))

    def prefill(self, entries: Sequence[ExperienceEntry] = ()) -> str:
        if not self.one_sentence:
            return self.prefill_text
        return f"{self.prefill_text}<title>{self.title(entries)}</title>\n<content>{self.stem}"

    def answer_for(self, entries: Sequence[ExperienceEntry], text: str, finish_reason: str) -> str:
        """The answer for the window ``entries`` (pre-filled with :meth:`prefill` of them)."""
        return self.answer(text, finish_reason, self.prefill(entries))

    def answer(self, text: str, finish_reason: str, prefill: str | None = None) -> str:
        """``prefill`` (default: :meth:`prefill` of no entries) + the sampled ``text`` -> an
        answer for :func:`parse_merge_items`."""
        prefill = self.prefill() if prefill is None else prefill
        if self.one_sentence:
            head, _, stem = prefill.rpartition("<content>")
            content = first_sentence(text, ("<",), stem)
            if content is None:
                return prefill + text
            return f"{head}<content>{content}</content>\n{ITEM_CLOSE}\n</answer>"
        if finish_reason == "length":
            ends = [m.end() for m in re.finditer(r"[.!?](?=\s|$)", text)]
            if not ends:
                return prefill + text
            text = text[:ends[-1]]
        return f"{prefill}{text.strip()}\n{ITEM_CLOSE}\n</answer>"


@dataclass(frozen=True)
class ActionItemTemplate(ItemTemplate):
    """The merge answer skeleton for entries written with the ``action`` answer template
    (:class:`~crl_bench.extractor.extraction.ActionTemplate`: "To succeed, take the action X." /
    "To avoid this failure, do not take the action X.").

    The item's content is pre-filled with the success stem when an entry of the window has it
    (else the failure stem), and the model names the action; the answer is kept only when its
    first words name an action that an entry of the window with that same stem names, so a merged
    entry restates a move its window's entries support with the same outcome (anything else is
    malformed and keeps the window). With one-action episodes keyed by their start, the merge of
    a window holding a success keeps that success's move."""

    action: ActionTemplate = ActionTemplate()

    @property
    def stop(self) -> tuple[str, ...]:
        return self.action.stop

    def window_claim(self, entries: Sequence[ExperienceEntry]) -> tuple[str, list[str]]:
        """The stem the merged content starts with (success when an entry of the window claims
        one, else failure) and the actions the window's entries name under that stem."""
        claims = [c for c in (self.action.claim(e.content) for e in entries) if c is not None]
        outcome = "success" if any(o == "success" for o, _ in claims) else "failure"
        stem = self.action.content_stems[outcome == "failure"]
        return stem, list(dict.fromkeys(a for o, a in claims if o == outcome))

    def window_title(self, entries: Sequence[ExperienceEntry]) -> str:
        """The merged item's title, agreeing with its content's outcome: the title most of the
        entries that make the window's claim share (:meth:`window_claim`: the success entries
        when there is one, else the failure entries; ties: the oldest), else the window's; an
        outcome suffix of the extraction template (``: what worked`` / ``: what went wrong``)
        that names the other outcome is replaced, so that a success item is never titled as a
        failure (the actor is shown "title: content")."""
        stem = self.window_claim(entries)[0]
        outcome = "failure" if stem == self.action.content_stems[1] else "success"
        claiming = [e for e in entries if (c := self.action.claim(e.content)) and c[0] == outcome]
        title = self.title(claiming or entries)
        good, bad = ((": what worked", ": what went wrong") if outcome == "success"
                     else (": what went wrong", ": what worked"))
        if title.endswith(bad):
            title = title[:-len(bad)] + good
        return title

    def prefill(self, entries: Sequence[ExperienceEntry] = ()) -> str:
        return (f"{self.prefill_text}<title>{self.window_title(entries)}</title>\n"
                f"<content>{self.window_claim(entries)[0]}")

    def answer_for(self, entries: Sequence[ExperienceEntry], text: str, finish_reason: str) -> str:
        prefill = self.prefill(entries)
        stem, actions = self.window_claim(entries)
        action = self.action.named_action(text, actions)
        if action is None:  # no action the window supports with this outcome: malformed
            return prefill + text
        head = prefill[:len(prefill) - len(stem)]
        return f"{head}{stem} {action}.</content>\n{ITEM_CLOSE}\n</answer>"


def key_groups(vectors: np.ndarray, tol: float = KEY_TOLERANCE) -> list[list[int]]:
    """Row indices of ``vectors`` (normalised, oldest first) grouped by shared retrieval key: a
    row joins the first group whose first row it matches within ``tol`` (cosine), else opens one.
    Groups in order of their first row, rows in order."""
    groups: list[list[int]] = []
    heads: list[np.ndarray] = []
    for i, v in enumerate(np.asarray(vectors, dtype=np.float32)):
        for g, h in zip(groups, heads):
            if float(np.dot(v, h)) >= 1.0 - tol:
                g.append(i)
                break
        else:
            groups.append([i])
            heads.append(v)
    return groups


@dataclass
class MergeSample:
    """One extractor call of a merge, kept so the loop can train on it."""

    family: str
    messages: list[dict[str, str]]
    generation: Any
    window_ids: list[int]
    key_group: int | None = None
    """With ``scope="key"``: the window's key group (its index within the family)."""
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
    n_scopes: int = 0
    """Scopes walked (families, or with ``scope="key"`` key groups of two or more entries)."""
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


def merge_bank(manager: ExperienceManager, generate: Generate, *, step: int, chunk: int = 5,
               families: Sequence[str] | None = None, fmt: str = "ops",
               template: ItemTemplate | None = None, scope: str = "family",
               style: str = "ours") -> MergeResult:
    """Walk the bank (per scope, oldest first) in windows of ``chunk`` entries and let the
    extractor merge / rewrite / discard / keep them.

    Sliding window (official ``_merge_single_task``): the entries a window produced (merged or
    rewritten) open the scope's next window, filled up with fresh entries to ``chunk``. Windows
    of different scopes go to ``generate`` together in one batch. Each window's decisions are
    stored in ONE transaction (replacements added and originals deleted together) and only if
    every original is still unchanged; a malformed answer or a changed window changes nothing.

    Args:
        manager: the bank's :class:`ExperienceManager` (all reads and writes go through it).
        generate: ``generate(list of chat message lists) -> list of objects with .text``.
        step: actor step recorded on new entries.
        chunk: window size (>= 2).
        families: only these families (default: all).
        fmt: the answer format, "items" (official: the returned items replace the window) or
            "ops" (merge / rewrite / discard / keep decisions; entries not mentioned are kept).
        template: with "items", pre-fill each answer up to one item (small models).
        scope: what a window may mix. "family" (official: one scope per task family): every
            entry of a family. "key": only entries that share a retrieval key (the same stored
            vector: with ``experience.key=episode_start``, the same episode start); a merged
            entry keeps that key instead of being embedded by its own text, so it is still found
            by the starts its parents were, and nothing produced under one key carries into
            another key's window. With a one-item template, "family" leaves one entry per family
            after a pass; "key" one per key.
        style: "ours": a window carries at most ``chunk - 1`` of the entries the last window
            produced and is filled up to ``chunk``; merged entries inherit their parents'
            retrieval counts (so that diversification does not favour them); our shorter item
            prompt. In both styles a window holds at least one fresh entry: what the last window
            returned when none is left is final. "official" (``_merge_single_task``, ``async_memory_manager.py:2504-2580``):
            ``chunk`` fresh entries plus *all* the items the last window returned (appended to
            the next pre-cut chunk, :2576-2578); merged entries start with fresh usage (added
            as new entries, :2456, their parents' usage deleted, :2447-2449); the launched
            prompts verbatim.
    """
    if style not in MERGE_STYLES:
        raise ValueError(f"merge style must be one of {MERGE_STYLES}, got {style!r}")
    official = style == "official"
    if fmt not in MERGE_FORMATS:
        raise ValueError(f"merge format must be one of {MERGE_FORMATS}, got {fmt!r}")
    if scope not in MERGE_SCOPES:
        raise ValueError(f"merge scope must be one of {MERGE_SCOPES}, got {scope!r}")
    if template is not None and fmt != "items":
        raise ValueError("the merge answer template needs the 'items' format")
    if chunk < 2:
        raise ValueError(f"chunk must be >= 2 (a window compares entries), got {chunk}")
    bank = manager.bank
    result = MergeResult(size_before=len(bank))
    scopes = _scopes(bank, manager, families, scope)
    result.n_scopes = len(scopes)
    queues = [deque(ids) for _, _, ids, _ in scopes]
    carry: list[list[int]] = [[] for _ in scopes]
    while True:
        windows: list[tuple[int, list[ExperienceEntry]]] = []
        with manager.read_lock():
            for n, q in enumerate(queues):
                ids = list(carry[n]) if official else carry[n][-(chunk - 1):]
                cap = len(ids) + chunk if official else chunk
                carried = len(ids)
                while q and len(ids) < cap:
                    i = q.popleft()
                    if i not in ids:
                        ids.append(i)
                entries = bank.get(ids)
                carry[n] = []
                if len(ids) == carried:
                    # no fresh entry left: the last window's items are final (:2579-2581), in
                    # every style (a window of only carried items could return as many again,
                    # forever); so each window takes at least one fresh entry and a pass makes
                    # at most as many model calls as its scopes hold entries
                    continue
                if len(entries) >= 2:
                    windows.append((n, entries))
                elif q and entries:  # one survivor: let it open the next window
                    carry[n] = [entries[0].id]
        if not windows:
            if any(queues):
                continue
            break
        if fmt == "items":
            messages = [build_item_merge_messages(entries, official) for _, entries in windows]
        else:
            messages = [build_merge_messages(entries, scopes[n][0]) for n, entries in windows]
        if template is not None:
            messages = [m + [{"role": "assistant", "content": template.prefill(entries)}]
                        for m, (_, entries) in zip(messages, windows)]
            generations = list(generate(messages, stop=template.stop))
        else:
            generations = list(generate(messages))
        if len(generations) != len(messages):
            raise ValueError(f"generate() returned {len(generations)} outputs for "
                             f"{len(messages)} prompts")
        for (n, entries), msgs, gen in zip(windows, messages, generations):
            fam, group, _, key_vec = scopes[n]
            sample = MergeSample(family=fam, messages=msgs, generation=gen,
                                 window_ids=[e.id for e in entries], key_group=group)
            result.samples.append(sample)
            result.n_windows += 1
            carry[n] = _apply_window(manager, sample, entries, step, result, fmt, template,
                                     key_vec, fresh_usage=official)
    result.size_after = len(bank)
    manager.count_merge(result.n_windows, result.n_malformed)
    return result


def _scopes(bank: Any, manager: ExperienceManager, families: Sequence[str] | None, scope: str
            ) -> list[tuple[str, int | None, list[int], np.ndarray | None]]:
    """``(family, key group or None, ids oldest first, the group's key vector or None)`` for
    each scope of two or more entries (a scope of one has nothing to merge)."""
    out: list[tuple[str, int | None, list[int], np.ndarray | None]] = []
    with manager.read_lock():
        fams = sorted(families) if families is not None else sorted(bank.family_counts())
        for fam in fams:
            ids = bank.all_ids(fam)
            if scope == "family":
                if len(ids) >= 2:
                    out.append((fam, None, ids, None))
                continue
            vecs = bank.get_embeddings(ids) if ids else np.zeros((0, bank.dim), np.float32)
            for g, rows in enumerate(key_groups(vecs)):
                if len(rows) >= 2:
                    out.append((fam, g, [ids[r] for r in rows], vecs[rows[0]]))
    return out


def _item_decisions(text: str, window_ids: list[int]) -> tuple[list[MergeDecision], bool]:
    """The "items" answer as decisions: every item replaces the whole window (a window of one
    item and one entry is a rewrite); ``return`` keeps it; no valid item: malformed."""
    items = parse_merge_items(text)
    if items is None:
        return [], True
    if not items:
        return [MergeDecision("keep", list(window_ids))], False
    kind: MergeKind = "merge" if len(window_ids) > 1 else "rewrite"
    return [MergeDecision(kind, list(window_ids), t, c) for t, c in items], False


def _apply_window(manager: ExperienceManager, sample: MergeSample, entries: list[ExperienceEntry],
                  step: int, result: MergeResult, fmt: str = "ops",
                  template: ItemTemplate | None = None, key_vec: np.ndarray | None = None,
                  fresh_usage: bool = False) -> list[int]:
    """Store one window's decisions (new entries stored with ``key_vec`` when given, else
    embedded by their text; ``fresh_usage``: never retrieved, else their parents' summed
    retrieval counts); returns the ids to carry into the next window."""
    text = generation_text(sample.generation)
    if template is not None:
        text = template.answer_for(entries, text,
                                   str(getattr(sample.generation, "finish_reason", "stop")))
    if fmt == "items":
        decisions, malformed = _item_decisions(text, sample.window_ids)
    else:
        decisions, malformed = parse_merge_decisions(text, sample.window_ids)
    sample.decisions, sample.malformed = decisions, malformed
    if malformed:
        result.n_malformed += 1
        return []
    by_id = {e.id: e for e in entries}
    new_entries: list[dict[str, Any]] = []
    texts: list[str] = []
    deletes: list[int] = []
    for d in decisions:
        if d.kind == "keep":
            continue
        deletes.extend(i for i in d.ids if i not in deletes)  # "items": each item, every id
        if d.kind == "discard":
            continue
        parents = [by_id[i] for i in d.ids]
        lasts = [p.last_retrieved for p in parents if p.last_retrieved is not None]
        new_entries.append({
            "title": d.title, "content": d.content, "family": sample.family,
            "task_ids": _union(*(p.task_ids for p in parents)),
            "run": parents[0].run, "origin": d.kind, "parent_ids": list(d.ids),
            "source_trajectories": _union(*(p.source_trajectories for p in parents)),
            # ours: usage carries over so that diversification does not favour merged entries
            "times_retrieved": 0 if fresh_usage else sum(p.times_retrieved for p in parents),
            "last_retrieved": None if fresh_usage or not lasts else max(lasts)})
        texts.append(render_entry_text(d.title, d.content))
    if not deletes:
        return []
    try:
        commit = manager.replace_if_unchanged(
            new_entries, texts, deletes, {i: by_id[i].version for i in deletes}, step,
            embeddings=None if key_vec is None else np.repeat(key_vec[None], len(new_entries), 0))
    except StaleEntriesError:
        sample.stale = True
        result.n_stale += 1
        return []
    sample.created_ids, sample.deleted_ids = commit.added_ids, commit.deleted_ids
    result.created_ids += commit.added_ids
    result.deleted_ids += commit.deleted_ids
    counted: set[int] = set()
    for d in decisions:
        fresh = [i for i in d.ids if i not in counted]
        counted.update(fresh)
        if d.kind == "merge":
            result.merged += len(fresh)
        elif d.kind == "rewrite":
            result.rewritten += 1 if fresh else 0
        elif d.kind == "discard":
            result.discarded += len(fresh)
    return list(commit.added_ids)


def _union(*lists: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(x for lst in lists for x in lst))
