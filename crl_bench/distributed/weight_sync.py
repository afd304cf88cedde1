"""How a trained role's weights reach its generation engines after an update.

:func:`sync_method` picks the path from the plan's ``weight_sync`` setting, the device, the
engines' kind and the placement:

* ``nccl_broadcast`` (CUDA, engines on GPUs of their own, ``split``): learner rank 0 and every
  engine join a process group created for the push (not the learners' group) and rank 0
  broadcasts each gathered bf16 tensor into the engines, GPU to GPU, as OpenRLHF and verl
  broadcast from the trainer's rank 0 into their engines. ``hf`` engines receive it in their
  actor (:class:`BroadcastPusher`, :func:`receive_into`); ``vllm`` engines in their workers,
  built with vLLM's ``nccl`` weight-transfer engine (:func:`engine_transfer`) and driven by
  vLLM's trainer-side sender (:class:`EngineWeightPusher`).
* ``cuda_ipc`` (CUDA, ``colocated``): an engine shares its GPU with a learner rank, and NCCL
  refuses two ranks of one group on the same GPU; each rank hands its engine the gathered
  tensor by a CUDA IPC handle (vLLM's ``ipc`` transport), as verl's hybrid engine and
  OpenRLHF's colocated mode do. Every rank puts its handles under its GPU's UUID, rank 0 sends
  them all to every engine, and each vLLM worker opens its own GPU's: an engine over several
  GPUs (its tensor-parallel workers in the next bundles, :meth:`~crl_bench.distributed.plan.
  ResourcePlan.ray_executor_env`) gets each worker's source from the rank on that GPU (vLLM's
  ``IPCWeightTransferEngine.receive_weights``; OpenRLHF ``vllm_worker_wrap.py:61``).
* ``gloo_broadcast``: the broadcast path on CPUs (the same group construction and collectives
  over gloo; ``vllm`` engines through the project's ``gloo`` weight-transfer engine); chosen by
  ``weight_sync="broadcast"`` without CUDA.
* ``object_store`` (the CPU fallback): rank 0 puts the weights in Ray's object store once and
  every engine loads them from there.

The group is built as vLLM's ``stateless_init_torch_distributed_process_group`` builds it: a
``TCPStore`` at rank 0's address and a ``ProcessGroupNCCL`` / ``ProcessGroupGloo`` on it, so it
lives beside the learners' default process group without touching it.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator, Sequence

from crl_bench.distributed import require_ray

METHODS = ("nccl_broadcast", "cuda_ipc", "gloo_broadcast", "object_store")
VLLM_TRANSFERS = {"nccl_broadcast": "nccl", "gloo_broadcast": "gloo", "cuda_ipc": "ipc"}
"""The vLLM weight-transfer engine a ``vllm`` engine is built with for each path from the
learner ranks (the object store needs none: the engine's own HF copy sends)."""


def sync_method(setting: str, device: str, engine_kind: str, colocated: bool) -> str:
    """The weight path a run builds (one of :data:`METHODS`) for the plan's ``weight_sync``
    ``setting`` ("auto" / "object_store" / "broadcast"), the learners' ``device``, the engines'
    ``engine_kind`` ("hf" / "vllm") and whether engines and ranks share GPUs."""
    if setting not in ("auto", "object_store", "broadcast"):
        raise ValueError(f"weight_sync={setting!r}: use auto, object_store or broadcast")
    if setting == "object_store":
        return "object_store"
    cuda = str(device).startswith("cuda")
    if cuda:
        if colocated:
            # one rank and one engine per GPU: IPC handles (vLLM's ipc engine); an hf engine has
            # no IPC receiver here, so it takes the object store
            return "cuda_ipc" if engine_kind == "vllm" else "object_store"
        # engines on GPUs of their own: an NCCL broadcast from rank 0 (a vllm engine built with
        # vLLM's nccl weight-transfer engine, engine_transfer)
        return "nccl_broadcast"
    return "gloo_broadcast" if setting == "broadcast" else "object_store"


def role_sync_method(plan: Any, cfg: Any) -> str:
    """:func:`sync_method` for a run of ``cfg`` on ``plan`` (``model.device`` "auto": CUDA when
    the plan has GPUs, as :func:`~crl_bench.distributed.plan.built_topology` prints it)."""
    device = str(cfg.model.device)
    if device == "auto":
        device = "cuda" if plan.required()["GPU"] else "cpu"
    return sync_method(plan.weight_sync, device, str(cfg.model.backend),
                       bool(getattr(plan, "colocated", False)))


def engine_transfer(plan: Any, cfg: Any) -> dict[str, str]:
    """The engine setting that makes a role's ``vllm`` engines receive their weights from the
    learner ranks: ``{"weight_transfer": ...}`` (vLLM's weight-transfer engine for the path,
    :data:`VLLM_TRANSFERS`; the engine then starts no sender of its own), or nothing (``hf``
    engines; the object store, where the engine's HF copy sends)."""
    method = role_sync_method(plan, cfg)
    if str(cfg.model.backend) != "vllm" or method not in VLLM_TRANSFERS:
        return {}
    return {"weight_transfer": VLLM_TRANSFERS[method]}


def group_backend_for(method: str) -> str:
    return {"nccl_broadcast": "nccl", "gloo_broadcast": "gloo"}[method]


class WeightGroup:
    """The push's process group, its device (where received tensors land) and its store."""

    def __init__(self, pg: Any, device: Any, store: Any) -> None:
        self.pg, self.device, self.store = pg, device, store


def open_group(address: str, port: int, rank: int, world_size: int, backend: str,
               timeout_s: float = 300.0) -> WeightGroup:
    """A process group of its own for the weight push (``backend`` "nccl" or "gloo"): a
    ``TCPStore`` served by rank 0, and the backend's process group on it (the construction of
    vLLM's ``stateless_init_torch_distributed_process_group``). Every member calls it; it
    returns when all have joined."""
    import datetime

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(address, port, world_size, is_master=rank == 0, timeout=timeout)
    prefixed = dist.PrefixStore("crl_weight_sync", store)
    import torch

    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, opts)
        device = torch.device("cuda", torch.cuda.current_device())
    elif backend == "gloo":
        pg = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
        device = torch.device("cpu")
    else:
        raise ValueError(f"weight-sync group backend {backend!r}: nccl or gloo")
    return WeightGroup(pg, device, store)


