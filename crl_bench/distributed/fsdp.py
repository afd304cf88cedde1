"""A sharded learner for full fine-tuning: torch FSDP2 (``fully_shard``), one rank per process.

The data-parallel learner (:mod:`crl_bench.distributed.learner`) replicates the model, its
gradients and AdamW's state on every rank: ~16 bytes per parameter per rank, 120 GB for a 7B
actor. :class:`ShardedLearner` shards them instead (ZeRO-3): ``fully_shard`` is applied to every
decoder layer, then to the root (embeddings, final norm, the tied head), so each rank keeps
1/N of the fp32 parameters, their gradients and the optimiser state, and gathers one layer's
weights at a time for its forward and backward.

* Precision: the sharded parameters are fp32 (they are the masters); with a bf16 ``dtype``
  FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=fp32)`` casts each gathered layer to bf16 for compute and reduce-scatters the
  gradients in fp32. Per rank: (4 weight + 4 gradient + 8 AdamW) x P / N bytes, plus one layer's
  gathered bf16 weights and gradients in flight.
* The loss is ``RoleTrainer``'s: the batch is filtered, sampled, ordered and cut into
  micro-batches exactly as on one process (:func:`~crl_bench.distributed.learner.plan_update`),
  micro-batches are dealt to ranks, and each micro-batch's loss is scaled by its share of the
  *whole* batch's tokens (or sequences) in the one update loop
  (:func:`~crl_bench.training.update.micro_batch_step`); gradients are summed over ranks
  (divide factor 1), then one clip and one AdamW step on the shards. Every rank runs the same number of micro-batches (the short ones
  pad with a zero-advantage sample): each forward and backward gathers weights from all ranks.
* Long trajectories: ``micro_batch_tokens`` bounds a micro-batch's padded tokens, and
  ``activation_checkpointing`` (both :class:`~crl_bench.config.schema.OptimConfig` fields)
  recomputes each decoder layer's activations in the backward
  instead of keeping them (transformers' gradient checkpointing, non-reentrant).
* Checkpoints: :meth:`ShardedLearner.save` writes a sharded checkpoint with
  ``torch.distributed.checkpoint`` (each rank its own shards of the weights and AdamW's state;
  loadable at another world size), :meth:`ShardedLearner.load` resumes it exactly.
* Prefix sharing (a GRPO group's prompt encoded once) is off here: it runs the model twice per
  micro-batch for some micro-batches only, and all ranks must gather in step.

SPMD: every rank of an initialised ``torch.distributed`` process group (``torchrun``; gloo on
CPU, NCCL on GPU) builds a ``ShardedLearner`` with the same arguments and calls
:meth:`ShardedLearner.update` with the same samples. LoRA keeps the replicated data-parallel
learner: its adapters are small, and the frozen base needs no optimiser state.
"""

from __future__ import annotations

import contextlib
import random
from pathlib import Path
from typing import Any, Iterator, Sequence

EXTRA_STATE = "learner_state.pt"


class HostOffload:
    """A learner's training states in host memory while its GPU serves the rollout (colocated
    placement), as the official pipeline's ``offload_states`` / ``load_states`` (its ROLL's
    Megatron strategy, pUmpKin-Co/ComplementaryRL at ab2574f:
    roll/distributed/strategy/megatron_strategy.py:524-550, pinned by default; ROLL's FSDP2
    strategy moves the sharded model the same way, alibaba/ROLL
    roll/distributed/strategy/fsdp2_strategy.py:933-967).

    :meth:`offload` copies every storage behind the given tensors into host memory (pinned where
    the storage is on CUDA) and resizes the storage to 0 bytes, freeing it; :meth:`reload`
    gives each storage its bytes back and copies them in. The tensors, their views (FSDP2's
    sharded parameters are views of one flat shard) and the optimiser's references to them stay
    the same objects, so nothing else changes; on CPU the same code runs (the storages are
    emptied and refilled: what the tests check)."""

    def __init__(self) -> None:
        self.saved: list[tuple[Any, Any]] = []  # (storage, its bytes in host memory)

    @property
    def offloaded(self) -> bool:
        return bool(self.saved)

    @property
    def host_bytes(self) -> int:
        return sum(int(h.numel()) for _, h in self.saved)

    def offload(self, tensors: Any) -> None:
        import torch

        if self.saved:
            raise RuntimeError("the learner's states are already in host memory")
        seen: set[tuple[str, int]] = set()
        cuda = False
        for t in tensors:
            t = t.to_local() if hasattr(t, "to_local") else t  # a DTensor's local shard
            storage = t.untyped_storage()
            key = (str(storage.device), storage.data_ptr())
            if storage.nbytes() == 0 or key in seen:  # several views of one storage
                continue
            seen.add(key)
            cuda = cuda or storage.device.type == "cuda"
            host = torch.empty(storage.nbytes(), dtype=torch.uint8,
                               pin_memory=storage.device.type == "cuda")
            host.copy_(_as_bytes(storage), non_blocking=True)
            self.saved.append((storage, host))
        if cuda:
            torch.cuda.synchronize()
        for storage, _ in self.saved:
            storage.resize_(0)
        if cuda:
            torch.cuda.empty_cache()  # back to the driver, for the engine waking up

    def reload(self) -> None:
        import torch

        cuda = False
        for storage, host in self.saved:
            storage.resize_(host.numel())
            _as_bytes(storage).copy_(host, non_blocking=True)
            cuda = cuda or storage.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
        self.saved = []


