"""Prompt building and answer parsing for text-env agents (pure functions, no model).

The actor sees, each turn, one fresh chat: a system prompt for the env family and a user message
with the goal, an optional experience block, a window of its last ``h`` turns, the current
observation, the admissible actions (when the env lists them) and the answer format
``<think>...</think><answer>ACTION</answer>`` (thinking optional). A completion may instead ask
for advice with ``<ask>QUERY</ask>`` when the engine has an ask callback (Search-and-Ask).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

CONVERSATIONS = ("full", "window")
"""``PromptConfig.conversation``'s values."""
EXAMPLE_PICKS = ("first", "random", "none", "placeholder")
"""``PromptConfig.example_pick``'s values."""
PLACEHOLDER_EXAMPLE = "ACTION"
"""The example answer under ``example_pick="placeholder"``: a word that names no action, followed
in the format line by ``where ACTION is one of the admissible actions``."""

DEFAULT_SYSTEM_PROMPTS: dict[str, str] = {
    "text": (
        "You are an agent in a text-based environment. Each turn you read an observation and "
        "choose one action to reach the goal."),
}
"""The fallback system prompt. Each env family owns its own prompt: it is registered with its envs
(``register_env(..., system_prompt=...)`` in ``envs/<family>/registration.py``)."""

LAYOUTS = ("ours", "official")
"""``PromptConfig.layout``'s values."""
EXPERIENCE_PLACES = ("user", "system")
"""``PromptConfig.experience_place``'s values."""


