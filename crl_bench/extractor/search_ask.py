"""Search-and-Ask: the actor's mid-episode question to the experience system.

The rollout engine calls ``SearchAndAsk(query, episode_context)`` when the actor uses its search
tool. The manager retrieves entries for the query; the extractor rewrites them into concrete
guidance for the situation the actor is in; that guidance is the tool's observation. Each such
extractor call is recorded in ``samples`` (prompt messages, generation object, entry ids), so the
co-training loop can train the extractor on it like on any other extractor output.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from crl_bench.experience.bank import ExperienceEntry
from crl_bench.extractor.extraction import clip_middle, extract_answer
from crl_bench.experience.manager import ExperienceManager, Generate, generation_text

NO_MATCH = "The experience library has nothing on this yet. Continue with your own judgement."
MAX_GUIDANCE_CHARS = 1500


@dataclass
class EpisodeContext:
    """What the extractor is told about the episode that asks."""

    goal: str
    observation: str = ""
    """The actor's latest observation (the situation the guidance is for)."""
    family: str | None = None
    """Env family; retrieval is restricted to it (None = all families)."""
    task_id: str | None = None
    episode_id: str | None = None


@dataclass
class SearchAskSample:
    """One recorded Search-and-Ask extractor call (a trainable extractor sample)."""

    query: str
    context: EpisodeContext
    messages: list[dict[str, str]]
    generation: Any
    entry_ids: list[int]
    guidance: str
    malformed: bool


_SYSTEM = """You advise an agent that is in the middle of a task in a text-based environment. \
It has asked a question; you have entries from its experience library that may help. Turn them \
into concrete advice for the agent's current situation: what to do next and what to avoid. Use \
only what applies here; say so if nothing does. At most five sentences.

Think first if you want, then put the advice, addressed to the agent, between <answer> and \
</answer>."""


_OFFICIAL_SYSTEM = """You are an expert knowledge specialist helping an agent that is stuck or \
struggling with a task to make progress.

You receive the agent's query and knowledge retrieved from a knowledge base meant to help it.
1. Analyse the agent's situation: understand its specific challenge from the query.
2. Judge the relevance: is the retrieved knowledge applicable to its current problem?
3. Judge the helpfulness: will it genuinely help, or could it confuse the agent?

The retrieved knowledge may be wrong, incomplete or too specific: check it against your own \
knowledge of the world and supplement it. Give detailed, informative, well-structured knowledge.

In your final answer do NOT mention or critique the retrieved knowledge and do NOT explain why \
some of it may not apply: give only actionable guidance.

Put your reasoning between <think> and </think> and the knowledge for the agent between \
<answer> and </answer>; make it actionable and aimed at the agent's challenge."""
"""``TOOL_USE_SYS_PROMPT_251203`` (``memory_prompts.yaml:712-735``), in our words."""

ASK_STYLES = ("short", "official")


def build_official_ask_messages(query: str, entries: Sequence[ExperienceEntry]
                                ) -> list[dict[str, str]]:
    """``TOOL_USE_USE_PROMPT_251203`` (``memory_prompts.yaml:737-744``): the query and the
    retrieved knowledge, nothing else."""
    listing = "\n".join(e.render() for e in entries)
    user = (f"**Query:**\n{query.strip()}\n\n**Retrieved Knowledge:**\n{listing}\n\n"
            "Please analyze the situation and provide the most helpful knowledge to assist the "
            "agent. Formulate your analysis in the <think>...</think> tags and output the "
            "knowledge in the <answer>...</answer> tags.")
    return [{"role": "system", "content": _OFFICIAL_SYSTEM}, {"role": "user", "content": user}]