def _as_bytes(storage: Any) -> Any:
    import torch

    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def decoder_layers(model: Any) -> list[Any]:
    """The decoder layers of a Hugging Face causal LM (``model.model.layers``)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no model.layers: the sharded learner "
                         "shards decoder-only transformers (Llama, Qwen2, ...)")
    return list(layers)


def check_sharded_config(backend_spec: dict[str, Any], role: str, optim: Any) -> None:
    """Refuse, by name, what the sharded learner does not train: LoRA, several optimiser steps
    per update."""
    from crl_bench.config.schema import ConfigError

    if backend_spec.get("lora") is not None:
        raise ConfigError("the sharded learner is for full fine-tuning (lora_r=0); LoRA "
                          "trains with the replicated data-parallel learner")
    if getattr(optim, "mini_batches", 1) != 1:
        raise ConfigError(f"{role}.mini_batches={optim.mini_batches}: the sharded learner "
                          f"takes one optimiser step per update; use --set "
                          f"{role}.mini_batches=1")


def _materialise_from_rank0(model: Any, backend: Any, spec: dict[str, Any]) -> str:
    """Fill a sharded model built on the meta device: allocate each rank's shards on the
    backend's device (``to_empty``), rank 0 loads the model once into host memory (the same
    weights ``HFBackend`` would load, seed included) and broadcasts its full state dict into every
    rank's shards (``set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)``) and
    its buffers (rotary frequencies are not in the state dict) over the learners' group.
    Returns how this rank was initialised."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from crl_bench.llm.models import load_causal_lm

    device = torch.device(backend.device)
    model.to_empty(device=device)
    full_sd: dict[str, Any] = {}
    buffers: dict[str, Any] = {}
    if dist.get_rank() == 0:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(spec.get("seed", 0)))  # HFBackend's seed for a random init
            loaded = load_causal_lm(backend.path, dtype="float32", device="cpu")
        full_sd = loaded.state_dict()
        buffers = {n: b for n, b in loaded.named_buffers()}
        del loaded
    set_model_state_dict(model, full_sd, options=StateDictOptions(full_state_dict=True,
                                                                  broadcast_from_rank0=True))
    for name, buf in model.named_buffers():
        if dist.get_rank() == 0:
            buf.copy_(buffers[name].to(device))
        dist.broadcast(buf, src=0)
    del full_sd, buffers
    return "rank 0 loaded" if dist.get_rank() == 0 else "meta, filled from rank 0"


