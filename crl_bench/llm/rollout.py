"""The batched multi-turn rollout engine and the trajectory record.

:class:`RolloutEngine` runs N text envs (of any mix of families) concurrently. Each turn it
builds one prompt per episode still running and makes ONE batched ``backend.generate`` call for
all of them, then parses each completion and either steps that env, answers a Search-and-Ask
query through the ask callback, or returns invalid-format feedback (see
:mod:`crl_bench.llm.prompting`).

Token bookkeeping is exact: each :class:`Turn` keeps the prompt ids that were fed to the model,
the sampled completion ids and their sampling log-probs, and
``completion_text == tokenizer.decode(completion_ids, skip_special_tokens=True)`` is the very
text that was parsed for the action the env received. Nothing is re-tokenised.

An env that raises (in ``reset`` or ``step``: a bug, or a model output it cannot take, such as a
path over 255 characters) ends *that* episode, never the run: the trajectory records
``error`` (the exception's type, errno name and message), score 0, no success, end reason
``env_error``; the other episodes go on. ``MemoryError`` and non-``Exception`` errors
(KeyboardInterrupt) still propagate.
"""

from __future__ import annotations

import errno
import re
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Callable

from crl_bench.llm.prompting import (HistoryItem, ParsedCompletion, PromptConfig,
                                     build_followup_message, build_messages,
                                     conversation_template, invalid_format_feedback,
                                     parse_completion, resolved_ask_answer_role)
from crl_bench.llm.types import SamplingParams

__all__ = ["Turn", "Trajectory", "EpisodeSpec", "PromptConfig", "RolloutEngine"]

TOOL_LIMIT_LINE = "Reached the maximum number of tool use. Please do not use any tools anymore."
"""What the official tool wrapper appends to the observation of the last allowed tool use
(``tool_env_wrapper.py:54-57``)."""

_AMARK = "\u2063ASSISTANT-MARK\u2063"
_TMARK = "\u2063TOOL-MARK\u2063"


def graded_meta(info: dict[str, Any]) -> dict[str, Any]:
    """What an episode's grading adds to its trajectory's meta: ``{"tampered": bool}`` when the
    env graded it (the SWE env's ``info["grading"]``, whose ``tampered`` says the grader caught
    the submission hooking the tests); nothing for episodes that were not graded (other
    families), so their records keep their keys."""
    grading = info.get("grading")
    if not isinstance(grading, dict):
        return {}
    return {"tampered": bool(grading.get("tampered", False))}


class ToolRoleError(ValueError):
    """The actor's chat template renders no tool-role message."""


def tool_turn_template(tokenizer: Any) -> tuple[str, str]:
    """``(head, tail)``: the chat template's text around a tool-role message's content that
    follows an assistant message (after the assistant close, up to and including the next
    assistant header), so that a "full" conversation hands an ask's answer on as the official
    tool message (``traj_env_manager.py:391-392``). Qwen2.5's template renders it (as a user
    turn around ``<tool_response>``), SmolLM2's (and tiny-sft's) as ``<|im_start|>tool``.

    The rule for a template without a tool role: rendering the tool message raises, or drops
    its content, or does not render it right after the assistant's close -> :class:`ToolRoleError`
    naming the fix; the rollout engine refuses at construction (never a silent fallback to a
    user turn, which would change what the actor sees)."""
    close = conversation_template(tokenizer)[0]
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                {"role": "assistant", "content": _AMARK}, {"role": "tool", "content": _TMARK}]
    fix = ("the official Search-and-Ask hands its answer on as a tool-role message "
           "(traj_env_manager.py:391-392): use an actor whose chat template has a tool role "
           "(Qwen2.5's has), or --set experience.ask_answer_role=user / "
           "experience.ask_style=short to hand it on in the next user turn")
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except Exception as exc:
        raise ToolRoleError(f"this chat template cannot render a tool message ({exc}); "
                            f"{fix}") from exc
    rest = text[text.rindex(_AMARK) + len(_AMARK):] if _AMARK in text else ""
    if _TMARK not in rest or not rest.startswith(close):
        raise ToolRoleError(f"this chat template renders no tool message after an assistant "
                            f"turn (its content is dropped or misplaced); {fix}")
    head, tail = rest[len(close):].split(_TMARK, 1)
    return head, tail


