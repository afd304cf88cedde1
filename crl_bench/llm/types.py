"""Plain data types shared by the LLM backends, the rollout engine and the trainers (no heavy
imports)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

FINISH_REASONS = ("stop", "length", "eos")


@dataclass
class SamplingParams:
    """How to sample one completion per prompt.

    The recorded per-token log-probs (:attr:`Generation.logprobs`) are those of the *tempered*
    distribution ``log_softmax(logits / temperature)`` at the sampled token, before top-k / top-p
    truncation (as verl and vLLM record them), so that a training forward pass with the same
    temperature reproduces them exactly. With ``temperature == 0`` (greedy) they are taken at
    temperature 1.
    """

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy decoding."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability sums to >= top_p."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 disables."""
    max_new_tokens: int = 256
    """Cap on generated tokens per prompt (finish reason ``"length"`` when reached)."""
    stop: tuple[str, ...] = ()
    """Stop strings. Generation stops at the first token whose decoded text completes one; that
    token is kept, so the completion text ends with (or just past) the stop string."""
    seed: int | None = None
    """Seed of the sampling generator for this call; None draws from torch's global RNG."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}.")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}.")
        if isinstance(self.stop, str):
            raise ValueError("stop must be a tuple of strings, e.g. stop=('</answer>',), not a "
                             "single string.")
        self.stop = tuple(self.stop)
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty.")

    @property
    def logprob_temperature(self) -> float:
        """The temperature at which log-probs are recorded (and must be recomputed)."""
        return self.temperature if self.temperature > 0 else 1.0


@dataclass
class Generation:
    """One sampled completion.

    ``text == tokenizer.decode(completion_ids, skip_special_tokens=True)`` always: it is the exact
    text handed on (to the env, the parser, the logs). ``completion_ids`` include the eos token
    when one was sampled (finish reason ``"eos"``), so training teaches the model to stop.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    """Sampling log-prob of each completion token (nats, at SamplingParams.logprob_temperature)."""
    text: str
    finish_reason: str
    """"stop" (a stop string), "eos" (an end-of-sequence token) or "length" (max_new_tokens)."""


@dataclass(frozen=True)
class LoraSpec:
    """A LoRA adapter per role (PEFT).

    Defaults: rank 16, alpha 32 (scale 2), no dropout (so train and eval forwards agree and the
    recorded log-probs stay exact), on every attention and MLP projection of a Llama/Qwen block.
    PEFT initialises ``B = 0``, so every adapter starts equal to the base model.
    """

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                       "up_proj", "down_proj")

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"LoRA rank r must be >= 1, got {self.r}.")
        if not self.target_modules:
            raise ValueError("LoRA target_modules must name at least one module (e.g. 'q_proj').")

    def to_peft(self):  # -> peft.LoraConfig
        from peft import LoraConfig

        return LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout,
                          target_modules=list(self.target_modules), bias="none",
                          task_type="CAUSAL_LM")


@dataclass
class ModelInfo:
    """What a backend serves (for logs and run configs)."""

    model_name: str
    path: str
    dtype: str
    device: str
    roles: tuple[str, ...]
    adapters: dict[str, str | None] = field(default_factory=dict)


@dataclass
class TrainSample:
    """One sequence to learn from: a model call, or a whole multi-turn episode.

    ``prompt_ids + completion_ids`` is the token sequence fed to the model. The loss is taken on
    the completion tokens where ``completion_mask`` is 1 (default: all of them). A per-turn
    sample (one model call) has no mask; a trajectory-level sample (``actor.sample_unit:
    trajectory``) is the last turn's full sequence: ``prompt_ids`` the first turn's prompt,
    ``completion_ids`` everything after it, ``completion_mask`` 1 on every assistant turn's
    sampled tokens and 0 on the observation / chat-template tokens between them.

    Attributes:
        prompt_ids: the prompt token ids exactly as fed to the model.
        completion_ids: the tokens after the prompt.
        old_logprobs: sampling log-prob of each *trained* token, in order
            (len == number of 1s in ``completion_mask``, or len(completion_ids) without a mask).
        advantage: the scalar advantage of the episode / extractor sample this call belongs to.
        weight: multiplies the advantage (count-aware reweighting; 1.0 for the actor).
        completion_mask: optional 0/1 per completion token; None = every completion token.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]
    advantage: float
    weight: float = 1.0
    completion_mask: list[int] | None = None

    @property
    def n_tokens(self) -> int:
        """Trained (masked) tokens."""
        if self.completion_mask is None:
            return len(self.completion_ids)
        return int(sum(1 for m in self.completion_mask if m))

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    @classmethod
    def from_turns(cls, turns: Sequence[Any], advantage: float, weight: float = 1.0) -> "TrainSample":
        """One trajectory-level sample from an episode's turns (each with ``prompt_ids``,
        ``completion_ids``, ``logprobs``) played as one conversation: the last turn's full
        sequence, the loss on every turn's completion tokens, their sampling log-probs aligned.

        Raises:
            ValueError: a turn's prompt + completion is not a prefix of the last turn's sequence
                (the episode was not played with ``rollout.conversation: full``).
        """
        if not turns:
            raise ValueError("an episode without turns has nothing to train")
        last = turns[-1]
        seq = list(last.prompt_ids) + list(last.completion_ids)
        first = len(turns[0].prompt_ids)
        mask = [0] * len(seq)
        old: list[float] = []
        for k, t in enumerate(turns):
            p, c = len(t.prompt_ids), len(t.completion_ids)
            if len(t.logprobs) != c:
                raise ValueError(f"turn {k}: {len(t.logprobs)} log-probs for {c} tokens")
            if seq[:p] != list(t.prompt_ids) or seq[p:p + c] != list(t.completion_ids):
                raise ValueError(f"turn {k}'s prompt + completion is not a prefix of the episode's "
                                 "last sequence: trajectory-level samples need episodes played "
                                 "as one conversation (rollout.conversation: full)")
            if p < first:
                raise ValueError(f"turn {k}'s prompt is shorter than the first turn's")
            mask[p:p + c] = [1] * c
            old.extend(float(x) for x in t.logprobs)
        return cls(seq[:first], seq[first:], old, float(advantage), float(weight),
                   completion_mask=mask[first:])


class StaleWeights(RuntimeError):
    """A generation engine does not hold the weights the caller expects (it was restarted, or
    an in-place weight push did not reach it)."""
