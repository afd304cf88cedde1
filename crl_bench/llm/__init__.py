"""The LLM layer: model resolution, generation backends, roles as LoRA adapters, rollouts.

Light names are imported lazily so that ``import crl_bench.llm`` stays cheap (no torch):

* :mod:`crl_bench.llm.models` — ``resolve_model``, ``load_tokenizer``, ``load_causal_lm``,
  ``KNOWN_MODELS`` (``smollm2-135m`` embedded default, ``tiny-random`` for tests);
* :mod:`crl_bench.llm.types` — ``SamplingParams``, ``Generation``, ``LoraSpec``;
* :mod:`crl_bench.llm.backend` — the ``Backend`` protocol and the ``BACKENDS`` registry;
* :mod:`crl_bench.llm.hf_backend` / :mod:`crl_bench.llm.vllm_backend` — the backends;
* :mod:`crl_bench.llm.rollout` — ``RolloutEngine``, ``EpisodeSpec``, ``Trajectory``, ``Turn``;
* :mod:`crl_bench.llm.prompting` — ``PromptConfig``, ``build_messages``, ``parse_completion``;
* :mod:`crl_bench.llm.batching` — ``collate_sequences`` (training tensors from recorded ids).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "KNOWN_MODELS": "models", "DEFAULT_MODEL": "models", "resolve_model": "models",
    "load_tokenizer": "models", "load_causal_lm": "models",
    "SamplingParams": "types", "Generation": "types", "LoraSpec": "types",
    "Backend": "backend", "BACKENDS": "backend", "backend_class": "backend",
    "HFBackend": "hf_backend", "VLLMBackend": "vllm_backend",
    "RolloutEngine": "rollout", "EpisodeSpec": "rollout", "Trajectory": "rollout", "Turn": "rollout",
    "PromptConfig": "prompting", "build_messages": "prompting", "parse_completion": "prompting",
    "collate_sequences": "batching", "TokenBatch": "batching",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"crl_bench.llm.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'crl_bench.llm' has no attribute {name!r}")