@dataclass
class Turn:
    """One model call of an episode and what came of it."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    """Sampling log-prob per completion token (at SamplingParams.logprob_temperature)."""
    completion_text: str
    action: str | None
    """The action sent to the env; None for an invalid-format turn or an ask."""
    observation: str
    """What came back: the env's observation, the ask answer, or invalid-format feedback."""
    reward: float
    """Env reward of this step, minus PromptConfig.format_penalty on an invalid-format turn."""
    format_valid: bool
    tool_query: str | None
    finish_reason: str = ""
    kind: str = "action"
    """"action", "ask" or "invalid"."""

    @property
    def loss_mask(self) -> list[int]:
        """1 per completion token: every sampled token is the policy's (prompts are not)."""
        return [1] * len(self.completion_ids)


@dataclass
class Trajectory:
    """One episode, as the trainer and the logs see it."""

    env_id: str
    task_name: str
    task_id: str
    seed: int
    goal: str
    group_id: int
    with_experience: bool
    experience_ids: list[int]
    experience_text: str
    turns: list[Turn]
    reward: float
    """Sum of turn rewards (env rewards plus format penalties)."""
    score: float
    success: bool
    n_actions: int
    """Env steps taken (invalid-format turns and asks are not actions)."""
    n_invalid_format: int
    n_tool_calls: int
    truncated: bool
    """The env truncated the episode, or the engine's turn / token / prompt caps did."""
    tokens: int
    """Generated tokens over all turns."""
    wall_s: float
    meta: dict = field(default_factory=dict)
    error: str | None = None
    """Why the env failed this episode (``"OSError ENAMETOOLONG: [Errno 36] File name too long:
    ..."``); None when it did not. Such an episode ends there with score 0 and no success."""
    first_observation: str = ""
    """The env's observation after ``reset``, before the first turn (each turn's ``observation``
    is what came back after it); "" in records written before this field."""

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Trajectory":
        data = dict(d)
        turn_names = {f.name for f in fields(Turn)}
        data["turns"] = [Turn(**{k: v for k, v in t.items() if k in turn_names})
                         for t in data.get("turns", [])]
        names = {f.name for f in fields(cls)}
        optional = {"meta", "error", "first_observation"}  # older records lack these
        missing = names - set(data) - optional
        if missing:
            raise ValueError(f"Trajectory JSON lacks fields {sorted(missing)}.")
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class EpisodeSpec:
    """One episode to run: an env that is already made, how to reset it, and its experience."""

    env: Any
    """A gymnasium text env (``gymnasium.make("crl/...")``); the engine resets it."""
    seed: int
    options: dict | None = None
    group_id: int = 0
    task_name: str = ""
    with_experience: bool = False
    experience_ids: list[int] = field(default_factory=list)
    experience_text: str = ""
    meta: dict = field(default_factory=dict)


AskCallback = Callable[[str, EpisodeSpec, dict], str]


@dataclass
class _Running:
    """Mutable state of one episode inside the engine."""

    spec: EpisodeSpec
    family: str
    env_id: str
    goal: str
    task_id: str
    observation: str            # what the next prompt shows as the current observation
    env_observation: str        # the env's latest observation
    admissible: list[str] | None
    info: dict
    max_turns: int
    history: list[HistoryItem] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    asks_used: int = 0
    tokens: int = 0
    prompt_tokens: int = 0
    n_actions: int = 0
    truncated: bool = False
    done: bool = False
    end_reason: str = ""
    start: float = field(default_factory=time.perf_counter)
    wall_s: float = 0.0
    error: str | None = None
    conversation_ids: list[int] | None = None  # "full" conversations: the next prompt's ids
    example_seed: int = 0       # seeds a "random" example answer (PromptConfig.example_pick)
    first_observation: str = ""  # the observation env.reset returned


MAX_ERROR_CHARS = 500


def describe_env_error(exc: BaseException) -> str:
    """``"OSError ENAMETOOLONG: [Errno 36] File name too long: '...'"``, at most
    :data:`MAX_ERROR_CHARS` characters (a model-made path can be huge)."""
    code = getattr(exc, "errno", None)
    name = type(exc).__name__
    if isinstance(code, int) and code in errno.errorcode:
        name += f" {errno.errorcode[code]}"
    text = f"{name}: {exc}"
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 3] + "..."


