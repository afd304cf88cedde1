"""The sharded learner on Ray: FSDP2 ranks as Ray actors, their weights straight to the
generation engines.

Full fine-tuning (``model.lora_r=0``) in a Ray run trains with :class:`ShardedRayLearner`: one
Ray actor per rank (:class:`ShardedRankImpl`), placed and joined into one torch.distributed
process group as the data-parallel learner's ranks are (a PACK placement group, gloo on CPU,
NCCL on GPU), each holding a :class:`~crl_bench.distributed.fsdp.ShardedLearner`: 1/N of the
fp32 weights, gradients and AdamW state, the loss and micro-batches of ``RoleTrainer.update``.
Every rank gets the same samples (one object ref) and runs the same update (SPMD).

Weights to the generation engines (:meth:`ShardedRayLearner.push_weights`): after an update the
ranks gather the weights one parameter at a time (a collective; only rank 0 keeps them, in the
compute dtype: bf16 on GPUs), rank 0 puts them in its object store once and has every engine
load them from there under a new version number; the driver receives the object ref only (to
refill an engine Ray restarted), never the weights. Engines refuse a generation that names
another version (:class:`~crl_bench.llm.types.StaleWeights`). The driver's own copy of the
model is refreshed only when something reads it (:meth:`ShardedRayLearner.weights`: before a
checkpoint, or when the extractor shares the actor's model).

On GPUs the same control flow carries the weights by NCCL instead of the object store: rank 0
joins a process group with the engines' workers (vLLM's weight-transfer API,
:class:`~crl_bench.distributed.generation.EngineWeightPusher`) and broadcasts each gathered
bf16 parameter into them in place; that path is implemented for ``vllm`` engines and tested on
CPU in one process with gloo (``crl_bench.llm.vllm_weight_sync``), not yet on GPUs.

Checkpoints: :meth:`ShardedRayLearner.save` / :meth:`~ShardedRayLearner.load` write and read
``torch.distributed.checkpoint`` folders, each rank its shards (no full copy anywhere).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from crl_bench.distributed import require_ray
from crl_bench.distributed.learner import (join_group, rank_address, start_ranks,
                                           stop_ranks)


class ShardedRankImpl:
    """One FSDP2 rank (plain class; :func:`~crl_bench.distributed.remote_class` makes the actor).

    Args: as :class:`~crl_bench.distributed.learner.LearnerRankImpl`.
    """

    def __init__(self, rank: int, world_size: int, backend_spec: dict[str, Any], role: str,
                 optim: Any, total_steps: int, seed: int = 0, threads: int = 1) -> None:
        import torch

        torch.set_num_threads(threads)
        self.rank, self.world_size = rank, world_size
        self.backend_spec = dict(backend_spec)
        self.role, self.optim, self.total_steps, self.seed = role, optim, total_steps, seed
        self.learner: Any = None

    def address(self) -> tuple[str, int]:
        return rank_address()

    def setup(self, master: tuple[str, int]) -> int:
        """Join the process group and build the sharded learner (every rank loads the model
        from the spec, as the single process does, then keeps its shards)."""
        from crl_bench.distributed.fsdp import ShardedLearner

        join_group(self.backend_spec, self.rank, self.world_size, master)
        self.learner = ShardedLearner(self.backend_spec, self.role, self.optim,
                                      total_steps=self.total_steps, seed=self.seed)
        return os.getpid()

    def update(self, samples: Sequence[Any], **kwargs: Any) -> dict[str, float]:
        return self.learner.update(samples, **kwargs)

    def updates(self) -> int:
        return self.learner.updates

    def offload_states(self) -> None:
        self.learner.offload_states()

    def load_states(self) -> None:
        self.learner.load_states()

    def state_events(self) -> list[tuple[str, dict[str, Any]]]:
        """This rank's ``offload`` / ``reload`` log (``ShardedLearner.state_log``)."""
        return list(self.learner.state_log)

    def push_weights(self, engines: list[Any], role: str, version: int) -> list[Any] | None:
        """Gather the weights (every rank), then rank 0 puts them in the object store once and
        every engine loads them as ``version``. Rank 0 returns ``[ref]`` (a list, so that the
        caller gets the ref, not the weights); the other ranks None."""
        import ray

        weights = self.learner.gathered_weights(dtype=self.learner.compute_dtype)
        if weights is None:
            return None
        ref = ray.put(weights)
        del weights
        ray.get([e.load_weights.remote(role, ref, version) for e in engines])
        return [ref]

    def weights(self, dtype: Any = None) -> list[Any] | None:
        """The full weights (fp32, or ``dtype``) on rank 0 (a collective; the others: None)."""
        return self.learner.gathered_weights(dtype=dtype)

    def save(self, path: str) -> None:
        self.learner.save(path)

    def load(self, path: str) -> None:
        self.learner.load(path)

    def pid(self) -> int:
        return os.getpid()

    def describe(self) -> dict[str, Any]:
        """What this rank is: its process, the GPUs Ray gave it, its process group and how it
        trains (read back by the topology check)."""
        import ray
        import torch.distributed as dist

        lr = self.learner
        return {"pid": os.getpid(), "rank": self.rank, "world_size": dist.get_world_size(),
                "backend": str(dist.get_backend()), "role": self.role,
                "model": self.backend_spec.get("model_name"),
                "activation_checkpointing": bool(
                    getattr(lr.model, "is_gradient_checkpointing", False)),
                "compute_dtype": str(lr.compute_dtype).replace("torch.", ""),
                "sharded_units": len(lr.units),
                "gpus": [str(g) for g in ray.get_gpu_ids()],
                "resources": dict(ray.get_runtime_context().get_assigned_resources()),
                "placement_group": ray.get_runtime_context().get_placement_group_id(),
                "init": getattr(lr, "init", None)}

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class ShardedRayLearner:
    """``n_ranks`` FSDP2 ranks for one role (full fine-tuning); the driver-side face.

    Args: as :class:`~crl_bench.distributed.learner.DataParallelLearner` (``backend_spec``
    without LoRA; ``optim.mini_batches`` 1).
    """

    def __init__(self, n_ranks: int, backend_spec: dict[str, Any], role: str, optim: Any, *,
                 total_steps: int, seed: int = 0, bundle: dict[str, float] | None = None,
                 strategy: str = "PACK", threads: int = 1, group: Any = None) -> None:
        from crl_bench.distributed.fsdp import check_sharded_config

        check_sharded_config(backend_spec, role, optim)  # before any actor starts
        self._ray = require_ray()
        self.n_ranks, self.role, self.cfg = n_ranks, role, optim
        self.ranks, self.placement_group, self.pids = start_ranks(
            ShardedRankImpl, n_ranks, (backend_spec, role, optim, total_steps, seed, threads),
            bundle=bundle, strategy=strategy, group=group)
        self.own_group = group is None  # a colocated role's group is its models part's

    def _all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """``method`` on every rank at once (the collectives need all of them)."""
        return self._ray.get([getattr(r, method).remote(*args, **kwargs) for r in self.ranks])

    def update(self, samples: Sequence[Any], *, loss: str, loss_kwargs: dict[str, Any],
               agg: str = "token-mean", temperature: float = 1.0,
               after: Any = None) -> dict[str, float]:
        """One optimiser step on ``samples`` (one object ref, read by every rank); the metrics
        of ``RoleTrainer.update`` (summed over the ranks, the same on each). ``after`` (the
        push) is called when the step was taken."""
        ref = self._ray.put(list(samples))
        metrics = self._all("update", ref, loss=loss, loss_kwargs=loss_kwargs, agg=agg,
                            temperature=temperature)[0]
        if after is not None and not metrics.get("skipped"):
            after()
        return metrics

    @property
    def updates(self) -> int:
        return int(self._ray.get(self.ranks[0].updates.remote()))

    def offload_states(self) -> None:
        """Every rank's training states to host memory (colocated: during the rollout)."""
        self._all("offload_states")

    def load_states(self) -> None:
        """Every rank's training states back on its device (before the update)."""
        self._all("load_states")

    def state_events(self) -> list[list[tuple[str, dict[str, Any]]]]:
        """Each rank's ``offload`` / ``reload`` log."""
        return self._all("state_events")

    def push_weights(self, engines: list[Any], role: str, version: int) -> Any:
        """The current weights into every engine as ``version`` (see the module docstring);
        returns the object ref rank 0 put them under (the driver never fetches it)."""
        return next(out for out in self._all("push_weights", list(engines), role, version)
                    if out is not None)[0]

    def weights(self, dtype: Any = None) -> list[Any]:
        """The full weights (fp32, or ``dtype``: the driver's bf16), pulled from rank 0
        (checkpoints, a shared extractor)."""
        return self._all("weights", dtype)[0]

    def save(self, path: str) -> None:
        """A sharded checkpoint into the folder ``path`` (each rank writes its shards)."""
        self._all("save", str(path))

    def load(self, path: str) -> None:
        self._all("load", str(path))

    def close(self) -> None:
        stop_ranks(self.ranks, self.placement_group if self.own_group else None)


