"""The generation engine as a Ray actor, and the driver-side backend that calls it.

:class:`GenerationEngineImpl` builds a backend (``hf`` on CPU or GPU, ``vllm`` on GPUs: one
engine per GPU or tensor-parallel group, see the resource plan) from the same keyword arguments
as the driver's, so it starts with the same weights; after each update the learner's trainable
weights reach it as one object ref (:meth:`RemoteGenerationBackend.push_weights`: ``ray.put``
once, every engine reads the same object, no copy through the driver). With full fine-tuning on
``vllm`` engines the weights need not pass through the driver at all: the process holding them
(learner rank 0) sends them straight into every engine's vLLM workers, in place
(:meth:`RemoteGenerationBackend.weight_sync_client`, :class:`EngineWeightPusher`: vLLM's
weight-transfer API, NCCL between GPUs, gloo on CPUs; ``crl_bench.llm.vllm_weight_sync``).

Every generation names the weight versions it expects; an engine holding others (restarted,
or a push that did not finish) refuses with :class:`StaleWeights`, and a ``vllm`` engine checks
the version vLLM itself committed and stamped on each completion.

:class:`RemoteGenerationBackend` is what the rollout engine sees: ``generate`` goes to an engine
(several engines split a batch into contiguous shards, one per engine, called in parallel);
the tokenizer and chat template stay local (the driver's own backend), so prompt ids are built
exactly as in the single-process run.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from crl_bench.distributed import remote_class, require_ray
from crl_bench.llm.types import StaleWeights


class PromptBackend:
    """The driver's stand-in for a role's backend when the weights live on Ray actors (full
    fine-tuning: the generation engines and the sharded learner ranks hold them): the tokenizer
    and the chat template only, so that prompts are built exactly as in one process, and no
    model weights. Anything that would need the weights says so.

    Args:
        model_name, roles: as for :class:`~crl_bench.llm.hf_backend.HFBackend`.
    """

    kind = "prompt"
    lora = None
    shared_adapter = False
    holds_weights = False

    def __init__(self, model_name: str, roles: tuple[str, ...]) -> None:
        import threading

        from crl_bench.llm.models import load_tokenizer, resolve_model

        self.model_name = model_name
        self.path = resolve_model(model_name)
        self.roles = tuple(roles)
        self.tokenizer = load_tokenizer(model_name)
        self.lock = threading.RLock()
        eos = self.tokenizer.eos_token_id
        self.eos_token_ids = frozenset([int(eos)] if isinstance(eos, int) else [])

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:
        from crl_bench.llm.hf_backend import chat_prompt_ids

        return chat_prompt_ids(self.tokenizer, messages)

    def _no_weights(self, what: str) -> Any:
        raise RuntimeError(f"{what}: the driver holds no model weights in a Ray run with full "
                           "fine-tuning (the generation engines and the sharded learner ranks "
                           "do); ask them (RemoteGenerationBackend, ShardedRayLearner).")

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        return self._no_weights("generate")

    def trainable_parameters(self, adapter: str) -> Any:
        return self._no_weights("trainable_parameters")

    def trainable_model(self, adapter: str) -> Any:
        return self._no_weights("trainable_model")

    def forward_token_logprobs(self, *args: Any, **kwargs: Any) -> Any:
        return self._no_weights("forward_token_logprobs")

    def logprobs(self, *args: Any, **kwargs: Any) -> Any:
        return self._no_weights("logprobs")

    def after_update(self, adapter: str) -> None:
        self._no_weights("after_update")


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

    def __init__(self, kind: str, spec: dict[str, Any], threads: int = 1,
                 settings: dict[str, Any] | None = None) -> None:
        import torch

        torch.set_num_threads(threads)
        # settings: the role's engine settings (crl_bench.run.parts.models.engine_settings);
        # a vllm engine is built with them, an hf engine (CPU) keeps them as its description
        self.kind, self.spec, self.settings = kind, dict(spec), dict(settings or {})
        self.backend = make_backend(kind, dict(spec, **self.settings) if kind == "vllm" else spec)
        self.calls = 0
        self.tokens = 0
        self.versions: dict[str, int] = {}

    def pid(self) -> int:
        return os.getpid()

    def describe(self) -> dict[str, Any]:
        """What this engine is: its process, the GPUs Ray gave it, the model and roles it
        serves and the engine settings it was built with (a vllm engine's as vLLM got them)."""
        import ray

        settings = dict(getattr(self.backend, "engine_settings", None) or self.settings)
        return {"pid": os.getpid(), "kind": self.kind, "model": self.spec.get("model_name"),
                "roles": tuple(self.spec.get("roles", ())), "settings": settings,
                "gpus": [str(g) for g in ray.get_gpu_ids()],
                "resources": dict(ray.get_runtime_context().get_assigned_resources())}

    def generate(self, prompts: list[list[int]], sampling: Any, adapter: str | None = None,
                 max_new_tokens: list[int] | int | None = None,
                 versions: dict[str, int] | None = None) -> list[Any]:
        """``versions``: the weight versions the caller expects; a (restarted) engine that does
        not have them refuses with :class:`StaleWeights` instead of sampling from old weights."""
        kwargs: dict[str, Any] = {}
        if hasattr(self.backend, "weight_versions"):
            # a vllm engine checks what vLLM committed (and stamps every completion)
            if versions is not None:
                kwargs["weight_versions"] = versions
        elif versions is not None and versions != self.versions:
            raise StaleWeights(f"engine has weight versions {self.versions}, caller expects "
                               f"{versions}")
        self.calls += 1
        if max_new_tokens is not None:
            kwargs["max_new_tokens"] = max_new_tokens
        out = self.backend.generate(prompts, sampling, adapter, **kwargs)
        self.tokens += sum(len(g.completion_ids) for g in out)
        return out

    def load_weights(self, role: str, weights: Sequence[Any], version: int | None = None) -> None:
        from crl_bench.training.precision import load_role_weights

        load_role_weights(self.backend, role, weights)
        if hasattr(self.backend, "weight_versions"):  # vllm: the HF copy's weights into vLLM
            self.backend.after_update(role, version=version)
        if version is not None:
            self.versions[role] = version

    # the vLLM weight-sync control plane of this engine (vllm backend, full fine-tuning): what
    # EnginesWeightSyncClient calls while a sender broadcasts into the engine's workers
    def _sync(self) -> Any:
        sync = getattr(self.backend, "weight_sync", None)
        if sync is None:
            raise RuntimeError("in-place weight pushes need a vllm engine with full fine-tuning "
                               "(model.backend=vllm, model.lora_r=0).")
        return sync

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        sync = self._sync()
        self.backend.detach_sender()  # the learner sends from now on, not the engine's HF copy
        sync.init_weight_transfer_engine(init_info)

    def start_weight_update(self) -> None:
        self._sync().start_weight_update()

    def update_weights(self, update_info: Any) -> None:
        self._sync().update_weights(update_info)

    def finish_weight_update(self, role: str, version: int) -> None:
        self._sync().finish_weight_update(str(version))
        self.versions[role] = int(version)

    def weights(self, role: str) -> list[Any]:
        from crl_bench.training.precision import role_weights

        return role_weights(self.backend, role)

    def stats(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "calls": self.calls, "tokens": self.tokens}


def generation_engine_class() -> Any:
    return remote_class(GenerationEngineImpl)


class EnginesWeightSyncClient:
    """vLLM's ``VLLMWeightSyncClient`` over generation engine actors: each call goes to every
    engine at once. Picklable (actor handles), so the driver hands it to the process that holds
    the trained weights. Engine k's workers join the transfer group at rank ``1 + k``."""

    def __init__(self, engines: list[Any], role: str) -> None:
        self.engines = list(engines)
        self.role = role
        self.pending_version: int | None = None

    def _all(self, refs: list[Any]) -> None:
        require_ray().get(refs)

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        base = int(init_info.get("rank_offset", 1))
        self._all([e.init_weight_transfer_engine.remote(
            dict(init_info, rank_offset=base + k) if "rank_offset" in init_info else init_info)
            for k, e in enumerate(self.engines)])

    def start_weight_update(self) -> None:
        self._all([e.start_weight_update.remote() for e in self.engines])

    def update_weights(self, update_info: Any) -> None:
        self._all([e.update_weights.remote(update_info) for e in self.engines])

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        version = weight_version if weight_version is not None else self.pending_version
        if version is None:
            raise ValueError("finish_weight_update needs a weight version (or pending_version).")
        self._all([e.finish_weight_update.remote(self.role, int(version)) for e in self.engines])


class EngineWeightPusher:
    """Runs where the trained weights are (learner rank 0; every FSDP rank, whose gathers are
    collectives): joins the engines' workers once, then :meth:`push` sends ``module``'s weights
    into every engine in place, in ``wire_dtype`` (the engines' dtype, e.g. bf16 from fp32
    masters). Transport: NCCL when ``device`` is a GPU, gloo otherwise."""

    def __init__(self, module: Any, client: EnginesWeightSyncClient, *, device: str = "cpu",
                 rank: int = 0, wire_dtype: Any = None) -> None:
        from crl_bench.llm.vllm_weight_sync import (ModelWeights, start_sender, trainer_init_info,
                                                    transport_for)

        self.client = client
        info = trainer_init_info(transport_for(device, colocated=False),
                                 world_size=1 + len(client.engines), rank=rank)
        self.sender = start_sender(info, client, ModelWeights(module, wire_dtype))

    def push(self, version: int) -> None:
        self.client.pending_version = int(version)
        self.sender.send_weights()

    def close(self) -> None:
        self.sender.shutdown()


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
              options: dict[str, Any] | None = None, threads: int = 1,
              settings: dict[str, Any] | None = None) -> "RemoteGenerationBackend":
        """``n_engines`` engine actors of ``kind`` built from ``spec`` with the role's engine
        ``settings`` (``max_model_len``, ``gpu_memory_utilization``, ``tensor_parallel_size``),
        each with Ray ``options`` (its GPUs: the tensor-parallel size)."""
        actor = generation_engine_class()
        # max_restarts: Ray brings a dead engine back (with its initial weights: the last pushed
        # ones are loaded again before it is used)
        engines = [actor.options(**(options or {"num_cpus": 1}), max_restarts=2, max_task_retries=0)
                   .remote(kind, spec, threads, settings) for _ in range(n_engines)]
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

    def weight_sync_client(self, role: str) -> EnginesWeightSyncClient:
        """The client an :class:`EngineWeightPusher` (on learner rank 0) drives to send
        ``role``'s full weights into every engine in place; tell this backend each version it
        committed (:meth:`weights_committed`)."""
        return EnginesWeightSyncClient(self.engines, role)

    def weights_committed(self, role: str, version: int) -> None:
        """``role``'s weights reached every engine in place as ``version``: generations now ask
        for it, and no object ref of them is kept (a restarted engine refuses until the next
        push instead of being refilled through the driver)."""
        self._weights.pop(role, None)
        self._versions[role] = int(version)

    def version(self, role: str) -> int:
        """The weight version of ``role`` generations ask for (0: never pushed)."""
        return self._versions.get(role, 0)

    def weights_loaded(self, role: str, ref: Any, version: int) -> None:
        """Every engine loaded ``role``'s weights as ``version`` from ``ref``, an object ref
        another process put (learner rank 0): generations now ask for that version, and an
        engine Ray restarts is refilled from the same ref (the driver never fetches it)."""
        self._weights[role] = ref
        self._versions[role] = int(version)

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