class RolloutEngine:
    """Run episodes concurrently with one batched model call per turn.

    Args:
        backend: an LLM backend (``HFBackend`` / ``VLLMBackend``).
        sampling: sampling parameters; the engine adds the answer/ask closing tags as stop
            strings (PromptConfig.stop_at_tags) and, when ``sampling.seed`` is set, derives a
            distinct seed for each turn from it, so that a run is reproducible.
        prompt: prompt and episode-limit configuration.
        adapter: the role that acts ("actor").
        ask_callback: ``f(query, spec, context) -> advice`` for ``<ask>`` queries; ``context``
            has goal, observation, history, turn, task_name. Without it asking is not offered.
        progress: show a progress bar of finished episodes.
        ask_requires_experience: offer Search-and-Ask (the tool text and ``<ask>``) only in
            episodes with ``spec.with_experience`` (the without-experience half must stay
            without it, so the tool is not shown there at all).

    With ``prompt.conversation == "full"`` each episode is one growing chat: a turn's prompt ids
    are the previous turn's prompt + completion + the chat template's close of the assistant
    message + the next user message (the observation), token for token.
    """

    def __init__(self, backend: Any, sampling: SamplingParams, prompt: PromptConfig | None = None,
                 adapter: str | None = "actor", ask_callback: AskCallback | None = None,
                 progress: bool = False, *,
                 on_progress: Callable[[dict], None] | None = None,
                 ask_requires_experience: bool = False, ask_on_last_turn: bool = True,
                 action_patterns: dict[str, str] | None = None) -> None:
        self.backend = backend
        self.prompt = prompt or PromptConfig()
        stops = tuple(dict.fromkeys(tuple(sampling.stop) + self.prompt.stop_strings()))
        self.sampling = replace(sampling, stop=stops)
        self.adapter = adapter
        self.ask_callback = ask_callback
        self.progress = progress
        self.ask_requires_experience = ask_requires_experience
        self.ask_on_last_turn = ask_on_last_turn
        self.action_patterns = dict(action_patterns or {})
        """Per env family, a regular expression an action reply must also match (searched in
        the whole reply), else the turn is invalid format (``rollout.action_patterns``)."""
        """False: no ask is offered (nor parsed) on an episode's last turn, where the answer
        could not be acted on: the ask would end the episode without an action."""
        self.reuse_kv = True
        """Keep each episode's KV across turns of a "full" conversation (HF backend)."""
        self._template: tuple[list[int], str, str] | None = None
        self._tool_role = (self.prompt.conversation == "full" and self._can_ask
                           and resolved_ask_answer_role(self.prompt) == "tool")
        """An ask's answer comes back as a tool-role message (``PromptConfig.ask_answer_role``)."""
        self._tool_template: tuple[str, str] | None = None
        if self._tool_role and hasattr(backend, "tokenizer"):  # refuse now, not mid-run
            self._tool_template = tool_turn_template(backend.tokenizer)
        self.on_progress = on_progress  # f({episodes_done, episodes, turns, turns_max, tokens}) per turn
        self.last_stats: dict[str, float] = {}
        self._prefix_ids: list[int] = []
        if self.prompt.response_prefix:
            self._prefix_ids = list(backend.tokenizer(self.prompt.response_prefix,
                                                      add_special_tokens=False)["input_ids"])

    @property
    def _can_ask(self) -> bool:
        return self.ask_callback is not None and self.prompt.max_asks > 0

    # -- episode set-up ----------------------------------------------------------------------------
    def _start(self, spec: EpisodeSpec) -> _Running:
        env = spec.env
        unwrapped = getattr(env, "unwrapped", env)
        env_id = env.spec.id if getattr(env, "spec", None) is not None else type(unwrapped).__name__
        try:
            observation, info = env.reset(seed=spec.seed, options=spec.options)
        except MemoryError:
            raise
        except Exception as exc:  # the episode fails, the run goes on
            ep = _Running(spec=spec, family=str(getattr(unwrapped, "family", "text")),
                          env_id=env_id, goal="", task_id="", observation="", env_observation="",
                          admissible=None, info={"score": 0.0, "success": False}, max_turns=0)
            ep.error = f"reset: {describe_env_error(exc)}"
            self._finish(ep, truncated=False, reason="env_error")
            return ep
        max_turns = self.prompt.max_turns or int(getattr(unwrapped, "max_steps", 30) or 30)
        return _Running(spec=spec, family=str(getattr(unwrapped, "family", "text")), env_id=env_id,
                        goal=str(info.get("goal", "")), task_id=str(info.get("task_id", "")),
                        observation=str(observation), env_observation=str(observation),
                        admissible=info.get("admissible_actions"), info=dict(info),
                        max_turns=max_turns, first_observation=str(observation))

    def _asks_left(self, ep: _Running) -> int:
        if self.ask_requires_experience and not ep.spec.with_experience:
            return 0
        if not self.ask_on_last_turn and len(ep.turns) + 1 >= ep.max_turns:
            return 0
        return max(0, self.prompt.max_asks - ep.asks_used) if self._can_ask else 0

    def _conversation_template(self) -> tuple[list[int], str, str]:
        if self._template is None:
            close, head, tail = conversation_template(self.backend.tokenizer)
            close_ids = list(self.backend.tokenizer(close, add_special_tokens=False)["input_ids"])
            self._template = (close_ids, head, tail)
        return self._template

    def _extend_conversation(self, ep: _Running) -> None:
        """The next prompt of a "full" conversation: the last prompt + its completion + the
        assistant close (the part the completion did not sample, e.g. after an eos) + the next
        user message + the assistant header (+ the response prefix)."""
        close_ids, head, tail = self._conversation_template()
        turn = ep.turns[-1]
        ids = list(turn.prompt_ids) + list(turn.completion_ids)
        if close_ids and turn.completion_ids and turn.completion_ids[-1] == close_ids[0]:
            ids += close_ids[1:]  # the completion ended with the template's end-of-turn token
        else:
            ids += close_ids
        if self._tool_role and turn.kind == "ask":
            # official: the tool's observation alone, as a tool-role message
            # (traj_env_manager.py:391-392), not a user turn
            if self._tool_template is None:
                self._tool_template = tool_turn_template(self.backend.tokenizer)
            head, tail = self._tool_template
            content = ep.observation
        else:
            content = build_followup_message(self.prompt, observation=ep.observation,
                                             admissible_actions=ep.admissible,
                                             asks_left=self._asks_left(ep),
                                             turn_index=len(ep.turns),
                                             example_seed=ep.example_seed,
                                             official=ep.info.get("official_prompt"))
        ids += self.backend.tokenizer(head + content + tail, add_special_tokens=False)["input_ids"]
        ep.conversation_ids = ids + self._prefix_ids

    def _prompt_ids(self, ep: _Running) -> list[int] | None:
        if self.prompt.conversation == "full" and ep.turns:
            ids = list(ep.conversation_ids or [])
            cap = self.prompt.max_prompt_tokens
            return ids if cap is None or len(ids) <= cap else None
        history = list(ep.history)
        while True:
            messages = build_messages(
                self.prompt, family=ep.family, goal=ep.goal, observation=ep.observation,
                history=history, admissible_actions=ep.admissible,
                experience_text=ep.spec.experience_text, asks_left=self._asks_left(ep),
                turn_index=len(ep.turns), example_seed=ep.example_seed,
                official=ep.info.get("official_prompt"))
            ids = self.backend.chat_prompt_ids(messages) + self._prefix_ids
            cap = self.prompt.max_prompt_tokens
            if cap is None or len(ids) <= cap:
                return ids
            shown = len(history) if self.prompt.history == -1 else min(len(history),
                                                                        self.prompt.history)
            if shown == 0:
                return None
            history = history[-(shown - 1):] if shown > 1 else []  # drop the oldest shown turn

    def _example_seed(self, index: int) -> int:
        """Episode ``index`` of a :meth:`run` call seeds its example-answer picks with this."""
        base = 0 if self.sampling.seed is None else int(self.sampling.seed)
        return base * 100_003 + index

    def first_prompt(self, spec: EpisodeSpec, index: int = 0) -> tuple[list[int] | None, str]:
        """The prompt ids the first turn of ``spec`` is sampled from when it is episode ``index``
        of a :meth:`run` call, and the observation that prompt shows (resets ``spec.env``; no
        generation). For diagnostics that need the engine's exact prompts."""
        ep = self._start(spec)
        ep.example_seed = self._example_seed(index)
        return self._prompt_ids(ep), ep.observation

    # -- the loop ----------------------------------------------------------------------------------
    def run(self, episodes: list[EpisodeSpec]) -> list[Trajectory]:
        """Play every episode to its end; return one trajectory per spec, in order."""
        if not episodes:
            return []
        ids = [id(e.env) for e in episodes]
        if len(set(ids)) != len(ids):
            raise ValueError("Each EpisodeSpec needs its own env instance: episodes run "
                             "concurrently. Make one env per episode (gymnasium.make).")
        t0 = time.perf_counter()
        timing = {"gen_s": 0.0, "env_s": 0.0, "ask_s": 0.0}
        # a "full" conversation's next prompt extends the last one: the HF backend keeps each
        # episode's KV between turns (prefills only the new tokens); dropped when the run ends
        keep_kv = (getattr(self.backend, "keep_kv_across_calls", None)
                   if self.prompt.conversation == "full" and self.reuse_kv else None)
        if keep_kv is not None:
            keep_kv(2 * len(episodes) + 8)
        try:
            return self._run(episodes, t0, timing)
        finally:
            if keep_kv is not None:
                keep_kv(0)

    def _run(self, episodes: list[EpisodeSpec], t0: float, timing: dict[str, float]) -> list[Trajectory]:
        running = [self._start(spec) for spec in episodes]
        # per episode, not per task: the K rollouts of a group see different example answers
        for i, ep in enumerate(running):
            ep.example_seed = self._example_seed(i)
        timing["env_s"] += time.perf_counter() - t0
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=len(running), initial=sum(ep.done for ep in running),
                       desc="episodes", leave=False)
        turn_no = 0
        generate_calls = 0
        while True:
            batch: list[tuple[_Running, list[int], int]] = []
            for ep in running:
                if ep.done:
                    continue
                budget = self.prompt.max_episode_tokens - ep.tokens
                prompt_ids = self._prompt_ids(ep)
                if prompt_ids is None:
                    self._finish(ep, truncated=True, reason="prompt_too_long")
                    if bar is not None:
                        bar.update(1)
                    continue
                if self.prompt.sequence_length is not None:  # official: prompt + generation
                    if len(prompt_ids) >= self.prompt.sequence_length:
                        self._finish(ep, truncated=True, reason="sequence_length")
                        if bar is not None:
                            bar.update(1)
                        continue
                    budget = min(budget, self.prompt.sequence_length - len(prompt_ids))
                batch.append((ep, prompt_ids, budget))
            if not batch:
                break
            sampling = self.sampling
            if sampling.seed is not None:
                sampling = replace(sampling, seed=(sampling.seed * 1_000_003 + turn_no) % 2**63)
            t = time.perf_counter()
            generations = self.backend.generate([p for _, p, _ in batch], sampling, self.adapter,
                                                max_new_tokens=[b for _, _, b in batch])
            timing["gen_s"] += time.perf_counter() - t
            generate_calls += 1
            asks: list[tuple[_Running, Turn, str]] = []
            t = time.perf_counter()
            for (ep, prompt_ids, _), gen in zip(batch, generations):
                ep.tokens += len(gen.completion_ids)
                ep.prompt_tokens += len(prompt_ids)
                parsed = parse_completion(self.prompt.response_prefix + gen.text, self.prompt,
                                          self._asks_left(ep))
                pattern = self.action_patterns.get(ep.family)
                if (parsed.kind == "action" and pattern is not None and re.search(
                        pattern, self.prompt.response_prefix + gen.text, re.DOTALL) is None):
                    parsed = ParsedCompletion("invalid", error="the reply does not have the "
                                              "required form (think, then answer)")
                turn = Turn(prompt_ids=list(prompt_ids), completion_ids=list(gen.completion_ids),
                            logprobs=list(gen.logprobs), completion_text=gen.text, action=None,
                            observation="", reward=0.0, format_valid=parsed.kind != "invalid",
                            tool_query=None, finish_reason=gen.finish_reason, kind=parsed.kind)
                shown_observation = ep.observation
                ep.turns.append(turn)
                if parsed.kind == "action":
                    turn.action = parsed.action
                    self._step_env(ep, turn)
                    ep.history.append(HistoryItem(shown_observation, parsed.action or ""))
                elif parsed.kind == "ask":
                    turn.tool_query = parsed.query
                    ep.asks_used += 1
                    ep.history.append(HistoryItem(shown_observation, f"(asked: {parsed.query})"))
                    asks.append((ep, turn, parsed.query or ""))
                else:
                    turn.reward = -self.prompt.format_penalty
                    turn.observation = invalid_format_feedback(parsed.error, self.prompt)
                    ep.observation = f"{turn.observation}\n\n{ep.env_observation}"
                    ep.history.append(HistoryItem(shown_observation, "(invalid format)"))
            timing["env_s"] += time.perf_counter() - t
            if asks:
                t = time.perf_counter()
                self._answer_asks(asks)
                timing["ask_s"] += time.perf_counter() - t
            for ep, _, _ in batch:
                if ep.done:
                    pass
                elif len(ep.turns) >= ep.max_turns:
                    self._finish(ep, truncated=True, reason="max_turns")
                elif ep.tokens >= self.prompt.max_episode_tokens:
                    self._finish(ep, truncated=True, reason="max_episode_tokens")
                if not ep.done and self.prompt.conversation == "full":
                    self._extend_conversation(ep)
                if ep.done and bar is not None:
                    bar.update(1)
            turn_no += 1
            if self.on_progress is not None:
                self.on_progress({"episodes_done": sum(ep.done for ep in running), "episodes": len(running),
                                  "turns": sum(ep.max_turns if ep.done else len(ep.turns) for ep in running),
                                  "turns_max": sum(ep.max_turns for ep in running),
                                  "tokens": sum(ep.tokens for ep in running)})
        if bar is not None:
            bar.close()
        wall = time.perf_counter() - t0
        tokens = sum(ep.tokens for ep in running)
        self.last_stats = {**timing, "wall_s": wall, "turns": float(turn_no),
                           "generate_calls": float(generate_calls), "tokens": float(tokens),
                           "tokens_per_s": tokens / wall if wall > 0 else 0.0}
        return [self._trajectory(ep) for ep in running]

    def _step_env(self, ep: _Running, turn: Turn) -> None:
        try:
            observation, reward, terminated, truncated, info = ep.spec.env.step(turn.action)
        except MemoryError:
            raise
        except Exception as exc:  # a bad action must not kill the run: the episode ends here
            ep.n_actions += 1
            ep.error = describe_env_error(exc)
            turn.reward = 0.0
            turn.observation = f"The environment failed on this action: {ep.error}"
            ep.info = {**ep.info, "score": 0.0, "success": False}
            self._finish(ep, truncated=False, reason="env_error")
            return
        ep.n_actions += 1
        turn.reward = float(reward)
        turn.observation = str(observation)
        ep.observation = ep.env_observation = str(observation)
        ep.info = dict(info)
        ep.admissible = info.get("admissible_actions")
        if terminated or truncated:
            self._finish(ep, truncated=bool(truncated) and not terminated,
                         reason="terminated" if terminated else "env_truncated")

    def _answer_asks(self, asks: list[tuple[_Running, Turn, str]]) -> None:
        requests = []
        for ep, turn, query in asks:
            context = {"goal": ep.goal, "observation": ep.env_observation,
                       "history": [asdict(h) for h in ep.history], "turn": len(ep.turns) - 1,
                       "task_name": ep.spec.task_name, "family": ep.family}
            requests.append((query, ep.spec, context))
        assert self.ask_callback is not None
        answers = [self.ask_callback(*r) for r in requests]
        for (ep, turn, query), answer in zip(asks, answers):
            turn.observation = str(answer)
            if self.prompt.ask_style == "official":
                # the tool's observation alone, with the wrapper's line after the last allowed
                # use (tool_env_wrapper.py:52-57); the env's observation is not repeated
                ep.observation = str(answer)
                if ep.asks_used >= self.prompt.max_asks:
                    ep.observation += f"\n\n{TOOL_LIMIT_LINE}"
                continue
            ep.observation = (f"Advice for your question \"{query}\":\n{answer}\n\n"
                              f"{ep.env_observation}")

    @staticmethod
    def _finish(ep: _Running, *, truncated: bool, reason: str) -> None:
        ep.done = True
        ep.truncated = truncated
        ep.end_reason = reason
        ep.wall_s = time.perf_counter() - ep.start

    def _trajectory(self, ep: _Running) -> Trajectory:
        spec = ep.spec
        return Trajectory(
            env_id=ep.env_id, task_name=spec.task_name or ep.env_id, task_id=ep.task_id,
            seed=int(spec.seed), goal=ep.goal, group_id=int(spec.group_id),
            with_experience=bool(spec.with_experience), experience_ids=list(spec.experience_ids),
            experience_text=spec.experience_text, turns=ep.turns,
            reward=float(sum(t.reward for t in ep.turns)),
            score=float(ep.info.get("score", 0.0)), success=bool(ep.info.get("success", False)),
            n_actions=ep.n_actions, n_invalid_format=sum(not t.format_valid for t in ep.turns),
            n_tool_calls=sum(t.kind == "ask" for t in ep.turns), truncated=ep.truncated,
            tokens=ep.tokens, wall_s=ep.wall_s,
            meta={**spec.meta, "family": ep.family, "end_reason": ep.end_reason,
                  "prompt_tokens": ep.prompt_tokens, "adapter": self.adapter,
                  **graded_meta(ep.info)},
            error=ep.error, first_observation=ep.first_observation)
