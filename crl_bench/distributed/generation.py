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
import time
from typing import Any, Sequence

from crl_bench.distributed import remote_class, require_ray
from crl_bench.distributed.weight_sync import (  # noqa: F401  (re-exported)
    EngineWeightPusher, EnginesWeightSyncClient)
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
                 settings: dict[str, Any] | None = None,
                 ray_executor: dict[str, str] | None = None) -> None:
        # ray_executor (colocated, an engine over several bundles): before CUDA initialises
        self.ray_executor = self._use_ray_executor(ray_executor) if ray_executor else None
        import torch

        torch.set_num_threads(threads)
        # settings: the role's engine settings (crl_bench.run.parts.models.engine_settings);
        # a vllm engine is built with them, an hf engine (CPU) keeps them as its description
        self.kind, self.spec, self.settings = kind, dict(spec), dict(settings or {})
        build = dict(self.settings)
        vllm_kwargs = dict(build.get("vllm_kwargs") or {})
        if build.pop("sleep_mode", False) and kind == "vllm" and torch.cuda.is_available():
            # colocated: vLLM's sleep / wake-up need its sleep-mode allocator from the start
            vllm_kwargs["enable_sleep_mode"] = True
        if self.ray_executor is not None:
            if kind == "vllm":
                vllm_kwargs["distributed_executor_backend"] = "ray"
            gpus = self.ray_executor["own_gpus"]
            if gpus and torch.cuda.is_available():  # the HF copy on this actor's own GPU
                torch.cuda.set_device(int(gpus[0]))
        if vllm_kwargs:
            build["vllm_kwargs"] = vllm_kwargs
        self.backend = make_backend(kind, dict(spec, **build) if kind == "vllm" else spec)
        self.calls = 0
        self.tokens = 0
        self.versions: dict[str, int] = {}
        self.sleeping: set[str] = set()
        """What sleeps: vLLM's tags, ``weights`` and ``kv_cache`` (empty: awake)."""
        self.log: list[tuple[str, Any]] = []
        """What this engine was asked to do, in order (``generate``, ``sleep``, ``wake_up``,
        ``weights`` with the version and the path they came by): the run's call order read
        back from the engine."""
        self._group: Any = None  # the weight-push process group (broadcast path)

    @staticmethod
    def _use_ray_executor(env: dict[str, str]) -> dict[str, Any]:
        """Prepare this process for vLLM's Ray executor, as OpenRLHF's engine actor does
        (``openrlhf/trainer/ray/vllm_engine.py:71-88``): the tensor-parallel workers go to the
        bundles of ``env`` (``VLLM_RAY_BUNDLE_INDICES``, ``VLLM_RAY_PER_WORKER_GPUS``) in this
        actor's placement group, which vLLM finds with ``ray.util.get_current_placement_group()``
        (``EngineArgs.create_engine_config``); Ray's ``CUDA_VISIBLE_DEVICES`` of this actor is
        dropped (vLLM gives each worker its own). Returns what was set, read back."""
        import ray

        own = [str(g) for g in ray.get_gpu_ids()]
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        os.environ.update(env)
        group = ray.util.get_current_placement_group()
        return {"env": {k: os.environ[k] for k in env}, "own_gpus": own,
                "placement_group": group.id.hex() if group is not None else None}

    # -- sleep / wake-up (colocated: the learner rank updates on this engine's GPU) -------------
    def sleep_mode(self) -> bool:
        """vLLM's sleep mode is on: the engine was built with ``enable_sleep_mode`` (CUDA only;
        :func:`crl_bench.run.parts.models.engine_settings` asks for it when colocated)."""
        llm = getattr(self.backend, "llm", None)
        config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
        return bool(getattr(getattr(config, "model_config", None), "enable_sleep_mode", False))

    @property
    def asleep(self) -> bool:
        return bool(self.sleeping)

    def sleep(self, level: int = 1) -> bool:
        """Free this engine's GPU memory for the learner's update: the prefix cache is reset (its
        blocks would be stale after the push that follows), then vLLM's ``LLM.sleep(level)``
        (level 1: weights backed up in host memory, KV cache dropped) when the engine has sleep
        mode; on CPU (no sleep mode) only the reset, recorded. Returns whether vLLM slept."""
        if self.asleep:
            raise RuntimeError("sleep() on a sleeping engine: wake_up() first")
        self._reset_prefix_cache()
        slept = False
        if self.sleep_mode():
            self.backend.llm.sleep(level=level)
            slept = True
        self.sleeping = {"weights", "kv_cache"}
        self.log.append(("sleep", {"level": level, "vllm": slept, "t": time.monotonic()}))
        return slept

    def wake_up(self, tags: Sequence[str] | None = None) -> bool:
        """Back from :meth:`sleep`: vLLM's ``LLM.wake_up(tags)`` (``weights`` back on the GPU,
        ``kv_cache`` reallocated; None: both) when it slept; recorded either way. The weights
        alone first let a push land before the KV cache takes its memory (verl's order when the
        learner's states go to host memory after the push)."""
        if not self.sleeping:
            raise RuntimeError("wake_up() on an engine that is awake")
        tags = sorted(self.sleeping if tags is None else set(tags) & self.sleeping)
        woke = False
        if self.sleep_mode():
            self.backend.llm.wake_up(tags=tags)
            woke = True
        self.sleeping -= set(tags)
        self.log.append(("wake_up", {"vllm": woke, "tags": tags, "t": time.monotonic()}))
        return woke

    def _reset_prefix_cache(self) -> None:
        """Forget KV computed with the previous weights: vLLM's prefix cache, the HF backend's
        KV kept across calls."""
        llm = getattr(self.backend, "llm", None)
        if llm is not None and hasattr(llm, "reset_prefix_cache"):
            llm.reset_prefix_cache()
        store = getattr(self.backend, "_kv_store", None)
        if store is not None:
            store.clear()

    def events(self) -> list[tuple[str, Any]]:
        """:attr:`log`: the calls this engine served, in order."""
        return list(self.log)

    # -- weights by broadcast (crl_bench.distributed.weight_sync) -----------------------------
    def join_weight_group(self, address: str, port: int, rank: int, world_size: int,
                          backend: str) -> None:
        """Join the weight-push process group at ``rank`` (the sender, learner rank 0, is 0)."""
        from crl_bench.distributed.weight_sync import open_group

        self._group = open_group(address, port, rank, world_size, backend)
        self._group_method = f"{backend}_broadcast"  # the plan's name of this path

    def receive_weights(self, role: str, metas: list[tuple[list[int], str]],
                        version: int) -> None:
        """Receive ``role``'s weights by broadcast into this engine's model (in place), reset
        the prefix cache and commit ``version``."""
        from crl_bench.distributed.weight_sync import receive_into

        if self._group is None:
            raise RuntimeError("receive_weights before join_weight_group")
        if "weights" in self.sleeping:
            raise RuntimeError("weights pushed into a sleeping engine: wake_up() first")
        if hasattr(self.backend, "weight_versions"):
            raise RuntimeError("a vllm engine receives pushed weights in its workers "
                               "(EngineWeightPusher), not through receive_weights")
        receive_into(self._group, self.backend.trainable_parameters(role), metas)
        self.backend.after_update(role)  # hf: drops the KV kept across calls
        self._reset_prefix_cache()
        self.versions[role] = int(version)
        self.log.append(("weights", {"role": role, "version": int(version),
                                     "by": self._group_method, "t": time.monotonic()}))

    def pid(self) -> int:
        return os.getpid()

    def describe(self) -> dict[str, Any]:
        """What this engine is: its process, the GPUs Ray gave it, the model and roles it
        serves and the engine settings it was built with (a vllm engine's as vLLM got them)."""
        import ray

        settings = dict(getattr(self.backend, "engine_settings", None) or self.settings)
        ctx = ray.get_runtime_context()
        return {"pid": os.getpid(), "kind": self.kind, "model": self.spec.get("model_name"),
                "roles": tuple(self.spec.get("roles", ())), "settings": settings,
                "gpus": [str(g) for g in ray.get_gpu_ids()],
                "resources": dict(ctx.get_assigned_resources()),
                "placement_group": ctx.get_placement_group_id(),
                "sleep_mode": self.sleep_mode(), "node": ctx.get_node_id(),
                "ray_executor": self.ray_executor}

    def generate(self, prompts: list[list[int]], sampling: Any, adapter: str | None = None,
                 max_new_tokens: list[int] | int | None = None,
                 versions: dict[str, int] | None = None) -> list[Any]:
        """``versions``: the weight versions the caller expects; a (restarted) engine that does
        not have them refuses with :class:`StaleWeights` instead of sampling from old weights."""
        if self.asleep:
            raise RuntimeError("generate() on a sleeping engine (its learner is updating): "
                               "wake_up() first")
        if not self.log or self.log[-1][0] != "generate":
            # consecutive calls: one rollout
            self.log.append(("generate", {"t": time.monotonic()}))
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

        if "weights" in self.sleeping:
            raise RuntimeError("weights pushed into a sleeping engine: wake_up() first")
        load_role_weights(self.backend, role, weights)
        if hasattr(self.backend, "weight_versions"):  # vllm: the HF copy's weights into vLLM
            self.backend.after_update(role, version=version)
        else:
            self.backend.after_update(role)  # hf: drops the KV kept across calls
        self._reset_prefix_cache()
        if version is not None:
            self.versions[role] = version
        self.log.append(("weights", {"role": role, "version": version, "by": "object_store",
                                     "t": time.monotonic()}))

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
        from crl_bench.distributed.weight_sync import VLLM_TRANSFERS

        self._sync().finish_weight_update(str(version))  # resets vLLM's prefix cache
        self.versions[role] = int(version)
        by = {t: m for m, t in VLLM_TRANSFERS.items()}[self.backend.transport]  # the plan's name
        self.log.append(("weights", {"role": role, "version": int(version), "by": by,
                                     "t": time.monotonic()}))

    def weights(self, role: str) -> list[Any]:
        from crl_bench.training.precision import role_weights

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
              options: dict[str, Any] | None = None, threads: int = 1,
              settings: dict[str, Any] | None = None, placement_group: Any = None,
              bundles: list[int] | None = None,
              ray_executor: list[dict[str, str] | None] | None = None,
              ) -> "RemoteGenerationBackend":
        """``n_engines`` engine actors of ``kind`` built from ``spec`` with the role's engine
        ``settings`` (``max_model_len``, ``gpu_memory_utilization``, ``tensor_parallel_size``),
        each with Ray ``options`` (its GPUs: the tensor-parallel size). ``placement_group`` and
        ``bundles`` (colocated: the role's group, :meth:`ResourcePlan.engine_bundles`): engine k
        starts in bundle ``bundles[k]``, beside the learner rank of that GPU; ``ray_executor``
        (:meth:`ResourcePlan.ray_executor_env`): engine k's tensor-parallel workers go to the
        next bundles through vLLM's Ray executor."""
        actor = generation_engine_class()
        opts = [dict(options or {"num_cpus": 1}) for _ in range(n_engines)]
        executors = list(ray_executor or [None] * n_engines)
        if placement_group is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            if bundles is None or len(bundles) != n_engines or len(executors) != n_engines:
                raise ValueError(f"{n_engines} engines in a placement group need one bundle "
                                 f"index each, got {bundles}")
            for o, b, ex in zip(opts, bundles, executors):
                # capture: vLLM's workers belong to the group too (OpenRLHF vllm_engine.py:260-264)
                o["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    placement_group, placement_group_bundle_index=b,
                    placement_group_capture_child_tasks=ex is not None)
        # max_restarts: Ray brings a dead engine back (with its initial weights: the last pushed
        # ones are loaded again before it is used)
        engines = [actor.options(**o, max_restarts=2, max_task_retries=0)
                   .remote(kind, spec, threads, settings, ex) for o, ex in zip(opts, executors)]
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

    def sleep(self) -> None:
        """Every engine to sleep (colocated: before the learner ranks on their GPUs update)."""
        self._ray.get([e.sleep.remote() for e in self.engines])

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Every engine awake again (after the update, before the weights are pushed; ``tags``:
        only those, :meth:`GenerationEngineImpl.wake_up`)."""
        self._ray.get([e.wake_up.remote(tags) for e in self.engines])

    def events(self) -> list[list[tuple[str, Any]]]:
        """Each engine's call log (:meth:`GenerationEngineImpl.events`)."""
        return self._ray.get([e.events.remote() for e in self.engines])

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
        if ref is None:  # pushed in place (broadcast / IPC): nothing to refill an engine from
            self._weights.pop(role, None)
        else:
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
