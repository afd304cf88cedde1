"""The learner as data-parallel ranks: one Ray actor per rank, torch.distributed between them.

Each rank holds a full copy of the role's model (built from the same backend spec, then
broadcast from rank 0, so every rank starts from the same weights) and a
:class:`~crl_bench.training.role_trainer.RoleTrainer` for its optimiser, LR schedule and collation.
One update (:meth:`DataParallelLearner.update`) does what ``RoleTrainer.update`` does on one
process, split over ranks:

1. the driver plans the step exactly as ``RoleTrainer.update`` does
   (:func:`~crl_bench.training.update.select_samples` with the same seeded RNG,
   :func:`~crl_bench.training.update.plan_step`: the same micro-batches and whole-batch
   totals);
2. micro-batches are dealt to ranks (balanced by padded tokens); each rank runs them through
   the one update loop, :func:`~crl_bench.training.update.micro_batch_step` (with
   ``recompute_old_logprobs`` it recomputes the old log-probs on its own micro-batches first),
   each micro-batch's loss scaled by its share of the whole batch's tokens (or sequences), as
   on one process;
3. gradients are summed across ranks (``all_reduce`` SUM over one flat buffer), so every rank
   holds the gradient of the whole batch; then the same clip, LR schedule and AdamW step run on
   every rank (same gradient, same state: the replicas stay equal);
4. loss and diagnostics are summed across ranks the same way.

Transport: gloo on CPU (tested), NCCL on GPU (``device="cuda"``: one GPU per rank from the
placement group; not run here). Full fine-tuning of models too large to replicate: the sharded
learner, :mod:`crl_bench.distributed.fsdp`.
Ranks are placed with a PACK placement group (one bundle per rank), so that a multi-GPU learner
lands on as few nodes as possible.
"""

from __future__ import annotations

import os
import random
import socket
from typing import Any, Sequence

from crl_bench.distributed import remote_class, require_ray


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def group_backend(device: str) -> str:
    """The ``init_process_group`` backend of a learner on ``device``: on GPUs
    ``"cpu:gloo,cuda:nccl"`` (NCCL for the CUDA tensors: gradients, FSDP gathers, weight
    broadcasts; gloo for the CPU ones: the metric sums of :func:`sum_over_ranks`, object
    collectives, checkpoint coordination). A plain ``"nccl"`` maps only the ``cuda`` device, and
    any collective on a CPU tensor then fails (``No backend type associated with device type
    cpu``). ``"gloo"`` on CPUs."""
    return "cpu:gloo,cuda:nccl" if str(device).startswith("cuda") else "gloo"


def join_group(backend_spec: dict[str, Any], rank: int, world_size: int,
               master: tuple[str, int]) -> None:
    """Join the learner's torch.distributed process group (:func:`group_backend`: NCCL and gloo
    when the spec's device is a GPU, gloo otherwise; Ray sets CUDA_VISIBLE_DEVICES to the
    bundle's GPU: it is cuda:0 in the rank); rank 0's address is ``master``."""
    import torch
    import torch.distributed as dist

    device = str(backend_spec.get("device", "cpu"))
    if device.startswith("cuda"):
        torch.cuda.set_device(0)
    dist.init_process_group(group_backend(device), init_method=f"tcp://{master[0]}:{master[1]}",
                            rank=rank, world_size=world_size)


def rank_address() -> tuple[str, int]:
    """This node's address and a free port (rank 0's, for :func:`join_group`)."""
    import ray

    return ray.util.get_node_ip_address(), _free_port()


def start_ranks(impl: type, n_ranks: int, args: tuple, *, bundle: dict[str, float] | None,
                strategy: str, group: Any = None) -> tuple[list[Any], Any, list[int]]:
    """(rank actors, placement group, pids): ``n_ranks`` actors of ``impl`` (constructed with
    ``(rank, n_ranks, *args)``), one bundle each of a placement group with ``strategy``, joined
    into one process group (``impl.address`` on rank 0, then ``impl.setup(master)`` on all)."""
    ray = require_ray()
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundle = dict(bundle or {"CPU": 1})
    if group is None:  # colocated: the role's group, rank r in bundle r beside its engine
        group = placement_group([bundle] * n_ranks, strategy=strategy)
    ray.get(group.ready())
    cls = remote_class(impl)
    ranks = [cls.options(num_cpus=bundle.get("CPU", 1), num_gpus=bundle.get("GPU", 0),
                         scheduling_strategy=PlacementGroupSchedulingStrategy(
                             group, placement_group_bundle_index=r)).remote(r, n_ranks, *args)
             for r in range(n_ranks)]
    master = ray.get(ranks[0].address.remote())
    return ranks, group, ray.get([r.setup.remote(master) for r in ranks])


