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

from crl_bench.distributed import remote_class, require_ray


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


class StaleWeights(RuntimeError):
    """A generation engine does not hold the weights the caller expects (it was restarted)."""


class GenerationEngineImpl:
    """One generation engine (plain class; :func:`generation_engine_class` makes the actor)."""

    def __init__(self, kind: str, spec: dict[str, Any], threads: int = 1) -> None:
        import torch

        torch.set_num_threads(threads)
        self.backend = make_backend(kind, spec)
        self.calls = 0
        self.tokens = 0
        self.versions: dict[str, int] = {}

    def pid(self) -> int:
        return os.getpid()

    def generate(self, prompts: list[list[int]], sampling: Any, adapter: str | None = None,
                 max_new_tokens: list[int] | int | None = None,
                 versions: dict[str, int] | None = None) -> list[Any]:
        """``versions``: the weight versions the caller expects; a (restarted) engine that does
        not have them refuses with :class:`StaleWeights` instead of sampling from old weights."""
        if versions is not None and versions != self.versions:
            raise StaleWeights(f"engine has weight versions {self.versions}, caller expects "
                               f"{versions}")
        self.calls += 1
        kwargs = {} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}
        out = self.backend.generate(prompts, sampling, adapter, **kwargs)
        self.tokens += sum(len(g.completion_ids) for g in out)
        return out

    def load_weights(self, role: str, weights: Sequence[Any], version: int | None = None) -> None:
        from crl_bench.distributed.learner import load_role_weights

        load_role_weights(self.backend, role, weights)
        if version is not None:
            self.versions[role] = version

    def weights(self, role: str) -> list[Any]:
        from crl_bench.distributed.learner import role_weights

        return role_weights(self.backend, role)

    def stats(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "calls": self.calls, "tokens": self.tokens}


def generation_engine_class() -> Any:
    return remote_class(GenerationEngineImpl)


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
        self._weights: dict[str, Any] = {}  # role -> object ref of the last weights pushed
        self._versions: dict[str, int] = {}
        self.engine_failures = 0

    @classmethod
    def start(cls, local: Any, kind: str, spec: dict[str, Any], n_engines: int = 1, *,
              options: dict[str, Any] | None = None, threads: int = 1) -> "RemoteGenerationBackend":
        actor = generation_engine_class()
        # max_restarts: Ray brings a dead engine back (with its initial weights: the last pushed
        # ones are loaded again before it is used)
        engines = [actor.options(**(options or {"num_cpus": 1}), max_restarts=2, max_task_retries=0)
                   .remote(kind, spec, threads) for _ in range(n_engines)]
        require_ray().get([e.pid.remote() for e in engines])
        return cls(local, engines)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._local, name)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: Any, adapter: str | None = None,
                 max_new_tokens: Sequence[int] | int | None = None) -> list[Any]:
        prompts = [list(p) for p in prompts]
        n = len(self.engines)
        # contiguous shards, one per engine; a per-prompt cap list is cut the same way
        size = max(1, -(-len(prompts) // n))
        shards = []
        for i in range(0, len(prompts), size):
            caps = (list(max_new_tokens[i:i + size])
                    if isinstance(max_new_tokens, (list, tuple)) else max_new_tokens)
            shards.append((prompts[i:i + size], caps))
        versions = dict(self._versions)
        refs = [self.engines[k].generate.remote(p, sampling, adapter, c, versions)
                for k, (p, c) in enumerate(shards)]
        out: list[Any] = []
        for k, ref in enumerate(refs):
            try:
                out.extend(self._ray.get(ref))
            except (self._ray.exceptions.RayActorError, self._ray.exceptions.ActorUnavailableError,
                    StaleWeights):
                # the engine died mid-call: generation is a function of (weights, prompts,
                # sampling seed), so the same call on a live engine gives the same tokens
                out.extend(self._retry(k, shards[k], sampling, adapter))
        return out

    def _retry(self, k: int, shard: tuple[list, Any], sampling: Any, adapter: str | None,
               timeout_s: float = 300.0) -> list[Any]:
        import time

        self.engine_failures += 1
        deadline = time.monotonic() + timeout_s
        order = [i for i in range(len(self.engines)) if i != k] + [k]
        while True:
            for i in order:
                engine = self.engines[i]
                try:
                    self._ray.get(engine.pid.remote(), timeout=5)
                    # a restarted engine has its initial weights: give it the current ones
                    self._ray.get([engine.load_weights.remote(role, ref, self._versions[role])
                                   for role, ref in self._weights.items()])
                    return self._ray.get(engine.generate.remote(shard[0], sampling, adapter,
                                                                shard[1], dict(self._versions)))
                except (self._ray.exceptions.RayActorError, self._ray.exceptions.ActorUnavailableError,
                        self._ray.exceptions.GetTimeoutError, StaleWeights):
                    continue
            if time.monotonic() > deadline:
                raise RuntimeError("every generation engine is dead and none came back")
            time.sleep(0.5)

    def push_weights(self, role: str, weights: Any) -> None:
        """Load ``weights`` (a list of tensors or an object ref of one) into every engine."""
        ref = weights if isinstance(weights, self._ray.ObjectRef) else self._ray.put(list(weights))
        self._weights[role] = ref
        self._versions[role] = self._versions.get(role, 0) + 1
        self._ray.get([e.load_weights.remote(role, ref, self._versions[role])
                       for e in self.engines])

    def close(self) -> None:
        for e in self.engines:
            self._ray.kill(e)
