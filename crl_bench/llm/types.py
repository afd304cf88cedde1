"""Plain data types shared by the LLM backends and the rollout engine (no heavy imports)."""

from __future__ import annotations

from dataclasses import dataclass, field

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