def stop_ranks(ranks: list[Any], group: Any) -> None:
    """Leave the process group (best effort), kill the rank actors, free their bundles (``group``
    None: the role's group, freed by its owner)."""
    ray = require_ray()
    from ray.util.placement_group import remove_placement_group

    try:
        ray.get([r.shutdown.remote() for r in ranks], timeout=30)
    except Exception:
        pass
    for r in ranks:
        ray.kill(r)
    if group is not None:
        remove_placement_group(group)


class LearnerRankImpl:
    """One rank (plain class; :func:`learner_rank_class` makes it a Ray actor).

    Args:
        rank, world_size: the rank's place in the group.
        backend_spec: keyword arguments of :class:`~crl_bench.llm.hf_backend.HFBackend`
            (``model_name``, ``roles``, ``lora``, ``dtype``, ``device``, ``seed``...).
        role: the role this learner trains ("actor" / "extractor").
        optim: the role's :class:`~crl_bench.config.schema.OptimConfig`.
        total_steps, seed: as for ``RoleTrainer``.
        threads: torch threads of this rank.
    """

    def __init__(self, rank: int, world_size: int, backend_spec: dict[str, Any], role: str,
                 optim: Any, total_steps: int, seed: int = 0, threads: int = 1) -> None:
        import torch

        torch.set_num_threads(threads)
        self.rank, self.world_size = rank, world_size
        self.backend_spec = dict(backend_spec)
        self.role = role
        self.optim, self.total_steps, self.seed = optim, total_steps, seed
        self.trainer: Any = None
        self.backend: Any = None
        self.keep_grads = False
        self.last_grads: list[Any] = []

    def set_keep_grads(self, keep: bool) -> None:
        """Keep a copy of the (reduced, clipped) gradients of the last update (tests only)."""
        self.keep_grads = keep

    def get_last_grads(self) -> list[Any]:
        return self.last_grads

    def address(self) -> tuple[str, int]:
        return rank_address()

    def setup(self, master: tuple[str, int]) -> int:
        """Join the process group, build the model and trainer, broadcast rank 0's weights."""
        import torch
        import torch.distributed as dist

        from crl_bench.llm.hf_backend import HFBackend
        from crl_bench.training.role_trainer import RoleTrainer

        join_group(self.backend_spec, self.rank, self.world_size, master)
        self.backend = HFBackend(**self.backend_spec)
        self.trainer = RoleTrainer(self.backend, self.role, self.optim,
                                   total_steps=self.total_steps, seed=self.seed)
        with torch.no_grad():  # the full-precision weights (fp32 masters of a bf16 model)
            for p in self.trainer.precision.optimized:
                dist.broadcast(p.data, src=0)
        self.trainer.precision.write_back()
        return os.getpid()

    def pid(self) -> int:
        return os.getpid()

    def load_weights(self, weights: Sequence[Any]) -> None:
        self.trainer.load_weights(weights)

    def weights(self) -> list[Any]:
        """The trained weights at full precision (fp32 masters of a bf16 model)."""
        return self.trainer.weights()

    def state_dict(self) -> dict[str, Any]:
        return self.trainer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trainer.load_state_dict(state)

    def update_shard(self, chunks: list[list[Any]], totals: dict[str, float], *, loss: str,
                     loss_kwargs: dict[str, Any], agg: str, temperature: float) -> dict[str, float]:
        """This rank's micro-batches through the one update loop
        (:func:`~crl_bench.training.update.micro_batch_step`), the gradient and the metric sums
        summed over the ranks before the optimiser step (see the module docstring).
        ``totals``: ``tokens``, ``seqs`` (whole batch), ``active_tokens``."""
        import torch
        import torch.distributed as dist

        from crl_bench.training.update import micro_batch_step

        tr = self.trainer
        params = tr.precision.optimized  # fp32 masters of a bf16 model: reduced in fp32

        def reduce(total_loss: float, sums: dict[str, float]) -> dict[str, float]:
            # gradients of the whole batch on every rank: one flat buffer, summed
            flat = torch.cat([g.reshape(-1).float() for g in tr.gradients()])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            offset = 0
            for p in params:
                n = p.numel()
                p.grad = flat[offset:offset + n].view_as(p).to(p.dtype).clone()
                offset += n
            return sum_over_ranks(total_loss, sums)  # the same sums as on one process

        handle = None
        if self.keep_grads:  # clipped as the step sees them (the clip scales in place)
            def keep(*_: Any, **__: Any) -> None:
                self.last_grads = [p.grad.detach().to("cpu").clone() for p in params]
            handle = tr.optimizer.register_step_pre_hook(keep)
        try:
            metrics = micro_batch_step(tr, chunks, totals, loss=loss, loss_kwargs=loss_kwargs,
                                       agg=agg, temperature=temperature, lr=tr.step_lr(),
                                       reduce=reduce)
        finally:
            if handle is not None:
                handle.remove()
        tr.updates += 1
        self.backend.after_update(self.role)
        return metrics

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def sum_over_ranks(total_loss: float, sums: dict[str, float]) -> dict[str, float]:
    """``loss`` and every diagnostics sum added over the process group's ranks (a rank may lack
    a key another has)."""
    import torch
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, sorted(sums))
    keys = sorted(set().union(*[set(x) for x in gathered]))
    scal = torch.tensor([total_loss] + [sums.get(k, 0.0) for k in keys], dtype=torch.float64)
    dist.all_reduce(scal, op=dist.ReduceOp.SUM)
    metrics = {k: float(v) for k, v in zip(keys, scal[1:].tolist())}
    metrics["loss"] = float(scal[0])
    return metrics