def broadcast(group: WeightGroup, tensor: Any) -> None:
    """Broadcast ``tensor`` from group rank 0 (in place on the receivers)."""
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    opts.rootTensor = 0
    group.pg.broadcast([tensor], opts).wait()


def receive_into(group: WeightGroup, params: Sequence[Any], metas: Sequence[tuple[list[int], str]]) -> None:
    """Engine side: receive one tensor per ``metas`` entry (shape, dtype name) by broadcast and
    copy it into ``params`` (the engine's trainable parameters, in :func:`role_weights` order)."""
    import torch

    if len(metas) != len(params):
        raise ValueError(f"the push carries {len(metas)} tensors, the engine's model has "
                         f"{len(params)} trainable parameters: the learner and the engine were "
                         "built from different models")
    device = group.device
    for p, (shape, dtype) in zip(params, metas):
        if list(p.shape) != list(shape):
            raise ValueError(f"pushed tensor of shape {shape} for a parameter of shape "
                             f"{list(p.shape)}: the learner and the engine hold different models")
        buf = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
        broadcast(group, buf)
        with torch.no_grad():
            p.copy_(buf.to(device=p.device, dtype=p.dtype))


class BroadcastPusher:
    """Learner rank 0's side of the ``*_broadcast`` path into ``hf`` engines: joins the engines
    (group ranks ``1 + k``) once, then :meth:`push` broadcasts each tensor of an update into
    all of them while they receive (:meth:`GenerationEngineImpl.receive_weights`).

    Args:
        engines: generation engine actor handles.
        role: the role whose weights go out.
        method: ``nccl_broadcast`` or ``gloo_broadcast``.
    """

    def __init__(self, engines: list[Any], role: str, method: str) -> None:
        import ray

        from crl_bench.distributed.learner import rank_address

        self.engines, self.role, self.method = list(engines), role, method
        backend = group_backend_for(method)
        address, port = rank_address()
        world = 1 + len(self.engines)
        # the engines block in the rendezvous until rank 0 joins: their calls first, then ours
        refs = [e.join_weight_group.remote(address, port, 1 + k, world, backend)
                for k, e in enumerate(self.engines)]
        self.group = open_group(address, port, 0, world, backend)
        ray.get(refs)

    def push(self, weights: Iterable[Any], version: int,
             metas: Sequence[tuple[list[int], str]] | None = None) -> None:
        """Send ``weights`` (tensors in the engines' ``role_weights`` order, already in the wire
        dtype) into every engine; they commit ``version`` and reset their prefix caches.
        ``metas`` (shape, dtype name per tensor): given, ``weights`` may be a generator (each
        tensor gathered as it is sent: one full tensor at a time on the sender)."""
        import ray

        if metas is None:
            weights = list(weights)
            metas = [(list(t.shape), str(t.dtype).replace("torch.", "")) for t in weights]
        refs = [e.receive_weights.remote(self.role, list(metas), int(version))
                for e in self.engines]
        device = self.group.device
        sent = 0
        for t in weights:
            broadcast(self.group, t.detach().to(device).contiguous())
            sent += 1
        if sent != len(metas):
            raise ValueError(f"{sent} tensors sent, {len(metas)} announced")
        ray.get(refs)

    def close(self) -> None:
        self.group = None