@dataclass
class PromptConfig:
    """How the rollout engine talks to the actor.

    Penalty convention: each invalid-format turn adds ``-format_penalty`` to that turn's reward,
    hence to the trajectory reward (the env is not stepped). Score and success are the env's.
    """

    history: int = 2
    """Previous turns shown in the prompt: the last ``history`` turns (2, as verl-agent), 0 for
    none, -1 for the full history ("window" conversations only)."""
    conversation: str = "window"
    """"window": each turn is one fresh chat (system + one user message with the goal, a window
    of ``history`` past turns and the observation). "full" (official): one multi-turn chat per
    episode; each turn appends the assistant's sampled tokens and a user message with the next
    observation (:func:`build_followup_message`), so a turn's prompt ids are the previous turn's
    prompt + completion + the new message's tokens, exactly."""
    think: bool = True
    """Ask for ``<think>...</think>`` reasoning before the answer (the parser never requires it)."""
    show_admissible: bool = True
    """List the env's admissible actions in the prompt when it has them."""
    system_prompts: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_SYSTEM_PROMPTS))
    """Overrides of the system prompt per env family (``env.unwrapped.family``); a family not
    listed uses the prompt registered with its envs, ``"text"`` is the fallback."""
    max_turns: int | None = None
    """Cap on turns per episode (actions, invalid-format turns and asks all count); None = the
    env's ``max_steps`` (30 when it has none)."""
    max_episode_tokens: int = 8192
    """Cap on generated tokens per episode; each turn's max_new_tokens shrinks to what is left."""
    sequence_length: int | None = None
    """Cap on prompt + generated tokens of a turn (official ``sequence_length``,
    ``traj_env_manager.py:318-331``): a turn whose prompt reaches it ends the episode, otherwise
    its max_new_tokens shrinks to what is left. None = no cap."""
    max_prompt_tokens: int | None = None
    """If a prompt is longer, the oldest history turns are dropped; if it still is, the episode
    ends truncated. None = no cap."""
    format_penalty: float = 0.0
    """Subtracted from the reward of each invalid-format turn."""
    answer_tag: str = "answer"
    ask_tag: str = "ask"
    max_asks: int = 2
    """Asks allowed per episode (only offered when the engine has an ask callback)."""
    ask_style: str = "short"
    """How Search-and-Ask is offered: "short" (one sentence in the answer-format line) or
    "official" (also the long tool instruction, :data:`ASK_INSTRUCTION`, in the episode's first
    prompt, as the official tool wrapper adds it at reset)."""
    stop_at_tags: bool = True
    """Stop generation at ``</answer>`` and ``</ask>`` (the completion keeps the closing tag)."""
    stop_at_answer: bool = True
    """With ``stop_at_tags``: stop at ``</answer>`` too (False: only at the ask's closing tag,
    as the official actor, yaml :101 ``stop_strings: ["</knowledge_search_and_ask>"]``)."""
    ask_wins: bool = False
    """A reply holding both an ask and an answer is an ask while asks are left (official: the
    tool wrapper tries its tools on the whole reply before the env sees it,
    ``tool_env_wrapper.py:45-52``). False: the answer wins."""
    observation_last: bool = False
    """Put the current observation after the admissible actions and the answer format (default:
    before them), so that it is the last thing read before the answer. Measured with the
    embedded 135M actor on MiniHack (``experiments/minihack_reading.py``): it still copies the
    example answer (46%) and writes fewer valid answers (24% vs 72%), so the default stays."""
    experience_last: bool = False
    """Put the experience block after the observation and the admissible actions, just before
    the answer format (default: right after the goal, as the official prompt has it). Measured
    with the embedded 135M actor on the Landmark levels (``experiments/minihack_landmark.py
    --follow --set rollout.experience_last=true``, results/experience_helps)."""
    max_observation_chars: int | None = 6000
    """Observations longer than this are cut in the middle (the prompt says so). None = never."""
    max_response_chars: int | None = 6000
    """A past turn's response as the history window shows it (the action taken, or the question
    asked) is cut in the middle beyond this many characters, with a marker saying how many were
    cut, as observations are (``max_observation_chars``). The window then stays bounded however
    long the actions a policy writes: fed back whole, one 50,000-character action made every
    later prompt ~27k tokens long. The official code feeds a whole response back, bounded only
    by its per-turn generation cap (``max_new_tokens_per_step: 4096`` tokens,
    examples/singletask-agentic/multitask_env.yaml:9); an action (the text inside ``<answer>``)
    of the benchmark's envs is far shorter than this bound. None = never cut."""
    answer_example: bool = False
    """Show an example answer built from an admissible action (``e.g. <answer>north
    </answer>``). Small models (the embedded 135M one) follow the format only with it."""
    example_pick: str = "first"
    """Which admissible action the example shows. "first": always the first listed — a small
    model copies it, so an RL policy collapses onto that one action (measured: 89-93% ``north``
    after 10 GRPO steps on MiniHack, results/learning_minihack). "random": one drawn per turn
    from a generator seeded by ``(example_seed, turn)`` (the engine gives each episode its own
    seed, from its sampling seed and the episode's index), so copying the example is a random
    walk rather than a fixed action. "placeholder": the example names no action
    (``e.g. <answer>ACTION</answer>`` with :data:`PLACEHOLDER_EXAMPLE`, "where ACTION is one of
    the admissible actions"), so no move is steered by the format line: a small model copied the
    drawn example in 54-87% of its answers (results/experience_helps), which made every agent's
    score a draw shared by all agents of one sampling seed. "none": no example at all."""
    response_prefix: str = ""
    """Text the assistant turn starts with, fed as prompt tokens (e.g. ``"<answer>"`` makes a
    small model that cannot follow the format emit just the action). The parser reads
    ``response_prefix + completion_text``; the completion ids/text stay the sampled ones."""
    layout: str = "ours"
    """"ours": the messages above. "official" (``paper``; "full" conversations only): for an env
    that gives its official prompt pieces (``info["official_prompt"]``: the MiniHack env with
    ``view="official"``) the messages of the official env manager (``traj_env_manager.py:358-406``):
    the env's official system prompt; a first user message of the env instruction, a newline and
    the turn template around the first observation (with the Search-and-Ask tool text appended
    to it, as the official tool wrapper does, ``tool_env_wrapper.py:23-28``); each later user
    message the turn template around the observation. No goal line, admissible-actions line or
    answer-format line (the env's instruction and observations carry them), and observations
    are never cut. Envs without official pieces keep "ours"."""
    experience_place: str = "user"
    """Where retrieved experience goes. "user": the experience block of the user message (above;
    under the official layout a user message of its own before the first one, in the memory
    header, official ``trajectory_memory_injection: user``, ``traj_env_manager.py:375-378``).
    "system" (``paper``, official ``trajectory_memory_injection: system``,
    ``memory_config.py:310``): appended to the system message after a newline, in the official
    memory header (``traj_env_manager.py:101-108, 370-371``; the env's own header when it gives
    one in ``info["official_prompt"]["memory"]``, else :data:`OFFICIAL_MEMORY_TEMPLATE`)."""
    ask_answer_role: str = "auto"
    """The role of the message that hands an ask's answer on in a "full" conversation. "tool"
    (official: after a tool call the next message is ``{"role": "tool", "content":
    observation}``, ``traj_env_manager.py:391-392``, the tool's observation ``Search results:
    ...``, ``search_and_ask_tool.py:102``); "user": the next user turn (built as any later
    turn). "auto" (default): "tool" with ``ask_style="official"`` (``paper``) in a "full"
    conversation, else "user" (the CPU presets). The actor's chat template must render a tool
    message, else the rollout engine refuses (:func:`~crl_bench.llm.rollout.tool_turn_template`)."""

    def __post_init__(self) -> None:
        if self.example_pick not in EXAMPLE_PICKS:
            raise ValueError(f"example_pick must be one of {', '.join(EXAMPLE_PICKS)}, got "
                             f"{self.example_pick!r}.")
        if self.conversation not in CONVERSATIONS:
            raise ValueError(f"conversation must be 'window' or 'full', got {self.conversation!r}.")
        if self.history < -1:
            raise ValueError(f"history must be -1 (full), 0 or a positive count; got {self.history}.")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1 or None, got {self.max_turns}.")
        if self.max_episode_tokens < 1:
            raise ValueError(f"max_episode_tokens must be >= 1, got {self.max_episode_tokens}.")
        for name in ("max_observation_chars", "max_response_chars"):
            limit = getattr(self, name)
            if limit is not None and limit < 2:
                raise ValueError(f"{name} must be >= 2 or None, got {limit}.")
        if self.max_asks < 0:
            raise ValueError(f"max_asks must be >= 0, got {self.max_asks}.")
        for tag in (self.answer_tag, self.ask_tag):
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", tag):
                raise ValueError(f"tag {tag!r} must be a plain word such as 'answer' or 'ask'.")
        if self.answer_tag == self.ask_tag:
            raise ValueError("answer_tag and ask_tag must differ.")
        if self.ask_style not in ("short", "official"):
            raise ValueError(f"ask_style must be 'short' or 'official', got {self.ask_style!r}.")
        if self.ask_answer_role not in ("auto", "user", "tool"):
            raise ValueError(f"ask_answer_role must be 'auto', 'user' or 'tool', got "
                             f"{self.ask_answer_role!r}.")
        if self.ask_answer_role == "tool" and self.conversation != "full":
            raise ValueError("ask_answer_role='tool' needs conversation='full' (a window prompt "
                             "is one user message); use ask_answer_role='user' or 'auto'.")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be 'ours' or 'official', got {self.layout!r}.")
        if self.layout == "official" and self.conversation != "full":
            raise ValueError("layout='official' is the official multi-turn chat: it needs "
                             "conversation='full' (--set rollout.conversation=full).")
        if self.experience_place not in EXPERIENCE_PLACES:
            raise ValueError(f"experience_place must be 'user' or 'system', got "
                             f"{self.experience_place!r}.")
        if "text" not in self.system_prompts:
            raise ValueError("system_prompts needs a 'text' entry: the fallback for families "
                             "without their own prompt.")

    @classmethod
    def for_small_model(cls, **overrides) -> "PromptConfig":
        """Settings under which the embedded SmolLM2-135M emits valid answers: no thinking, an
        example answer, and the assistant turn pre-filled with ``<answer>``."""
        values = {"think": False, "answer_example": True, "response_prefix": "<answer>"}
        values.update(overrides)
        return cls(**values)

    def system_prompt(self, family: str) -> str:
        if family in self.system_prompts:
            return self.system_prompts[family]
        from crl_bench.registry import family_system_prompt

        return family_system_prompt(family) or self.system_prompts["text"]

    def stop_strings(self) -> tuple[str, ...]:
        if not self.stop_at_tags:
            return ()
        ask = (f"</{self.ask_tag}>",)
        return ((f"</{self.answer_tag}>",) + ask) if self.stop_at_answer else ask