CHECKPOINTS = "learner_checkpoints"


class ShardedRoleTrainer:
    """The role's :class:`~crl_bench.training.host.RoleHost` in a Ray run with full
    fine-tuning: ``generate`` on the role's engines, ``update`` on the sharded ranks, rank 0 pushes the new weights into the generation
    engines under the next version, and the driver's copy of the model is refreshed only when it
    is read: before a checkpoint (:meth:`sync_driver`), or after each update when the extractor
    shares the actor's model. Checkpoint state: a sharded checkpoint folder in the run directory.

    Args:
        models: the run's :class:`~crl_bench.distributed.context.RayModels` (``gen``,
            ``raw_backend``, ``lock``).
        info: the run's :class:`~crl_bench.run.parts.base.RunInfo` (``run``).
        learner: the :class:`ShardedRayLearner`.
        role: the trained role.
        gen: the role's generation engines (default ``models.gen``, the actor's; the sharded
            extractor's are ``models.ext_gen``).
    """

    def __init__(self, models: Any, info: Any, learner: ShardedRayLearner, role: str = "actor",
                 gen: Any = None) -> None:
        self.models, self.info, self.learner = models, info, learner
        self.gen = gen if gen is not None else models.gen  # the role's generation engines
        self.adapter = role
        self.cfg = learner.cfg
        self.updates = 0
        self.pushed_roles = (role,)  # the context does not push these through the driver
        self.driver_updates = 0  # the driver's copy holds the weights after this many updates

    role = property(lambda self: self.adapter)
    local = True
    """Nothing for a checkpoint to bring back through the driver: the ranks write their own
    sharded checkpoint (:meth:`state_dict`)."""

    def generate(self, message_lists: list[list[dict]], stop: Sequence[str] = (),
                 seed: int | None = None) -> list[Any]:
        """The extractor role on its engines (the actor generates through the rollout engine)."""
        import dataclasses

        from crl_bench.llm.roles import extractor_generate

        if self.adapter != "extractor":
            raise NotImplementedError("the actor generates through the rollout engine")
        sampling = self.models.extractor_sampling
        if seed is not None:
            sampling = dataclasses.replace(sampling, seed=seed)
        return extractor_generate(self.models.ext_backend, sampling, message_lists, tuple(stop))

    def weights(self) -> list[Any]:
        """The full weights, pulled from rank 0."""
        return self.learner.weights()

    def load_weights(self, weights: Sequence[Any]) -> None:
        raise NotImplementedError("the sharded learner's weights come from its own sharded "
                                  "checkpoints (load_state_dict)")

    def snapshot(self) -> dict[str, Any]:
        return {"weights": self.weights(), "state": self.state_dict()}

    def close(self) -> None:
        self.learner.close()

    def update(self, samples: Any, **kwargs: Any) -> dict[str, float]:
        metrics = self.learner.update(samples, after=self._stepped, **kwargs)
        if not metrics.get("skipped") and getattr(self.models.raw_backend, "shared_adapter",
                                                  False):
            self.pull()  # the extractor generates and trains with the shared model
        return metrics

    def _stepped(self) -> None:
        """After a step, before the engines generate again: the new weights into them."""
        self.updates += 1
        self.push()

    def push(self) -> None:
        """The ranks' weights into every engine under the next version (not via the driver)."""
        gen = self.gen
        version = gen.version(self.adapter) + 1
        gen.weights_loaded(self.adapter, self.learner.push_weights(gen.engines, self.adapter,
                                                                   version), version)

    def pull(self) -> None:
        """The ranks' weights into the driver's copy of the model."""
        from crl_bench.training.precision import load_role_weights

        backend = self.models.raw_backend
        params = backend.trainable_parameters(self.adapter)
        weights = self.learner.weights(params[0].dtype if params else None)  # the copy's dtype
        with self.models.lock:
            load_role_weights(backend, self.adapter, weights)
        self.driver_updates = self.updates

    def sync_driver(self) -> None:
        """The driver's copy current (before a checkpoint saves it); nothing to do when the
        driver holds no weights (the sharded checkpoint has them)."""
        if getattr(self.models, "holds_weights", True) and self.driver_updates != self.updates:
            self.pull()

    def state_dict(self) -> dict[str, Any]:
        """The ranks write a sharded checkpoint of this update into the run directory (kept with
        the one before it); the state names it."""
        import shutil

        root = self.info.run.path / CHECKPOINTS
        folder = root / f"{self.adapter}_update_{self.updates:06d}"
        if not folder.is_dir():
            self.learner.save(str(folder))
        for old in sorted(root.glob(f"{self.adapter}_update_*"))[:-2]:
            shutil.rmtree(old, ignore_errors=True)
        return {"sharded_checkpoint": str(folder.relative_to(self.info.run.path)),
                "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.learner.load(str(self.info.run.path / state["sharded_checkpoint"]))
        self.updates = int(state["updates"])
        self.driver_updates = self.updates  # the models part loaded the checkpoint's copy first
        self.push()