# -- vLLM engines: their workers receive through vLLM's weight-transfer API -----------------
class EnginesWeightSyncClient:
    """vLLM's ``VLLMWeightSyncClient`` over generation engine actors: each call goes to every
    engine at once. Picklable (actor handles), so the driver hands it to the process that holds
    the trained weights. Engine k's workers join the transfer group at rank ``1 + k``."""

    def __init__(self, engines: list[Any], role: str, workers_per_engine: int = 1) -> None:
        self.engines = list(engines)
        self.role = role
        self.workers_per_engine = int(workers_per_engine)
        """Each engine's workers in the transfer group (its tensor-parallel size)."""
        self.pending_version: int | None = None

    def _all(self, refs: list[Any]) -> None:
        require_ray().get(refs)

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        base = int(init_info.get("rank_offset", 1))
        self._all([e.init_weight_transfer_engine.remote(
            dict(init_info, rank_offset=base + k * self.workers_per_engine)
            if "rank_offset" in init_info else init_info)
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
    masters). ``transfer``: the vLLM weight-transfer engine the engines were built with
    (:data:`VLLM_TRANSFERS`: ``nccl`` between GPUs, ``ipc`` sharing one, ``gloo`` on CPUs); a
    broadcast's group is at ``address`` (rank 0's node)."""

    def __init__(self, module: Any, client: EnginesWeightSyncClient, *, transfer: str,
                 rank: int = 0, wire_dtype: Any = None, address: str = "127.0.0.1") -> None:
        from crl_bench.llm.vllm_weight_sync import ModelWeights, start_sender, trainer_init_info

        self.client = client
        info = trainer_init_info(transfer, rank=rank, address=address,
                                 world_size=1 + len(client.engines) * client.workers_per_engine)
        self.sender = start_sender(info, client, ModelWeights(module, wire_dtype))

    def push(self, version: int) -> None:
        self.client.pending_version = int(version)
        self.sender.send_weights()

    def close(self) -> None:
        self.sender.shutdown()


# -- a role's learner with its engines: sleep / wake-up around the update, the push's path -------
def _gathered(learner: Any, dtype: Any) -> Iterator[Any]:
    """Every trained weight gathered in full, one at a time on the learner's device, cast to
    ``dtype`` (a collective: every rank iterates)."""
    for p in learner.trainer.params:
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        yield full.detach().to(dtype)


def _metas(learner: Any, dtype: Any) -> list[tuple[list[int], str]]:
    name = str(dtype).replace("torch.", "")
    return [(list(p.shape), name) for p in learner.trainer.params]


def _rank_join(rank: Any, engines: list[Any], role: str, method: str, kind: str,
               colocated: bool, workers_per_engine: int) -> None:
    """In a learner rank actor (``ShardedRankImpl``, through Ray's ``__ray_call__``): build
    this rank's side of the push."""
    if kind == "vllm":
        from crl_bench.distributed.learner import rank_address

        client = EnginesWeightSyncClient(engines, role, workers_per_engine=workers_per_engine)
        rank._crl_pusher = EngineWeightPusher(
            rank.learner.model, client, transfer=VLLM_TRANSFERS[method], rank=rank.rank,
            wire_dtype=rank.learner.compute_dtype, address=rank_address()[0])
    else:
        rank._crl_pusher = BroadcastPusher(engines, role, method) if rank.rank == 0 else None


def _rank_push(rank: Any, kind: str, version: int) -> None:
    """In a learner rank actor: one push of the current weights as ``version`` (every rank
    joins the gathers; rank 0 sends)."""
    learner, pusher = rank.learner, rank._crl_pusher
    with learner.states_loaded("weights"):  # offloaded (a resumed run's first push): back
        if kind == "vllm":
            pusher.push(version)
            return
        dtype = learner.compute_dtype
        tensors = _gathered(learner, dtype)
        if pusher is None:
            for _ in tensors:  # the gathers are collectives
                pass
            return
        pusher.push(tensors, version, metas=_metas(learner, dtype))


class SyncedLearner:
    """A role's :class:`~crl_bench.distributed.sharded.ShardedRayLearner` as its role trainer
    sees it, with the role's engines: colocated, the engines sleep before the update and wake
    after it (the run's order per step: rollout -> sleep -> update -> wake -> push); the push
    takes :func:`sync_method`'s path (the object store: the learner's own ``push_weights``).
    Everything else is the learner's.

    Colocated with ``offload`` (``model.offload_learner_states``), the ranks' training states
    (fp32 masters, AdamW moments) live in host memory while the engines hold the GPUs, as the
    official pipeline's ``offload_states`` before each rollout
    (roll/pipeline/agentic/agentic_pipeline.py:193 of the official code): offloaded when built
    (ROLL's workers end their setup so, roll/pipeline/base_worker.py:111), then per step
    rollout -> sleep -> reload -> update -> wake the engines' weights -> push -> offload ->
    wake their KV cache (the push gathers the states; the KV cache takes its memory only once
    they left, verl's order). A checkpoint or a gather of the weights brings them back for its
    duration with the engines asleep.

    Args:
        learner: the role's ``ShardedRayLearner``.
        gen: the role's ``RemoteGenerationBackend``.
        method: :func:`sync_method`'s answer.
        colocated: the engines share the ranks' GPUs (sleep / wake-up around the update).
        kind: the engines' backend ("hf" / "vllm").
        workers_per_engine: each engine's tensor-parallel size (vLLM workers in the group).
        lock: held from sleep to wake-up (the role's generation lock: no generation reaches a
            sleeping engine).
        offload: colocated, the training states in host memory during the rollout.
    """

    def __init__(self, learner: Any, gen: Any, *, method: str, colocated: bool, kind: str,
                 workers_per_engine: int = 1, lock: Any = None, offload: bool = False) -> None:
        if method not in METHODS:
            raise ValueError(f"weight path {method!r}: one of {', '.join(METHODS)}")
        self.learner, self.gen = learner, gen
        self.method, self.colocated, self.kind = method, colocated, kind
        self.workers_per_engine = int(workers_per_engine)
        self.lock = lock if lock is not None else contextlib.nullcontext()
        self.offload = bool(offload) and colocated
        self._joined = False
        self._updating = False
        if self.offload:
            learner.offload_states()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.learner, name)

    def update(self, samples: Any, *, after: Any = None, **kwargs: Any) -> dict[str, float]:
        """One update; ``after`` (the push) runs when it stepped, before the engines generate."""
        if not self.colocated:
            return self.learner.update(samples, after=after, **kwargs)
        with self.lock:
            self.gen.sleep()
            kv_asleep = True
            try:
                if self.offload:
                    self.learner.load_states()  # the engines freed the GPU
                self._updating = True
                metrics = self.learner.update(samples, **kwargs)
                self.gen.wake_up(["weights"] if self.offload else None)
                kv_asleep = self.offload
                if after is not None and not metrics.get("skipped"):
                    after()
                if self.offload:
                    self.learner.offload_states()
            finally:
                self._updating = False
                if kv_asleep:
                    self.gen.wake_up()
        return metrics

    @contextlib.contextmanager
    def _asleep(self, tags: Any = None) -> Iterator[None]:
        """Offloaded and outside an update: the engines asleep (but ``tags``) for a call that
        brings the states back."""
        if not self.offload or self._updating:
            yield
            return
        with self.lock:
            self.gen.sleep()
            try:
                if tags:
                    self.gen.wake_up(tags)
                yield
            finally:
                self.gen.wake_up()

    def save(self, path: str) -> None:
        with self._asleep():
            self.learner.save(path)

    def load(self, path: str) -> None:
        with self._asleep():
            self.learner.load(path)

    def weights(self, dtype: Any = None) -> list[Any]:
        with self._asleep():
            return self.learner.weights(dtype)

    def push_weights(self, engines: list[Any], role: str, version: int) -> Any:
        """The weights into ``engines`` as ``version``: the object store's ref, or None when
        they went by broadcast / IPC (committed in place: nothing for the driver to keep)."""
        with self._asleep(["weights"]):
            if self.method == "object_store":
                return self.learner.push_weights(engines, role, version)
            ray = require_ray()
            ranks = self.learner.ranks
            if not self._joined:
                ray.get([r.__ray_call__.remote(_rank_join, list(engines), role, self.method,
                                               self.kind, self.colocated,
                                               self.workers_per_engine) for r in ranks])
                self._joined = True
            ray.get([r.__ray_call__.remote(_rank_push, self.kind, int(version)) for r in ranks])
            return None


def synced(learner: Any, gen: Any, plan: Any, cfg: Any, role: str, lock: Any = None) -> Any:
    """``learner`` wrapped for ``role``'s engines per ``plan`` (placement, ``weight_sync``) and
    ``cfg`` (device, backend, tensor parallel): what the Ray run's role trainer drives."""
    colocated = bool(getattr(plan, "colocated", False))
    kind = str(cfg.model.backend)
    method = role_sync_method(plan, cfg)
    tp = int(getattr(cfg.model, f"{role}_tensor_parallel", 1))
    return SyncedLearner(learner, gen, method=method, colocated=colocated, kind=kind,
                         workers_per_engine=tp, lock=lock,
                         offload=bool(getattr(cfg.model, "offload_learner_states", True)))