@dataclass
class HistoryItem:
    """One past turn as shown in the prompt."""

    observation: str
    response: str  # the action taken, "(invalid format)" or "(asked: ...)"


@dataclass
class ParsedCompletion:
    """What a completion asks the engine to do."""

    kind: str                 # "action" | "ask" | "invalid"
    action: str | None = None
    query: str | None = None
    error: str = ""


def _cut(text: str, limit: int | None) -> str:
    if limit is None or len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


ASK_INSTRUCTION = """You can consult a knowledge base that gives critical information when you \
are uncertain or stuck. Its answer is only as good as your question: write a detailed, \
self-contained query that shows your whole situation.

When to use it: you are unsure about the rules, mechanics or goal of the environment; several \
approaches keep failing; you need to check your understanding of an object, an entity or your \
own state; you suspect a hidden mechanic or a required sequence of actions.

How to write the query, around four questions:
1. What is my current state? What is around me, which objects or entities are present, in what \
state and where; my own status; the apparent immediate goal.
2. What exactly blocks me? What stops my progress, what confuses me.
3. What have I tried, and with what result? (so that the advice does not repeat it)
4. What exactly do I need to know? One clear, direct question.

Limits: you can use it at most {n} times in this episode; after that you must rely on your own \
reasoning. Use it strategically, for the most important blocking points first.

Wrap the whole query in <{q}>...</{q}>."""
"""The Search-and-Ask tool instruction (``experience.ask_style=official``): what the official
``search_and_ask_tool.py:29-60`` ``tool_instruction`` says, in our words."""