class ShardedLearner:
    """One rank of an FSDP2 learner for one role (full fine-tuning).

    Args:
        backend_spec: :class:`~crl_bench.llm.hf_backend.HFBackend` keyword arguments
            (``model_name``, ``device``, ``seed``...); ``lora`` must be None. ``dtype`` is the
            compute dtype (``"auto"``: bf16 on capable CUDA, fp32 on CPU): the model is loaded
            in fp32 (the shards are the masters) and a 16-bit ``dtype`` becomes FSDP2's
            ``param_dtype``, with gradients reduced in fp32.
        role: the role to train.
        optim: its :class:`~crl_bench.config.schema.OptimConfig` (``mini_batches`` must be 1;
            ``activation_checkpointing`` and ``micro_batch_tokens`` for long trajectories).
        total_steps, seed: as for ``RoleTrainer``.
    """

    def __init__(self, backend_spec: dict[str, Any], role: str, optim: Any, *, total_steps: int,
                 seed: int = 0) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        from crl_bench.llm.hf_backend import HFBackend
        from crl_bench.llm.models import pick_device, pick_dtype
        from crl_bench.training.role_trainer import RoleTrainer, enable_checkpointing

        check_sharded_config(backend_spec, role, optim)
        if not dist.is_initialized():
            raise RuntimeError("ShardedLearner needs an initialised torch.distributed process "
                               "group: launch with torchrun (gloo on CPU, nccl on GPU)")
        compute = pick_dtype(str(backend_spec.get("dtype", "auto")),
                             pick_device(str(backend_spec.get("device", "auto"))))
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.compute_dtype = compute  # the dtype generation engines get the weights in
        self.role, self.cfg = role, optim
        spec = dict(backend_spec, roles=(role,), lora=None, dtype="float32",
                    share_prompt_prefix=False)
        # meta-device initialisation (as verl and torchtune do): every rank builds the model on
        # the meta device (no weights read, no memory), shards it, materialises only its shards
        # on its device, and rank 0 broadcasts the loaded weights into them; rank 0 alone reads
        # the checkpoint, into host memory (before: every rank loaded the full fp32 model on its
        # device and a deep copy of it, 2 x 30 GB per GPU at 7B)
        self.backend = HFBackend(**spec, empty_init=True)
        # the frozen base copy serves generation with adapter=None; a learner never generates
        self.backend._models.pop("base", None)
        self.model = model = self.backend.trainable_model(role)
        if getattr(optim, "activation_checkpointing", False):
            enable_checkpointing(model)  # before sharding; RoleTrainer.begin_step uses it
        policy = None
        if compute != torch.float32:
            policy = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
        kwargs = {"mp_policy": policy} if policy is not None else {}
        self.units = [fully_shard(layer, **kwargs) for layer in decoder_layers(model)]
        self.units.append(fully_shard(model, **kwargs))
        for unit in self.units:  # the shares already divide by the batch: sum over ranks
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no PREMUL_SUM)
        self.init = _materialise_from_rank0(model, self.backend, spec)
        self.trainer = RoleTrainer(self.backend, role, optim, total_steps=total_steps, seed=seed)
        self._rng = random.Random(seed)  # RoleTrainer's max_samples_per_update draws
        self.host = HostOffload()
        self.state_log: list[tuple[str, dict[str, Any]]] = []
        """``offload`` / ``reload`` with the time (``time.monotonic``, one clock for every
        process of a machine) and the bytes moved: read back to check the run's order."""

    # -- the training states in host memory during the rollout (colocated) ---------------------
    def states(self) -> list[Any]:
        """The tensors of this rank's training states: the sharded fp32 parameters (the
        masters), their gradients where kept, and AdamW's state."""
        import torch

        tr = self.trainer
        out = list(tr.params) + [p.grad for p in tr.params if p.grad is not None]
        for state in tr.optimizer.state.values():
            out += [v for v in state.values() if isinstance(v, torch.Tensor)]
        return out

    def offload_states(self, why: str = "rollout") -> None:
        """The training states to host memory (pinned on CUDA), their GPU memory freed."""
        import time

        self.host.offload(self.states())
        self.state_log.append(("offload", {"t": time.monotonic(), "bytes": self.host.host_bytes,
                                           "why": why}))

    def load_states(self, why: str = "update") -> None:
        """The training states back where they were (nothing to do when they are)."""
        import time

        if self.host.offloaded:
            moved = self.host.host_bytes
            self.host.reload()
            self.state_log.append(("reload", {"t": time.monotonic(), "bytes": moved,
                                              "why": why}))

    @contextlib.contextmanager
    def states_loaded(self, why: str) -> Iterator[None]:
        """The states on the device for one call (a checkpoint, a gather of the weights), then
        back in host memory if they were there."""
        was = self.host.offloaded
        self.load_states(why)
        try:
            yield
        finally:
            if was:
                self.offload_states(why)

    @property
    def updates(self) -> int:
        return self.trainer.updates

    def update(self, samples: Sequence[Any], *, loss: str, loss_kwargs: dict[str, Any],
               agg: str = "token-mean", temperature: float = 1.0) -> dict[str, float]:
        """One optimiser step on ``samples`` (the same on every rank); ``RoleTrainer.update``'s
        metrics, summed over the ranks."""
        from crl_bench.distributed.learner import plan_update, sum_over_ranks
        from crl_bench.training.update import micro_batch_step

        tr = self.trainer
        self.load_states()
        per_rank, totals, metrics = plan_update(samples, self.cfg, self._rng, by_prompt=False,
                                                n_ranks=self.world_size)
        if not per_rank:
            metrics.update(loss=0.0, grad_norm=0.0, skipped=1.0)
            return metrics
        metrics.update(micro_batch_step(
            tr, per_rank[self.rank], totals, loss=loss, loss_kwargs=loss_kwargs, agg=agg,
            temperature=temperature, lr=tr.step_lr(), pad_to=max(len(c) for c in per_rank),
            reduce=sum_over_ranks))  # FSDP summed the gradient in the backward
        tr.updates += 1
        self.backend.after_update(self.role)
        metrics.update(tokens=totals["tokens"], skipped=0.0)
        return metrics

    # -- weights ---------------------------------------------------------------------------------
    def full_weights(self) -> list[Any]:
        """Every trained weight gathered in full, fp32 on CPU, in ``RoleTrainer.params`` order
        (a collective: every rank calls it)."""
        return self.gathered_weights(keep_on=None)

    def gathered_weights(self, dtype: Any = None, keep_on: int | None = 0) -> list[Any] | None:
        """Every trained weight gathered in full, one parameter at a time, on CPU (cast to
        ``dtype``, e.g. the engines' bf16), in ``RoleTrainer.params`` order: a collective; rank
        ``keep_on`` returns the list, the others None and drop each gathered weight at once
        (``keep_on=None``: every rank keeps it). Peak on a rank that drops: one full parameter."""
        import torch.distributed as dist

        keep = keep_on is None or dist.get_rank() == keep_on
        out = []
        with self.states_loaded("weights"):
            for p in self.trainer.params:
                full = p.full_tensor() if hasattr(p, "full_tensor") else p
                if keep:
                    out.append(full.detach().to(device="cpu", dtype=dtype or full.dtype).clone())
                del full
        return out if keep else None

    def full_optimizer_state(self) -> dict[str, Any]:
        """AdamW's state gathered in full on CPU, keyed by parameter name (a collective)."""
        from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                             get_optimizer_state_dict)

        with self.states_loaded("weights"):
            return get_optimizer_state_dict(self.model, self.trainer.optimizer,
                                            options=StateDictOptions(full_state_dict=True,
                                                                     cpu_offload=True))

    # -- sharded checkpoints -----------------------------------------------------------------------
    def _states(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self.model, self.trainer.optimizer)
        return {"model": model_state, "optim": optim_state}

    def save(self, path: str | Path) -> None:
        """Write a sharded checkpoint into the folder ``path`` (a collective): the weights and
        AdamW's state with ``torch.distributed.checkpoint``, and the update counter and sample
        RNG from rank 0."""
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        path = Path(path)
        with self.states_loaded("checkpoint"):
            dcp.save(self._states(), checkpoint_id=str(path))
        if self.rank == 0:
            torch.save({"updates": self.trainer.updates, "rng": self._rng.getstate(),
                        "world_size": self.world_size}, path / EXTRA_STATE)
        dist.barrier()

    def load(self, path: str | Path) -> None:
        """Resume from :meth:`save`'s folder (a collective; any world size)."""
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        path = Path(path)
        if not (path / EXTRA_STATE).is_file():
            raise FileNotFoundError(f"{path} is not a sharded learner checkpoint (no "
                                    f"{EXTRA_STATE}); save one with ShardedLearner.save")
        with self.states_loaded("checkpoint"):
            states = self._states()
            dcp.load(states, checkpoint_id=str(path))
            set_state_dict(self.model, self.trainer.optimizer, model_state_dict=states["model"],
                           optim_state_dict=states["optim"])
        extra = torch.load(path / EXTRA_STATE, weights_only=False)
        self.trainer.updates = int(extra["updates"])
        self._rng.setstate(extra["rng"])
