"""Full weights into a running vLLM engine, in place, through vLLM's weight-transfer API.

vLLM (>= 0.32) updates a live engine's weights in a session its workers run:
``init_weight_transfer_engine`` once (the trainer and the engine's workers join one process
group), then per update ``start_weight_update`` / ``update_weights`` / ``finish_weight_update``
(``collective_rpc`` to every worker), and a *weight version* the engine stamps on every output
(``CompletionOutput.weight_versions``). The sender is whichever process holds the trained weights
(the HF training copy of :class:`~crl_bench.llm.vllm_backend.VLLMBackend`, or learner rank 0):
tensors go from it straight to the engine's workers, never through a driver's copy.

Transports (``WeightTransferConfig.backend``):

* ``gloo`` (registered here): a gloo broadcast from the sender (rank 0) to the engine's workers
  (ranks ``rank_offset``...), for CPUs. Received tensors load through vLLM's layerwise reload
  (as vLLM's own NCCL engine does), i.e. into the engine's existing parameter storage.
* ``nccl`` (vLLM's): the same broadcast over NCCL, for a learner and engines on their own GPUs.
* ``ipc`` (vLLM's): CUDA IPC handles, for a trainer and an engine sharing one GPU.

Only ``gloo`` runs on this project's machines (tests/test_llm_vllm.py); ``nccl`` and ``ipc`` are
vLLM's engines, selected by :func:`transport_for` (a sender in the engine's process) or by a Ray
run's weight path (``crl_bench.distributed.weight_sync.VLLM_TRANSFERS``: learner ranks send),
and not run here.

Versions: :class:`LLMWeightSyncClient` marks the engine ``updating`` from
``start_weight_update`` until ``finish_weight_update`` commits the new version, so an engine that
failed mid-update (or is mid-update) never passes for one holding a committed version.
"""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Iterator

import torch
from vllm.distributed.utils import (stateless_destroy_torch_distributed_process_group,
                                    stateless_init_torch_distributed_process_group)
from vllm.distributed.weight_transfer.base import (ParamMeta, TrainerInitInfo,
                                                   TrainerWeightTransferEngine, WeightSource,
                                                   WeightTransferEngine, WeightTransferInitInfo,
                                                   WeightTransferUpdateInfo,
                                                   materialize_full_tensor)
from vllm.distributed.weight_transfer.factory import (WeightTransferEngineFactory,
                                                      WeightTransferTrainerFactory)

GLOO = "gloo"
UPDATING = "updating"
"""The weight version an engine reports between ``start_weight_update`` and its finish."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _broadcast(group: Any, tensor: torch.Tensor) -> None:
    """Broadcast ``tensor`` from group rank 0 on a stateless (non-global) process group."""
    opts = torch.distributed.BroadcastOptions()
    opts.rootRank = 0
    opts.rootTensor = 0
    group.broadcast([tensor], opts).wait()


# -- the engine's side (runs in vLLM's worker) ----------------------------------------------------
@dataclass
class GlooWeightTransferInitInfo(WeightTransferInitInfo):
    master_address: str
    master_port: int
    rank_offset: int
    """Group rank of this engine's first worker (the sender is 0; engine k of n single-worker
    engines sits at 1 + k)."""
    world_size: int


@dataclass
class GlooWeightTransferUpdateInfo(WeightTransferUpdateInfo):
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(f"names, dtype_names and shapes differ in length: {len(self.names)}, "
                             f"{len(self.dtype_names)}, {len(self.shapes)}")


def tied_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Layers holding a parameter another layer holds too (a tied ``lm_head``), after the first
    holder; only those with a ``quant_method`` (whose processing may copy the weight)."""
    holders: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            holders.setdefault(id(param), []).append(module)
    return [m for mods in holders.values() for m in mods[1:]
            if getattr(m, "quant_method", None) is not None]


