"""The extractor role: the prompt that turns a finished episode into bank operations, and the
strict parser of its answer.

The extractor sees the goal, the trajectory (with the experience that was injected into the
actor's prompt removed, so it judges what the agent did, not what it was told), the outcome and
the entries that were retrieved; it answers with at most 3 operations as a JSON list inside
``<answer>...</answer>``:

    [{"op": "add", "title": "...", "content": "..."},
     {"op": "update", "target_ids": [12], "title": "...", "content": "..."},
     {"op": "return"}]

Parsing is strict: anything off the format changes nothing and is reported as malformed, so the
trainer can give that sample the lowest reward instead of guessing what was meant.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

from crl_bench.experience.bank import ExperienceEntry
from crl_bench.experience.manager import Operation

MAX_OPS = 3
MAX_TITLE_CHARS = 200
MAX_CONTENT_CHARS = 2000
EXPERIENCE_OPEN = "<experience>"
EXPERIENCE_CLOSE = "</experience>"

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_FENCE_RE = re.compile(r"^```[a-zA-Z]*\s*\n?(.*?)\n?```$", re.DOTALL)
_EXPERIENCE_RE = re.compile(re.escape(EXPERIENCE_OPEN) + r".*?" + re.escape(EXPERIENCE_CLOSE),
                            re.DOTALL)


# ---------------------------------------------------------------------------------------------
# the experience block in the actor's prompt
# ---------------------------------------------------------------------------------------------

def render_experience_block(entries: Sequence[ExperienceEntry]) -> str:
    """The text injected into the actor's prompt for the retrieved ``entries`` ("" if none).
    Delimited so that ``strip_experience_block`` can take it out again for the extractor."""
    if not entries:
        return ""
    lines = [EXPERIENCE_OPEN,
             "Notes from earlier episodes (use them where they fit this situation):"]
    lines += [f"- {e.render()}" for e in entries]
    lines.append(EXPERIENCE_CLOSE)
    return "\n".join(lines)


def strip_experience_block(text: str) -> str:
    """``text`` without any experience block (and without the blank lines it leaves)."""
    out = _EXPERIENCE_RE.sub("", text)
    return re.sub(r"\n{3,}", "\n\n", out).strip()


# ---------------------------------------------------------------------------------------------
# trajectory text
# ---------------------------------------------------------------------------------------------

def trajectory_pairs(traj: Any, keep_reasoning: bool = False
                     ) -> tuple[list[tuple[str, str]], str | None]:
    """A trajectory as (observation the turn answered, what the turn sent) pairs, and the
    observation after its last turn (None without turns).

    The observation a turn answered is the episode's ``first_observation`` for the first turn and
    the previous turn's ``observation`` (what came back after it) for the others, so the text
    reads as the episode went: start, move, what came of it, ..., end — the order of the official
    extraction prompt, which renders the whole conversation, the first environment message
    included, and the terminal observation after it (ComplementaryRL
    ``async_memory_manager.py:1339-1356``, ``memory_integration_mixin.py:306-309``). What a turn
    sent: its action, or its whole completion with ``keep_reasoning`` or when it sent no action
    (an ask or an invalid-format turn).
    """
    pairs: list[tuple[str, str]] = []
    before = str(getattr(traj, "first_observation", "") or "")
    for turn in traj.turns:
        sent = turn.completion_text if (keep_reasoning or turn.action is None) else turn.action
        pairs.append((before, sent))
        before = turn.observation
    return pairs, (before if traj.turns else None)


def trajectory_to_text(turns_as_pairs: Sequence[tuple[str, str]], max_chars: int = 6000,
                       final_observation: str | None = None) -> str:
    """(observation, action) pairs -> one compact text of at most ``max_chars`` characters.

    Each turn renders as ``"[step i]\\n<observation>\\n> <action>"``; ``final_observation`` (what
    came after the last action, :func:`trajectory_pairs`) as a last block ``"[after step n]\\n<it>"``.
    When the whole does not fit:
    first each observation is clipped to ``max(200, max_chars // 8)`` characters (head and tail
    kept, the middle replaced by " ... "); if it still does not fit, the first turn and as many of
    the last turns as fit are kept around a line ``"[... N steps omitted ...]"``; as a last resort
    the text is cut at ``max_chars``. ``max_chars=0``: no cut (the official extractor sees the
    whole conversation).
    """
    if max_chars < 0:
        raise ValueError(f"max_chars must be >= 0 (0 = no cut), got {max_chars}")
    turns = [(strip_experience_block(str(o)), str(a).strip()) for o, a in turns_as_pairs]
    final = None if final_observation is None else strip_experience_block(str(final_observation))

    def render(i: int, obs: str, act: str) -> str:
        return f"[step {i + 1}]\n{obs.strip()}\n> {act}"

    def rendered(clip: int | None) -> list[str]:
        cut = (lambda o: o) if clip is None else (lambda o: clip_middle(o, clip))
        blocks = [render(i, cut(o), a) for i, (o, a) in enumerate(turns)]
        if final is not None:
            blocks.append(f"[after step {len(turns)}]\n{cut(final).strip()}")
        return blocks

    blocks = rendered(None)
    text = "\n\n".join(blocks)
    if max_chars == 0 or len(text) <= max_chars:
        return text
    blocks = rendered(max(200, max_chars // 8))
    text = "\n\n".join(blocks)
    if len(text) <= max_chars:
        return text
    head, tail = blocks[0], []
    for j in range(len(blocks) - 1, 0, -1):
        omitted = j - 1
        marker = f"[... {omitted} steps omitted ...]" if omitted else ""
        candidate = "\n\n".join([head] + ([marker] if marker else []) + [blocks[j]] + tail)
        if len(candidate) > max_chars:
            break
        tail.insert(0, blocks[j])
    omitted = len(blocks) - 1 - len(tail)
    parts = [head] + ([f"[... {omitted} steps omitted ...]"] if omitted else []) + tail
    return "\n\n".join(parts)[:max_chars]


def clip_middle(text: str, limit: int) -> str:
    """``text`` if it fits in ``limit`` characters, else its head and tail around " ... "."""
    if len(text) <= limit:
        return text
    keep = max(limit - 5, 2)
    return text[: keep - keep // 2] + " ... " + text[len(text) - keep // 2:]


# ---------------------------------------------------------------------------------------------
# the prompt
# ---------------------------------------------------------------------------------------------

_SYSTEM = """You curate the experience library of an agent that solves tasks in text-based \
environments. After each episode you read what the agent did and decide how the library should \
change so that future episodes go better.