def build_search_ask_messages(query: str, context: EpisodeContext,
                              entries: Sequence[ExperienceEntry], *,
                              max_observation_chars: int = 2000) -> list[dict[str, str]]:
    """Chat messages asking the extractor to turn ``entries`` into guidance for ``query``."""
    listing = "\n".join(f"[id {e.id}] {e.render()}" for e in entries)
    user = (f"## Goal of the task\n{context.goal.strip()}\n\n"
            f"## Current situation\n"
            f"{clip_middle(context.observation.strip(), max_observation_chars) or '(unknown)'}"
            f"\n\n## The agent asks\n{query.strip()}\n\n"
            f"## Library entries\n{listing}\n\n"
            f"## Your task\nWrite the advice inside <answer></answer>.")
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]


class SearchAndAsk:
    """The rollout engine's tool hook: ``__call__(query, episode_context) -> observation text``.

    Thread-safe (several rollout workers may ask at once). Limiting uses per episode is the
    engine's job (it knows the episode); this object answers every call.

    Args:
        manager: retrieval goes through it (diversified, usage counted).
        generate: the extractor role: ``generate(list of message lists) -> [obj with .text]``.
        k: entries retrieved per question.
        style: "short" (at most five sentences, 1,500 characters; an unparseable answer is
            malformed and the actor gets the entries) or "official"
            (``async_memory_manager.py:2700-2830``: the long knowledge-specialist prompt, no cap;
            an answer without ``<answer>`` is the whole response, handed on and trained like any
            other, :2822-2830).
    """

    def __init__(self, manager: ExperienceManager, generate: Generate, *, k: int = 2,
                 style: str = "short") -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if style not in ASK_STYLES:
            raise ValueError(f"style must be one of {ASK_STYLES}, got {style!r}")
        self.style = style
        self.manager = manager
        self.generate = generate
        self.k = k
        self.samples: list[SearchAskSample] = []
        self._lock = threading.Lock()

    def __call__(self, query: str, episode_context: EpisodeContext | Mapping[str, Any]) -> str:
        context = _as_context(episode_context)
        query = str(query).strip()
        if not query:
            return "Your search query was empty. Ask a question about your situation."
        entries = self.manager.retrieve([query], k=self.k, family=context.family)[0]
        if not entries:
            return NO_MATCH
        official = self.style == "official"
        messages = (build_official_ask_messages(query, entries) if official
                    else build_search_ask_messages(query, context, entries))
        generation = list(self.generate([messages]))
        if len(generation) != 1:
            raise ValueError(f"generate() returned {len(generation)} outputs for 1 prompt")
        answer = extract_answer(generation_text(generation[0]))
        if official and not answer:  # the whole response is the answer (and is trained)
            answer = generation_text(generation[0]).strip()
        malformed = not answer
        if malformed:
            # The actor still gets something useful: the entries themselves.
            guidance = "Related experience:\n" + "\n".join(f"- {e.render()}" for e in entries)
        else:
            guidance = answer
        if not official:
            guidance = clip_middle(guidance, MAX_GUIDANCE_CHARS)
        else:  # the tool's observation (tools/search_and_ask_tool.py:102)
            guidance = f"Search results: {guidance}\n"
        with self._lock:
            self.samples.append(SearchAskSample(
                query=query, context=context, messages=messages, generation=generation[0],
                entry_ids=[e.id for e in entries], guidance=guidance, malformed=malformed))
        return guidance

    def drain_samples(self) -> list[SearchAskSample]:
        """Take the recorded samples (the list is emptied)."""
        with self._lock:
            out, self.samples = self.samples, []
        return out


def _as_context(ctx: EpisodeContext | Mapping[str, Any]) -> EpisodeContext:
    if isinstance(ctx, EpisodeContext):
        return ctx
    if isinstance(ctx, Mapping):
        known = {"goal", "observation", "family", "task_id", "episode_id"}
        if "goal" not in ctx:
            raise ValueError("episode_context needs a 'goal'")
        return EpisodeContext(**{k: ctx[k] for k in known if k in ctx})
    raise TypeError(f"episode_context must be an EpisodeContext or a mapping, got "
                    f"{type(ctx).__name__}")