def build_messages(config: PromptConfig, *, family: str, goal: str, observation: str,
                   history: list[HistoryItem], admissible_actions: list[str] | None,
                   experience_text: str = "", asks_left: int = 0, turn_index: int = 0,
                   example_seed: int = 0, official: dict | None = None) -> list[dict[str, str]]:
    """The chat messages of one turn (system + user). ``example_seed`` (one per episode, given by
    the engine) seeds the example answer's pick when ``config.example_pick == "random"``.
    ``official``: the env's ``info["official_prompt"]`` (``PromptConfig.layout``)."""
    system = system_message(config, family, experience_text, official)
    if uses_official_layout(config, official):
        assert official is not None
        tool = official_tool_text(config.ask_tag, config.max_asks) if asks_left > 0 else ""
        messages = [{"role": "system", "content": system}]
        if config.experience_place == "user" and experience_text.strip():  # :375-378
            template = official.get("memory") or OFFICIAL_MEMORY_TEMPLATE
            messages.append({"role": "user",
                             "content": template.format(memory_message=experience_text)})
        messages.append({"role": "user",
                         "content": official_first_message(official, observation + tool)})
        return messages
    if config.experience_place == "system":
        experience_text = ""  # it is in the system message
    parts: list[str] = []
    if goal:
        parts.append(f"Your task: {goal.strip()}")
    experience = ("Experience from earlier episodes (use it where it applies):\n"
                  + experience_text.strip()) if experience_text.strip() else ""
    if experience and not config.experience_last:
        parts.append(experience)
    shown = history if config.history == -1 else (history[-config.history:] if config.history
                                                  else [])
    if shown:
        first = turn_index - len(shown) + 1
        lines = ["Your previous turns (oldest first):"]
        for k, item in enumerate(shown):
            lines.append(f"[Turn {first + k}] Observation:\n"
                         f"{_cut(item.observation, config.max_observation_chars)}")
            lines.append(f"[Turn {first + k}] You: {_cut(item.response, config.max_response_chars)}")
        parts.append("\n".join(lines))
    current = (f"Current observation (turn {turn_index + 1}):\n"
               f"{_cut(observation, config.max_observation_chars)}")
    if not config.observation_last:
        parts.append(current)
    if config.show_admissible and admissible_actions:
        parts.append("Admissible actions: " + ", ".join(admissible_actions))
    if asks_left > 0 and config.ask_style == "official":
        parts.append(ASK_INSTRUCTION.format(q=config.ask_tag, n=config.max_asks))
    if experience and config.experience_last:
        parts.append(experience)
    parts.append(_format_line(config, admissible_actions, asks_left,
                              example_action(config, admissible_actions, example_seed, turn_index)))
    if config.observation_last:
        parts.append(current)
    return [{"role": "system", "content": system},
            {"role": "user", "content": "\n\n".join(parts)}]


def example_action(config: PromptConfig, admissible_actions: list[str] | None, seed: int,
                   turn_index: int) -> str | None:
    """The action the format line shows as its example (None: no example). Deterministic: the
    same config, actions, seed and turn give the same pick."""
    if not (config.answer_example and admissible_actions) or config.example_pick in ("none",
                                                                                     "placeholder"):
        return None
    if config.example_pick == "first":
        return admissible_actions[0]
    return admissible_actions[random.Random(f"{seed}:{turn_index}").randrange(len(admissible_actions))]