def plan_update(samples: Sequence[Any], cfg: Any, rng: random.Random, *, by_prompt: bool,
                n_ranks: int) -> tuple[list[list[list[Any]]], dict[str, float], dict[str, float]]:
    """(micro-batches per rank, whole-batch totals, metrics so far): the step planned as on one
    process (:func:`~crl_bench.training.update.select_samples` with ``rng``,
    :func:`~crl_bench.training.update.plan_step`), the micro-batches dealt to ``n_ranks``
    ranks. No active sample: ``[]``."""
    from crl_bench.training.update import plan_step, select_samples

    plan = plan_step(select_samples(samples, cfg, rng), cfg, by_prompt=by_prompt)
    metrics = {"samples": float(len(plan.samples)), "active_samples": float(len(plan.active))}
    if not plan.active:
        return [], {}, metrics
    return deal_chunks(plan.chunks, n_ranks), plan.totals, metrics


def learner_rank_class() -> Any:
    return remote_class(LearnerRankImpl)


def deal_chunks(chunks: list[list[Any]], n_ranks: int) -> list[list[list[Any]]]:
    """Micro-batches to ranks, each to the rank with the fewest padded tokens so far (ties: the
    lower rank); a rank's chunks keep their batch order."""
    load = [0] * n_ranks
    out: list[list[list[Any]]] = [[] for _ in range(n_ranks)]
    for chunk in chunks:
        cost = len(chunk) * max(s.length for s in chunk)
        r = min(range(n_ranks), key=lambda i: (load[i], i))
        out[r].append(chunk)
        load[r] += cost
    return out


