"""The generation engine as a Ray actor, and the driver-side backend that calls it.

:class:`GenerationEngineImpl` builds a backend (``hf`` on CPU or GPU, ``vllm`` on GPUs: one
engine per GPU or tensor-parallel group, see the resource plan) from the same keyword arguments
as the driver's, so it starts with the same weights; after each update the learner's trainable
weights reach it as one object ref (:meth:`RemoteGenerationBackend.push_weights`: ``ray.put``
once, every engine reads the same object, no copy through the driver).

:class:`RemoteGenerationBackend` is what the rollout engine sees: ``generate`` goes to an engine
(several engines split a batch into contiguous shards, one per engine, called in parallel);
the tokenizer and chat template stay local (the driver's own backend), so prompt ids are built
exactly as in the single-process run.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from crl_bench.distributed import require_ray


def make_backend(kind: str, spec: dict[str, Any]) -> Any:
    """A backend of ``kind`` ("hf" / "vllm") from keyword arguments."""
    try:  # the redesign's registry of backends
        from crl_bench.llm.backend import backend_class

        cls = backend_class(kind)
    except ImportError:
        from crl_bench.llm.backend import make_backend as legacy

        spec = dict(spec)
        return legacy(kind, spec.pop("model_name"), **spec)
    spec = dict(spec)
    return cls(spec.pop("model_name"), **spec)


class GenerationEngineImpl:
    """One generation engine (plain class; :func:`generation_engine_class` makes the actor)."""

    def __init__(self, kind: str, spec: dict[str, Any], threads: int = 1) -> None:
        import torch

        torch.set_num_threads(threads)
        self.backend = make_backend(kind, spec)
        self.calls = 0
        self.tokens = 0

    def pid(self) -> int:
        return os.getpid()

    def generate(self, prompts: list[list[int]], sampling: Any, adapter: str | None = None,
                 max_new_tokens: list[int] | int | None = None) -> list[Any]:
        self.calls += 1
        kwargs = {} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}
        out = self.backend.generate(prompts, sampling, adapter, **kwargs)
        self.tokens += sum(len(g.completion_ids) for g in out)
        return out

    def load_weights(self, role: str, weights: Sequence[Any]) -> None:
        from crl_bench.distributed.learner import load_role_weights

        load_role_weights(self.backend, role, weights)

    def weights(self, role: str) -> list[Any]:
        from crl_bench.distributed.learner import role_weights

        return role_weights(self.backend, role)

    def stats(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "calls": self.calls, "tokens": self.tokens}


_ENGINE_CLS: Any = None


def generation_engine_class() -> Any:
    global _ENGINE_CLS
    if _ENGINE_CLS is None:
        ray = require_ray()
        _ENGINE_CLS = ray.remote(GenerationEngineImpl)
    return _ENGINE_CLS


class RemoteGenerationBackend:
    """A backend whose ``generate`` runs on generation engine actors; everything else (tokenizer,
    chat template, training access) is the local backend's.

    Args:
        local: the driver's backend (same model and tokenizer as the engines).
        engines: generation engine actor handles.
    """

    def __init__(self, local: Any, engines: list[Any]) -> None:
        self._ray = require_ray()
        self._local = local
        self.engines = list(engines)

    @classmethod
    def start(cls, local: Any, kind: str, spec: dict[str, Any], n_engines: int = 1, *,
              options: dict[str, Any] | None = None, threads: int = 1) -> "RemoteGenerationBackend":
        actor = generation_engine_class()
        engines = [actor.options(**(options or {"num_cpus": 1})).remote(kind, spec, threads)
                   for _ in range(n_engines)]
        require_ray().get([e.pid.remote() for e in engines])
        return cls(local, engines)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._local, name)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: Any, adapter: str | None = None,
                 max_new_tokens: Sequence[int] | int | None = None) -> list[Any]:
        prompts = [list(p) for p in prompts]
        n = len(self.engines)
        if n == 1 or len(prompts) < 2:
            return self._ray.get(self.engines[0].generate.remote(prompts, sampling, adapter,
                                                                 max_new_tokens))
        # contiguous shards, one per engine; a per-prompt cap list is cut the same way
        size = -(-len(prompts) // n)
        refs = []
        for i in range(0, len(prompts), size):
            caps = (list(max_new_tokens[i:i + size])
                    if isinstance(max_new_tokens, (list, tuple)) else max_new_tokens)
            refs.append(self.engines[len(refs)].generate.remote(prompts[i:i + size], sampling,
                                                                adapter, caps))
        return [g for part in self._ray.get(refs) for g in part]

    def push_weights(self, role: str, weights: Any) -> None:
        """Load ``weights`` (a list of tensors or an object ref of one) into every engine."""
        ref = weights if isinstance(weights, self._ray.ObjectRef) else self._ray.put(list(weights))
        self._ray.get([e.load_weights.remote(role, ref) for e in self.engines])

    def close(self) -> None:
        for e in self.engines:
            self._ray.kill(e)