def _format_line(config: PromptConfig, admissible_actions: list[str] | None, asks_left: int,
                 example: str | None) -> str:
    a = config.answer_tag
    if config.think:
        fmt = (f"Think step by step inside <think>...</think>, then give exactly one action "
               f"inside <{a}>...</{a}>.")
    else:
        fmt = f"Reply with exactly one action inside <{a}>...</{a}>."
    if example is not None:
        fmt = fmt[:-1] + f", e.g. <{a}>{example}</{a}>."
    elif config.answer_example and admissible_actions and config.example_pick == "placeholder":
        p = PLACEHOLDER_EXAMPLE
        fmt = fmt[:-1] + (f", e.g. <{a}>{p}</{a}> where {p} is one of the admissible actions.")
    if asks_left > 0:
        q = config.ask_tag
        fmt += (f" If you need advice instead, write <{q}>your question</{q}> ({asks_left} "
                f"left); the advice comes back as your next observation.")
    return fmt


def build_followup_message(config: PromptConfig, *, observation: str,
                           admissible_actions: list[str] | None, asks_left: int = 0,
                           turn_index: int = 1, example_seed: int = 0,
                           official: dict | None = None) -> str:
    """The user message that follows an assistant turn in a "full" conversation: the new
    observation (env feedback, advice or invalid-format feedback), the admissible actions and the
    answer format (Search-and-Ask only while ``asks_left > 0``); under the official layout the
    env's turn template around the observation (``traj_env_manager.py:394-406``)."""
    if uses_official_layout(config, official):
        assert official is not None
        return official["turn"].format(observation=observation)
    current = (f"Observation (turn {turn_index + 1}):\n"
               f"{_cut(observation, config.max_observation_chars)}")
    parts = [] if config.observation_last else [current]
    if config.show_admissible and admissible_actions:
        parts.append("Admissible actions: " + ", ".join(admissible_actions))
    parts.append(_format_line(config, admissible_actions, asks_left,
                              example_action(config, admissible_actions, example_seed, turn_index)))
    if config.observation_last:
        parts.append(current)
    return "\n\n".join(parts)


_AMARK = "\u2063ASSISTANT-MARK\u2063"
_UMARK = "\u2063USER-MARK\u2063"


def conversation_template(tokenizer) -> tuple[str, str, str]:
    """``(close, user_head, user_tail)``: the chat template's text after an assistant message's
    content (e.g. ``"<|im_end|>\\n"``), and around a following user message's content up to and
    including the next assistant header, so that a "full" conversation is extended as
    ``... completion + close + user_head + content + user_tail`` without re-rendering (and
    re-tokenising) the earlier turns. Read from the tokenizer's own template with markers."""
    def render(messages, gen):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)

    base = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    with_answer = render(base + [{"role": "assistant", "content": _AMARK}], False)
    close = with_answer[with_answer.rindex(_AMARK) + len(_AMARK):]
    follow = render(base + [{"role": "assistant", "content": _AMARK},
                            {"role": "user", "content": _UMARK}], True)
    rest = follow[follow.rindex(_AMARK) + len(_AMARK):]
    if not rest.startswith(close) or _UMARK not in rest:
        raise ValueError("this chat template does not render a follow-up user message as "
                         "'assistant close + user message': use rollout.conversation=window")
    head, tail = rest[len(close):].split(_UMARK, 1)
    return close, head, tail


_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def parse_completion(text: str, config: PromptConfig, asks_left: int = 0) -> ParsedCompletion:
    """Read the action (or the ask) out of a completion.

    Rules, in order: complete ``<think>`` blocks are ignored; a non-empty
    ``<answer>...</answer>`` is the action (surrounding whitespace stripped); otherwise a
    non-empty ``<ask>...</ask>`` is a query if ``asks_left > 0``; anything else is invalid format.
    """
    body = _THINK.sub("", text)
    a, q = config.answer_tag, config.ask_tag
    if config.ask_wins and asks_left > 0:
        ask = re.search(rf"<{q}>(.*?)</{q}>", body, re.DOTALL)
        if ask is not None and ask.group(1).strip():
            return ParsedCompletion("ask", query=ask.group(1).strip())
    answer = re.search(rf"<{a}>(.*?)</{a}>", body, re.DOTALL)
    if answer is not None:
        action = answer.group(1).strip()
        if action:
            return ParsedCompletion("action", action=action)
        empty_answer = True
    else:
        empty_answer = False
    ask = re.search(rf"<{q}>(.*?)</{q}>", body, re.DOTALL)
    if ask is not None and ask.group(1).strip():
        if asks_left > 0:
            return ParsedCompletion("ask", query=ask.group(1).strip())
        return ParsedCompletion("invalid", error=f"no {q} left in this episode, give an action")
    if empty_answer:
        return ParsedCompletion("invalid", error=f"the {a} block is empty")
    if f"<{a}>" in body:
        return ParsedCompletion("invalid", error=f"the {a} block is not closed")
    return ParsedCompletion("invalid", error=f"no {a} block found")