A good library entry is a reusable strategy: it says in which situation it applies and what to \
do there, in terms that carry over to other tasks of the same kind. Do not store one-off facts \
about a single episode (exact coordinates, item numbers, one product's name).

Operations you may use:
- add: a new entry, with a short "title" and a "content" of one to four sentences.
- update: rewrite existing entries given by "target_ids" (ids from the retrieved list) into one \
better entry, when the episode shows they were wrong, incomplete or too narrow.
- return: change nothing (when the episode teaches nothing new).

Think first if you want, then give your final decision as a JSON list of at most {max_ops} \
operations between <answer> and </answer>, for example:
<answer>[{{"op": "add", "title": "...", "content": "..."}}]</answer>
<answer>[{{"op": "update", "target_ids": [7], "title": "...", "content": "..."}}]</answer>
<answer>[{{"op": "return"}}]</answer>
Use only the keys shown. An answer that does not follow this format is discarded."""


_DETAILED = """A good library entry is directly usable: it is detailed enough for an agent to \
succeed with it alone. Its content gives (1) the situation in which it applies, (2) a concrete \
step-by-step course of action with the specifics that carry over, (3) explicit if-then decision \
logic with a fallback when the condition does not hold, and (4) what not to do and why. Abstract \
away coordinates, instances and this one episode, but keep every actionable principle. Prefer \
updating related entries into one more complete entry over adding a near-duplicate; add only a \
genuinely new kind of insight."""
"""What ``FUNCTIONAL_MEMORY_MODEL_SYS_PROMPT_VOTING_251207`` (``memory_prompts.yaml``) asks of
an entry ("MEMORY CONTENT REQUIREMENTS", "MEMORY CREATION RULES"), in our words."""

EXTRACTION_STYLES = ("short", "official")


def _system_prompt(style: str, max_ops: int) -> str:
    if style == "short":
        return _SYSTEM.format(max_ops=max_ops)
    if style != "official":
        raise ValueError(f"extraction style must be one of {EXTRACTION_STYLES}, got {style!r}")
    text = _SYSTEM.format(max_ops=max_ops)
    text = text.replace('a short "title" and a "content" of one to four sentences.',
                        'a short "title" and a detailed "content" (see below).')
    # the launched prompts set no cap on the number of operations (FUNCTIONAL_MEMORY_MODEL_*)
    text = text.replace(f"a JSON list of at most {max_ops} operations", "a JSON list of operations")
    text = text.replace("- return: change nothing", "- upvote / downvote: one vote for or against "
                        'retrieved entries given by "target_ids" (helped / misled the agent); an '
                        "entry voted below zero is deleted.\n- return: change nothing")
    text = text.replace(
        '<answer>[{"op": "return"}]</answer>', '<answer>[{"op": "downvote", "target_ids": [7]}]'
        '</answer>\n<answer>[{"op": "return"}]</answer>')
    head, tail = text.split("Operations you may use:", 1)
    return head + _DETAILED + "\n\nOperations you may use:" + tail


def build_extraction_messages(goal: str, trajectory_text: str, outcome: dict[str, Any],
                              retrieved: Sequence[ExperienceEntry], *, max_ops: int = MAX_OPS,
                              style: str = "short") -> list[dict[str, str]]:
    """Chat messages (system + user) asking the extractor for bank operations on one episode.

    Args:
        goal: the task goal as the agent saw it.
        trajectory_text: the episode as text, WITHOUT the injected experience block (see
            ``trajectory_to_text`` / ``strip_experience_block``).
        outcome: ``{"success": bool, "score": float, "n_actions": int}``.
        retrieved: the entries shown to the agent (their ids are the valid update targets).
        style: "short" (entries of one to four sentences) or "official" (detailed step-by-step
            entries with situation, actions, if-then logic and what to avoid, as the official
            extraction prompt asks).
    """
    missing = {"success", "score", "n_actions"} - set(outcome)
    if missing:
        raise ValueError(f"outcome needs keys success, score, n_actions; missing {sorted(missing)}")
    if _EXPERIENCE_RE.search(trajectory_text):
        trajectory_text = strip_experience_block(trajectory_text)
    result = "succeeded" if outcome["success"] else "failed"
    if retrieved:
        shown = "\n".join(f"[id {e.id}] {e.render()}" for e in retrieved)
    else:
        shown = "(none: the agent acted without stored experience)"
    user = (f"## Goal\n{goal.strip()}\n\n"
            f"## Outcome\nThe agent {result} (score {float(outcome['score']):.2f}) after "
            f"{int(outcome['n_actions'])} actions.\n\n"
            f"## Experience the agent was given\n{shown}\n\n"
            f"## What the agent did\n{trajectory_text.strip()}\n\n"
            f"## Your task\nDecide how the library should change: "
            + (f"at most {max_ops} operations " if style == "short" else "operations ")
            + "(add / update / return) as a JSON list inside <answer></answer>.")
    return [{"role": "system", "content": _system_prompt(style, max_ops)},
            {"role": "user", "content": user}]


@dataclass(frozen=True)
class ContentTemplate:
    """The answer skeleton for extractors too small to write the JSON themselves.

    Measured on the embedded SmolLM2-135M (8 samples each for a solved and a failed MiniHack
    episode, ``experiments/extractor_format.py``): valid answers 0/16 free, 0/16 with
    ``<answer>[{"op": "`` pre-filled, 0/16 pre-filled up to the title, 15/16 with this template
    (the one failure ran out of tokens before closing the content). With this template
    the assistant turn is pre-filled up to the content of one ``add``: the op and the title are
    fixed (the title names the goal and whether the episode succeeded) and the model writes only
    the content, ending it with a double quote. :meth:`answer` rebuilds the full answer for
    :func:`parse_operations`: the content up to the first ``"``, JSON-escaped; content that never
    ends (the token cap) or is empty stays malformed, so training still sees the failure.

    With the template the extractor can only add: update, return and merge decisions need a
    model that follows the free format (the ``paper`` preset).
    """

    stop: tuple[str, ...] = ('"',)
    title_chars: int = 80

    def title(self, goal: str, success: bool) -> str:
        goal = " ".join(str(goal).split()).rstrip(".") or "the task"
        goal = goal if len(goal) <= self.title_chars else goal[: self.title_chars - 3].rstrip() + "..."
        return f"{goal}: {'what worked' if success else 'what went wrong'}"

    def prefill(self, goal: str, success: bool, actions: Sequence[str] | None = None) -> str:
        """The text the assistant turn starts with (ends inside the open content string).
        ``actions``: the actions the episode took (used by :class:`ActionTemplate` only)."""
        return ('<answer>[{"op": "add", "title": ' + json.dumps(self.title(goal, success))
                + ', "content": "')

    def answer(self, prefill: str, text: str, actions: Sequence[str] | None = None) -> str:
        """``prefill`` + sampled ``text`` -> an answer for :func:`parse_operations`."""
        end = text.find('"')
        if end < 0:  # the content never closed: leave it unparseable
            return prefill + text
        return prefill[:-1] + json.dumps(text[:end]) + "}]</answer>"


_SENTENCE_END = re.compile(r"[.!?](?=[\s\"<]|$)")
SENTENCE_STOPS: tuple[str, ...] = (". ", "! ", "? ", "\n")
"""Stop strings that end a one-sentence field: a sentence end followed by a space (``3.5`` does
not stop it) or a line break."""


def is_complete_sentence(text: str, min_words: int = 3) -> bool:
    """A usable entry text: at least ``min_words`` words, ending with ``.``, ``!`` or ``?`` right
    after a word (not a text cut by the token cap, not empty)."""
    text = " ".join(str(text).split())
    if len(text.split()) < min_words or text[-1:] not in ".!?":
        return False
    return re.search(r"[\w)\]'\"]$", text[:-1]) is not None


def first_sentence(text: str, closers: Sequence[str], stem: str = "", min_words: int = 2
                   ) -> str | None:
    """A one-sentence field as the model wrote it after the pre-filled ``stem``: ``stem`` +
    ``text`` up to its first sentence end, the first line break or the first of ``closers`` (the
    model closing the field), whichever comes first. A field closed without final punctuation
    gets a ``.`` (its words are complete: the model ended it). None when none of them came (the
    token cap cut the sentence), the model wrote fewer than ``min_words`` words, or the result is
    not a complete sentence (:func:`is_complete_sentence`)."""
    cuts = [text.find(c) for c in (*closers, "\n") if c in text]
    close = min(cuts) if cuts else -1
    end = _SENTENCE_END.search(text)
    if end is not None and (close < 0 or end.end() <= close):
        own = text[:end.end()]
    elif close >= 0:
        own = text[:close].rstrip()
        own = own if own[-1:] in ".!?" else own + "."
    else:
        return None
    field = " ".join((stem + own).split())
    return field if len(own.split()) >= min_words and is_complete_sentence(field) else None


@dataclass(frozen=True)
class SentenceTemplate(ContentTemplate):
    """:class:`ContentTemplate` with a one-sentence budget: the content is pre-filled with a short
    stem (``stems``: for a solved / a failed episode) that starts an actionable sentence, the
    model finishes that one sentence, which ends at its first sentence end or line break (stop
    strings :data:`SENTENCE_STOPS`) or at the closing ``"``; the answer is closed for it. The
    content template lets the model write on until the closing quote, and the 135M model often
    runs into the token cap first or writes fragments (measured with
    ``experiments/extractor_format.py``; well-formed = parsed and the content a complete sentence,
    :func:`is_complete_sentence`)."""

    stop: tuple[str, ...] = ('"',) + SENTENCE_STOPS
    stems: tuple[str, str] = ("To succeed,", "To avoid this failure,")

    def prefill(self, goal: str, success: bool, actions: Sequence[str] | None = None) -> str:
        return super().prefill(goal, success) + self.stems[0 if success else 1]

    def answer(self, prefill: str, text: str, actions: Sequence[str] | None = None) -> str:
        head, _, stem = prefill.rpartition('"content": "')
        content = first_sentence(text, ('"',), stem)
        if content is None:  # cut by the token cap or not a sentence: leave it unparseable
            return prefill + text
        return f'{head}"content": {json.dumps(content)}}}]</answer>'


def episode_actions(traj: Any) -> list[str]:
    """The distinct actions an episode sent to its env, in the order first sent."""
    return list(dict.fromkeys(str(t.action).strip() for t in traj.turns if t.action))


@dataclass(frozen=True)
class ActionTemplate(SentenceTemplate):
    """:class:`SentenceTemplate` whose stem asks for one action (``"To succeed, take the action"``
    / ``"To avoid this failure, do not take the action"``, then ``"\\n>"``) and whose content
    must name one of the actions the episode took: the model's continuation is kept only when one
    of ``actions`` (case-insensitive, as whole words) starts within its first ``within_words``
    words; the content is then the stem (the ``>`` cue left out), that action and a ``.``.
    Anything else — another word, an action the episode did not take, no ``actions`` given —
    stays malformed (so does every answer for an episode that sent no action). For tasks where the
    entry's key (the episode's start, ``experience.key=episode_start``) says where it applies and
    its content only has to name the move that solved the episode or the one that failed it."""

    stop: tuple[str, ...] = ("\n", ".", ",", "}", "<")  # not '"': a quoted action is kept
    stems: tuple[str, str] = ("To succeed, take the action\n>",
                              "To avoid this failure, do not take the action\n>")
    """Each ends with a line break and ``>``, as the trajectory text renders an action
    (:func:`trajectory_to_text`): the 135M model then copies an action it saw more often."""
    within_words: int = 3

    @property
    def content_stems(self) -> tuple[str, ...]:
        """The stems as a written content holds them (success, failure): the cue ``\\n>`` left
        out."""
        return tuple(" ".join(s.split()).rstrip(" >") for s in self.stems)

    def claim(self, content: str) -> tuple[str, str] | None:
        """``("success" | "failure", action)`` of a content this template wrote (``"<stem>
        ACTION."``); None for any other text."""
        text = " ".join(str(content).split())
        for outcome, stem in zip(("success", "failure"), self.content_stems):
            if text.startswith(stem + " ") and text.endswith("."):
                action = text[len(stem) + 1:-1].strip()
                if action:
                    return outcome, action
        return None

    def answer(self, prefill: str, text: str, actions: Sequence[str] | None = None) -> str:
        head, _, stem = prefill.rpartition('"content": "')
        action = self.named_action(text, actions or ())
        if action is None:  # no action of the episode named: leave it unparseable
            return prefill + text
        content = " ".join(stem.split()).rstrip(" >") + f" {action}."  # a copy cue ">" dropped
        return f'{head}"content": {json.dumps(content)}}}]</answer>'

    def named_action(self, text: str, actions: Sequence[str]) -> str | None:
        """The first of ``actions`` (the longest where several start at the same word) that
        starts within the first ``within_words`` words of ``text``; None if none does."""
        def words(s: str) -> list[str]:  # quotes and punctuation around words dropped
            return re.findall(r"\w+(?:['-]\w+)*", s.lower())

        said = words(text)
        for start in range(min(self.within_words, len(said))):
            found = [a for a in actions
                     if words(a) and said[start:start + len(words(a))] == words(a)]
            if found:
                return max(found, key=lambda a: len(words(a)))
        return None


ANSWER_TEMPLATES: dict[str, ContentTemplate | None] = {"free": None, "content": ContentTemplate(),
                                                       "sentence": SentenceTemplate(),
                                                       "action": ActionTemplate()}
"""Extractor answer formats by config name (``extractor.answer_template``)."""


# ---------------------------------------------------------------------------------------------
# the parser
# ---------------------------------------------------------------------------------------------

def extract_answer(text: str) -> str | None:
    """The content of the last ``<answer>...</answer>`` block (a surrounding code fence
    removed), or None when there is none."""
    found = _ANSWER_RE.findall(text or "")
    if not found:
        return None
    body = found[-1].strip()
    fenced = _FENCE_RE.match(body)
    return fenced.group(1).strip() if fenced else body


def answer_json_list(text: str) -> list | None:
    """The last ``<answer>`` block parsed as a non-empty JSON list, or None (no block, not JSON,
    not a list, empty)."""
    body = extract_answer(text)
    if body is None:
        return None
    try:
        items = json.loads(body)
    except json.JSONDecodeError:
        return None
    return items if isinstance(items, list) and items else None


def parse_operations(text: str, valid_target_ids: set[int], max_ops: int = MAX_OPS
                     ) -> tuple[list[Operation], bool]:
    """Strictly parse the extractor's answer. Returns ``(operations, malformed)``; a malformed
    answer yields ``([], True)``.

    Malformed: no ``<answer>`` block; not a JSON list; empty or longer than ``max_ops``; an item
    that is not an object, has an unknown ``op`` or keys other than its op's; a title/content that
    is not a non-empty string or is too long; ``target_ids`` that are not a non-empty list of
    distinct ints from ``valid_target_ids``; the same target in two updates; ``return`` mixed with
    other operations.
    """
    items = answer_json_list(text)
    if items is None or len(items) > max_ops:
        return [], True
    ops: list[Operation] = []
    targeted: set[int] = set()
    for item in items:
        op = _parse_item(item, valid_target_ids)
        if op is None:
            return [], True
        if set(op.target_ids) & targeted:
            return [], True
        targeted.update(op.target_ids)
        ops.append(op)
    kinds = {op.kind for op in ops}
    if "return" in kinds and len(ops) > 1:
        return [], True
    return ops, False


def parse_operations_official(text: str, valid_target_ids: set[int]
                              ) -> tuple[list[Operation], bool]:
    """Parse the extractor's answer as the official parser does
    (``async_memory_manager.py:1172-1312`` ``parse_functional_operations_from_response`` and
    ``:1788-1795`` ``execute_functional_operations``). Returns ``(operations, malformed)``.

    Accepted: the last ``<answer>`` block as a JSON list or a single object; items in our keys
    (``{"op": "add", "title", "content"}``, ``{"op": "update", "target_ids", ...}``,
    ``{"op": "return"}``) or in the official ones (``{"function_name": "add", "parameters":
    {"new_memory": "<title>..</title><content>..</content>"}}``, ``update`` with ``idx`` /
    ``target_idx`` and ``new_memory`` / ``updated_memory``, ``upvote`` / ``downvote`` with
    ``idx``; ours ``{"op": "upvote", "target_ids": [...]}``: the manager adds / takes off a vote
    and deletes an entry voted below 0); extra keys are ignored; no cap on the number of operations or on the
    length of a text. Operations before a ``return`` apply, those after it do not. Update
    targets not among ``valid_target_ids`` are dropped (an update left without targets is
    stored as an add, as the manager does for vanished targets). Malformed: no block, not JSON,
    not a list or object, an item that is not an object or has an unknown operation or lacks
    its text (a text that is not a string). An empty list is a valid answer that changes
    nothing; an empty memory text is a valid ``add`` / ``update`` of an entry with no text
    (official: stored as it is, ``async_memory_manager.py:1873-1901``; apply it with
    ``apply_operations(..., allow_empty=True)``).
    """
    body = extract_answer(text)
    if body is None:
        return [], True
    try:
        items = json.loads(body)
    except json.JSONDecodeError:
        return [], True
    if isinstance(items, dict):
        items = [items]
    if not isinstance(items, list):
        return [], True
    ops: list[Operation] = []
    for item in items:
        op = _parse_official_item(item, valid_target_ids)
        if op is None:
            return [], True
        if op.kind == "return":
            break
        if op.kind in ("add", "update", "upvote", "downvote"):
            ops.append(op)
    return ops, False


def split_title_content(memory: str) -> tuple[str, str]:
    """An official memory text's (title, content): its ``<title>`` / ``<content>`` tags where
    present; else the whole text is the content and its first sentence (at most 80 characters)
    the title."""
    title = re.search(r"<title>(.*?)</title>", memory, re.DOTALL)
    content = re.search(r"<content>(.*?)</content>", memory, re.DOTALL)
    body = (content.group(1) if content else re.sub(r"<title>.*?</title>", "", memory,
                                                    flags=re.DOTALL)).strip()
    head = title.group(1).strip() if title else ""
    if not head:
        first = re.split(r"(?<=[.!?])\s", body, maxsplit=1)[0].strip()
        head = first if len(first) <= 80 else first[:77].rstrip() + "..."
    return head, body


def _parse_official_item(item: Any, valid_target_ids: set[int]) -> Operation | None:
    if not isinstance(item, dict):
        return None
    if "function_name" in item:
        kind = str(item["function_name"])
        params = item.get("parameters", {})
        if kind == "return":
            return Operation("return")
        if not isinstance(params, dict):
            return None
        if kind in ("upvote", "downvote"):
            idx = params.get("idx")
            ok = isinstance(idx, list) and idx and all(isinstance(i, int) for i in idx)
            return Operation(kind, target_ids=[t for t in dict.fromkeys(idx)
                                               if t in valid_target_ids]) if ok else None
        memory = params.get("new_memory", params.get("updated_memory"))
        if kind not in ("add", "update") or not isinstance(memory, str):
            return None
        title, content = split_title_content(memory)
        targets = params.get("idx", params.get("target_idx", [])) if kind == "update" else []
    else:
        kind = item.get("op")
        if kind == "return":
            return Operation("return")
        if kind in ("upvote", "downvote"):
            ids = item.get("target_ids")
            ok = (isinstance(ids, list) and ids
                  and all(isinstance(i, int) and not isinstance(i, bool) for i in ids))
            return Operation(kind, target_ids=[t for t in dict.fromkeys(ids)
                                               if t in valid_target_ids]) if ok else None
        if kind not in ("add", "update"):
            return None
        title, content = item.get("title"), item.get("content")
        if not (isinstance(title, str) and isinstance(content, str)):
            return None
        title, content = title.strip(), content.strip()
        targets = item.get("target_ids", []) if kind == "update" else []
    if kind == "update" and (not isinstance(targets, list)
                             or not all(isinstance(t, int) and not isinstance(t, bool)
                                        for t in targets)):
        return None
    # an empty memory text is accepted, as officially: with the launched
    # ``memory_format_pattern: null`` (yaml :195) the format check passes any string
    # (``async_memory_manager.py:1153-1155``, read at :1242 / :1271) and ``add`` stores the text
    # stripped, empty or not (:1873-1901); the manager stores it as an entry with no text
    targets = [t for t in dict.fromkeys(targets) if t in valid_target_ids]
    return Operation(kind, title=title, content=content, target_ids=targets)


def _parse_item(item: Any, valid_target_ids: set[int]) -> Operation | None:
    if not isinstance(item, dict):
        return None
    kind = item.get("op")
    if kind == "return":
        return Operation("return") if set(item) == {"op"} else None
    if kind == "add":
        if set(item) != {"op", "title", "content"}:
            return None
        target_ids: list[int] = []
    elif kind == "update":
        if set(item) != {"op", "target_ids", "title", "content"}:
            return None
        target_ids = item["target_ids"]
        if (not isinstance(target_ids, list) or not target_ids
                or not all(isinstance(t, int) and not isinstance(t, bool) for t in target_ids)
                or len(set(target_ids)) != len(target_ids)
                or not set(target_ids) <= set(valid_target_ids)):
            return None
    else:
        return None
    title, content = item["title"], item["content"]
    if not (isinstance(title, str) and isinstance(content, str)):
        return None
    title, content = title.strip(), content.strip()
    if not title or not content or len(title) > MAX_TITLE_CHARS or len(content) > MAX_CONTENT_CHARS:
        return None
    return Operation(kind, title=title, content=content, target_ids=list(target_ids))