class DataParallelLearner:
    """``n_ranks`` learner ranks for one role; the driver-side face of the learner, the role's
    :class:`~crl_bench.training.host.RoleHost` on Ray with LoRA (it generates through the
    generation engines, not here).

    Args:
        n_ranks: data-parallel ranks.
        backend_spec: :class:`~crl_bench.llm.hf_backend.HFBackend` keyword arguments.
        role, optim, total_steps, seed: as for ``RoleTrainer``.
        bundle: resources of one rank (``{"CPU": 1}`` or ``{"CPU": 2, "GPU": 1}``); see
            :meth:`~crl_bench.distributed.plan.ResourcePlan.rank_bundle`.
        strategy: placement-group strategy (PACK: as few nodes as possible).
        driver: ``(backend, lock)``: the driver's model, whose role weights follow every update
            (checkpoints save them; an extractor sharing the actor's model generates with
            them) and are pushed into the ranks on resume.
    """

    local = True  # the driver's model holds the weights (after every update)

    def __init__(self, n_ranks: int, backend_spec: dict[str, Any], role: str, optim: Any, *,
                 total_steps: int, seed: int = 0, bundle: dict[str, float] | None = None,
                 strategy: str = "PACK", threads: int = 1,
                 driver: tuple[Any, Any] | None = None) -> None:
        if getattr(optim, "mini_batches", 1) != 1:
            from crl_bench.config.schema import ConfigError

            raise ConfigError(f"{role}.mini_batches={optim.mini_batches}: the Ray data-parallel "
                              f"learner takes one optimiser step per update; use --set "
                              f"{role}.mini_batches=1 or run without Ray.")
        self._ray = require_ray()
        self.n_ranks = n_ranks
        self.role = role
        self.cfg = optim
        self.driver = driver
        self.updates = 0
        self._rng = random.Random(seed)  # the same draws as RoleTrainer's max_samples_per_update
        # the same micro-batch order as RoleTrainer's (HFBackend shares prompt prefixes by default)
        self._by_prompt = bool(backend_spec.get("share_prompt_prefix", True))
        self.ranks, self.placement_group, self.pids = start_ranks(
            LearnerRankImpl, n_ranks, (backend_spec, role, optim, total_steps, seed, threads),
            bundle=bundle, strategy=strategy)

    def plan_chunks(self, samples: Sequence[Any]) -> tuple[list[list[list[Any]]], dict[str, float],
                                                            dict[str, float]]:
        """(chunks per rank, totals, metrics so far): the first half of ``RoleTrainer.update``."""
        return plan_update(samples, self.cfg, self._rng, by_prompt=self._by_prompt,
                           n_ranks=self.n_ranks)

    def update(self, samples: Sequence[Any], *, loss: str, loss_kwargs: dict[str, Any],
               agg: str = "token-mean", temperature: float = 1.0) -> dict[str, float]:
        """One optimiser step on ``samples`` across the ranks; the metrics of ``RoleTrainer.update``."""
        per_rank, totals, metrics = self.plan_chunks(samples)
        if not per_rank:
            metrics.update(loss=0.0, grad_norm=0.0, skipped=1.0)
            return metrics
        results = self._ray.get([
            rank.update_shard.remote(chunks, totals, loss=loss, loss_kwargs=loss_kwargs, agg=agg,
                                     temperature=temperature)
            for rank, chunks in zip(self.ranks, per_rank)])
        metrics.update(results[0])
        metrics.update(tokens=totals["tokens"], skipped=0.0)
        self.updates += 1
        if self.driver is not None:
            from crl_bench.training.precision import load_role_weights

            backend, lock = self.driver
            with lock:
                load_role_weights(backend, self.role, self.weights())
        return metrics

    def generate(self, message_lists: list[list[dict]], stop: Sequence[str] = (),
                 seed: int | None = None) -> list[Any]:
        raise NotImplementedError(f"the {self.role} role generates on the generation engines")

    def weights_ref(self) -> Any:
        """An object ref of rank 0's trainable weights (pass it to engines: no driver copy)."""
        return self.ranks[0].weights.remote()

    def weights(self) -> list[Any]:
        return self._ray.get(self.weights_ref())

    def load_weights(self, weights: Any) -> None:
        ref = weights if isinstance(weights, self._ray.ObjectRef) else self._ray.put(weights)
        self._ray.get([r.load_weights.remote(ref) for r in self.ranks])

    def state_dict(self) -> dict[str, Any]:
        return {"ray_learner": {"trainer": self._ray.get(self.ranks[0].state_dict.remote()),
                                "rng": self._rng.getstate()},
                "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; with a ``driver``, its weights (the checkpoint's, loaded
        into the driver's model first) into every rank."""
        inner = state["ray_learner"]
        ref = self._ray.put(inner["trainer"])
        self._ray.get([r.load_state_dict.remote(ref) for r in self.ranks])
        self._rng.setstate(inner["rng"])
        self.updates = int(state["updates"])
        if self.driver is not None:
            from crl_bench.training.precision import role_weights

            self.load_weights(role_weights(self.driver[0], self.role))

    def snapshot(self) -> dict[str, Any]:
        return {"weights": self.weights(), "state": self.state_dict()}

    def close(self) -> None:
        stop_ranks(self.ranks, self.placement_group)