class GlooWeightTransferEngine(WeightTransferEngine[GlooWeightTransferInitInfo,
                                                    GlooWeightTransferUpdateInfo]):
    """vLLM worker side of the ``gloo`` transport: receive each tensor by broadcast from rank 0
    and load it with the model's own ``load_weights`` inside vLLM's layerwise reload."""

    init_info_cls = GlooWeightTransferInitInfo
    update_info_cls = GlooWeightTransferUpdateInfo

    def __init__(self, config: Any, vllm_config: Any, device: torch.device,
                 model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: Any = None

    def init_transfer_engine(self, init_info: GlooWeightTransferInitInfo) -> None:
        self.shutdown()  # a new sender replaces the last one
        p = self.parallel_config
        rank = p.data_parallel_index * p.world_size + p.rank + init_info.rank_offset
        self.group = stateless_init_torch_distributed_process_group(
            init_info.master_address, init_info.master_port, rank, init_info.world_size, GLOO)

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        for layer in tied_layers(self.model):
            # a tied output layer (lm_head sharing the embedding) receives no weights of its own,
            # so the reload leaves it unprocessed: on CPUs it keeps computing with the old packed
            # copy (cpu_linear) of the embedding. Redo its processing from the new weights.
            layer.quant_method.process_weights_after_loading(layer)

    def receive_weights(self, update_info: GlooWeightTransferUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("gloo weight transfer not initialised: call "
                               "init_weight_transfer_engine first.")
        for name, dtype_name, shape in zip(update_info.names, update_info.dtype_names,
                                           update_info.shapes):
            weight = torch.empty(shape, dtype=getattr(torch, dtype_name), device="cpu")
            _broadcast(self.group, weight)
            self.model.load_weights([(name, weight.to(self.device))])

    def shutdown(self) -> None:
        if self.group is not None:
            stateless_destroy_torch_distributed_process_group(self.group)
            self.group = None


# -- the sender's side ---------------------------------------------------------------------------
@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    backend: ClassVar[str] = GLOO

    master_address: str
    master_port: int
    world_size: int
    """1 (the sender) + every engine worker that receives."""


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """Sender side of the ``gloo`` transport (group rank 0), driving the engine's update through
    a :class:`~vllm.distributed.weight_transfer.base.VLLMWeightSyncClient`. Non-sender trainer
    ranks only iterate the source (an FSDP gather is a collective every rank must join)."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client: Any, source: WeightSource | None = None,
                 is_sender: bool = True) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.group: Any = None

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client: Any,
                     source: WeightSource | None = None) -> "GlooTrainerWeightTransferEngine":
        if source is None:
            raise ValueError("the gloo weight transfer needs a WeightSource.")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender)
        if not engine.is_sender:
            return engine
        worker = GlooWeightTransferInitInfo(init_info.master_address, init_info.master_port,
                                            rank_offset=1, world_size=init_info.world_size)
        # the workers block in the rendezvous until the sender joins: both at once
        with ThreadPoolExecutor(max_workers=1) as exe:
            future = exe.submit(client.init_weight_transfer_engine, asdict(worker))
            engine.group = stateless_init_torch_distributed_process_group(
                init_info.master_address, init_info.master_port, 0, init_info.world_size, GLOO)
            future.result()
        return engine

    def send_weights(self) -> None:
        assert self.source is not None
        meta = self.source.metadata()
        if not self.is_sender:
            for _ in self.source:
                pass
            return
        info = GlooWeightTransferUpdateInfo(names=[m.name for m in meta],
                                            dtype_names=[str(m.dtype).split(".")[-1] for m in meta],
                                            shapes=[list(m.shape) for m in meta])
        self.client.start_weight_update()
        exe = ThreadPoolExecutor(max_workers=1)
        try:
            # the workers receive inside update_weights while this thread broadcasts
            future = exe.submit(self.client.update_weights, asdict(info))
            sent = 0
            for (name, tensor), m in zip(self.source, meta):
                if name != m.name or tensor.dtype != m.dtype or tuple(tensor.shape) != m.shape:
                    raise ValueError(f"WeightSource yielded {name!r} {tensor.dtype} "
                                     f"{tuple(tensor.shape)} where metadata() declared {m}.")
                _broadcast(self.group, tensor.detach().to("cpu").contiguous())
                sent += 1
            if sent != len(meta):
                raise ValueError(f"WeightSource yielded {sent} tensors, metadata() {len(meta)}.")
            future.result()
        finally:
            exe.shutdown(wait=False)  # never join a worker stuck in a broken broadcast
        self.client.finish_weight_update()

    def shutdown(self) -> None:
        if self.group is not None:
            stateless_destroy_torch_distributed_process_group(self.group)
            self.group = None


def register() -> None:
    """Make ``gloo`` a vLLM weight-transfer backend (idempotent; call before building the engine,
    in the process its workers run in: vLLM's in-process engine on CPUs)."""
    if GLOO not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(GLOO, GlooWeightTransferEngine)
    if GLOO not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(GLOO, GlooTrainerWeightTransferEngine)


def transport_for(device: str, colocated: bool) -> str:
    """``gloo`` on CPUs; on GPUs ``ipc`` when the sender shares the engine's GPU (one process
    with an HF training copy), ``nccl`` when it has its own (a learner rank)."""
    if not str(device).startswith("cuda"):
        return GLOO
    return "ipc" if colocated else "nccl"


def trainer_init_info(transport: str, *, world_size: int = 2, rank: int = 0,
                      address: str = "127.0.0.1") -> TrainerInitInfo:
    """The sender's init info for ``transport`` (a fresh local port for gloo / nccl)."""
    if transport == GLOO:
        return GlooTrainerInitInfo(address, free_port(), world_size, rank=rank)
    if transport == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        return NCCLTrainerInitInfo(address, free_port(), world_size, rank=rank)
    if transport == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        return IPCTrainerInitInfo(rank=rank)
    raise ValueError(f"unknown weight transport {transport!r}: gloo, nccl or ipc.")


def start_sender(init_info: TrainerInitInfo, client: Any, source: WeightSource) -> Any:
    """Rendezvous with the engine(s) behind ``client``; the returned sender's ``send_weights()``
    pushes ``source`` once per update."""
    register()
    return WeightTransferTrainerFactory.trainer_init(init_info, client=client, source=source)


# -- what is sent ----------------------------------------------------------------------------------
class ModelWeights(WeightSource):
    """A module's parameters under their checkpoint names, cast to the engine's dtype on the wire
    (e.g. fp32 training weights sent as bf16: half the bytes, the cast the engine would do).
    FSDP shards are gathered with ``full_tensor()`` as they are sent."""

    def __init__(self, module: torch.nn.Module, wire_dtype: torch.dtype | None = None) -> None:
        self.module = module
        self.wire_dtype = wire_dtype

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(n, self.wire_dtype or p.dtype, tuple(p.shape))
                for n, p in self.module.named_parameters()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, p in self.module.named_parameters():
            t = materialize_full_tensor(p.detach())
            yield name, (t if self.wire_dtype is None else t.to(self.wire_dtype))


# -- the engine's control plane, for a sender in the engine's own process ----------------------------
class LLMWeightSyncClient:
    """:class:`~vllm.distributed.weight_transfer.base.VLLMWeightSyncClient` over an in-process
    ``vllm.LLM``: each call is a ``collective_rpc`` to its workers. The version committed at
    ``finish_weight_update`` is ``weight_version`` or, when the sender passes none (vLLM's own
    senders do not), :attr:`pending_version`."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.pending_version: str | None = None
        self.prefix_cache_resets = 0

    @property
    def engine(self) -> Any:
        return self.llm.llm_engine

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": init_info})

    def start_weight_update(self) -> None:
        self.engine.set_weight_version(UPDATING)
        self.llm.collective_rpc("start_weight_update")

    def update_weights(self, update_info: Any) -> None:
        self.llm.collective_rpc("update_weights", kwargs={"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        """Commit the update: the workers finish loading, the prefix cache is emptied (its KV
        blocks were computed with the old weights; a new episode whose prompt shares a cached
        prefix would otherwise attend to them, as OpenRLHF and TRL avoid by resetting it on
        every sync), then the new version is set."""
        self.llm.collective_rpc("finish_weight_update")
        version = weight_version if weight_version is not None else self.pending_version
        if version is None:
            raise ValueError("finish_weight_update needs a weight version (or pending_version).")
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight update "
                               "(requests still running?): finish the update when the engine "
                               "is idle.")
        self.prefix_cache_resets += 1
        self.engine.set_weight_version(str(version))

    def get_weight_version(self) -> str:
        return str(self.engine.get_weight_version())