def invalid_format_feedback(error: str, config: PromptConfig) -> str:
    return f"Invalid format ({error}); the environment did not change."


# -- the official layout (PromptConfig.layout / experience_place) -----------------------------
OFFICIAL_MEMORY_TEMPLATE = ("\nBelow is distilled knowledge from earlier experiences.\n"
                            "Use it to guide your actions without overfitting.\n"
                            "Some insights may be overly specific, so identify only what is most "
                            "relevant.\nKnowledge: \n{memory_message}\n")
"""The official memory header of the ALFWorld and SWE env managers
(``traj_env_manager_alfworld.py:105-112``, ``traj_env_manager_swe.py:130-137``), for envs that
give none of their own (the MiniHack manager's, ``traj_env_manager.py:101-108``, ends in 16
spaces more; the MiniHack env gives it)."""

OFFICIAL_TOOL_TEXT = ("\nAvailable tools and their instructions:\n***Tool 1***\nTool Type: base\n"
                      "Tool Instruction: {instruction}\n")
"""What the official tool wrapper appends to the first observation (``tool_env_wrapper.py:23-28``;
one tool, ``knowledge_search_and_ask``, whose ``tool_type`` is gem's ``BaseTool`` default
``"base"``)."""


def resolved_ask_answer_role(config: PromptConfig) -> str:
    """``config.ask_answer_role`` with "auto" resolved: "tool" for the official ask style in a
    "full" conversation, else "user"."""
    if config.ask_answer_role != "auto":
        return config.ask_answer_role
    return "tool" if config.ask_style == "official" and config.conversation == "full" else "user"


def uses_official_layout(config: PromptConfig, official: dict | None) -> bool:
    """Whether this episode's messages follow the official layout: ``config.layout`` is
    "official" and the env gave its official pieces."""
    return config.layout == "official" and bool(official)


def system_message(config: PromptConfig, family: str, experience_text: str,
                   official: dict | None = None) -> str:
    """The system message: the family's prompt (the env's official one under the official
    layout), and with ``experience_place="system"`` the experience in the official memory header
    after a newline (``traj_env_manager.py:369-371``; nothing when the experience is blank,
    ``mixin.py:461-472``)."""
    system = official["system"] if uses_official_layout(config, official) else \
        config.system_prompt(family)
    if config.experience_place == "system" and experience_text.strip():
        template = (official or {}).get("memory") or OFFICIAL_MEMORY_TEMPLATE
        system = system + "\n" + template.format(memory_message=experience_text)
    return system


def official_tool_text(ask_tag: str, max_asks: int) -> str:
    """The Search-and-Ask tool text the official tool wrapper appends to the first observation
    (:data:`OFFICIAL_TOOL_TEXT` around :data:`ASK_INSTRUCTION`)."""
    return OFFICIAL_TOOL_TEXT.format(instruction=ASK_INSTRUCTION.format(q=ask_tag, n=max_asks))


def official_first_message(official: dict, observation: str) -> str:
    """The first user message of the official layout: the env instruction, a newline, the turn
    template around the first observation (``traj_env_manager.py:388-406``)."""
    return f"{official['instruction']}\n" + official["turn"].format(observation=observation)


def official_task_prompt(official: dict, observation: str) -> str:
    """The gate's "initial task prompt" as the official actor-critic builds it
    (``mixin.py:576-592`` and ``build_initial_task_prompt``, ``:539-545``): ``Environment
    Instruction: `` + the system template (without memory), a newline, ``Observation: `` + the
    env instruction directly followed (no newline, unlike the actor's first message) by the turn
    template around ``observation`` (the first observation, tool text included)."""
    user = official["instruction"] + official["turn"].format(observation=observation)
    return f"Environment Instruction: {official['system']}\nObservation: {user}"
