"""The generation-backend contract and a factory for the concrete backends.

A backend serves one base model and a set of *roles* (``"actor"``, ``"extractor"``), each a
trainable LoRA adapter (or a full copy of the model), and offers:

* batched sampling with exact token bookkeeping (:meth:`Backend.generate`),
* log-probs of given completions without gradient (:meth:`Backend.logprobs`),
* a differentiable per-token log-prob forward for training (:meth:`Backend.forward_token_logprobs`),
* access to the trainable modules and parameters, and adapter save/load.

``adapter=None`` means the base model without any adapter.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

from crl_bench.llm.types import Generation, SamplingParams

BACKENDS: dict[str, str] = {
    "hf": "crl_bench.llm.hf_backend:HFBackend",
    "vllm": "crl_bench.llm.vllm_backend:VLLMBackend",
}

@runtime_checkable
class Backend(Protocol):
    tokenizer: Any
    roles: tuple[str, ...]

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]: ...

    def generate(self, prompts: Sequence[Sequence[int]] | Sequence[str], sampling: SamplingParams,
                 adapter: Any = "actor", *, max_new_tokens: Sequence[int] | None = None
                 ) -> list[Generation]: ...

    def logprobs(self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
                 adapter: str | None = "actor", *, temperature: float = 1.0) -> list[list[float]]: ...

    def trainable_model(self, adapter: str) -> Any: ...

    def trainable_parameters(self, adapter: str) -> list[Any]: ...

    def forward_token_logprobs(self, adapter: str | None, input_ids: Any, attention_mask: Any, *,
                               temperature: float = 1.0, return_entropy: bool = False,
                               score_mask: Any = None) -> Any: ...

    def after_update(self, adapter: str) -> None: ...

    def save_adapters(self, directory: Any) -> None: ...

    def load_adapters(self, directory: Any) -> None: ...


def backend_class(kind: str) -> Any:
    """The backend class registered as ``kind`` in :data:`BACKENDS` (``model.backend``)."""
    from crl_bench.registry import load_import_string

    if kind not in BACKENDS:
        raise KeyError(f"Unknown LLM backend {kind!r}. Available: {', '.join(sorted(BACKENDS))}.")
    return load_import_string(BACKENDS[kind])
