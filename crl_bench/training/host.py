"""Where a role runs: one interface, :class:`RoleHost`, for a role's model and trainer wherever
they live.

A run's parts (:mod:`crl_bench.run.parts`) hold a host per trained or generating role and call
only this interface: ``generate`` (the role's batched call on message lists), ``update`` (one
policy-gradient update, :mod:`crl_bench.training.update`), the trained weights out and in
(``weights`` / ``load_weights``), ``state_dict`` / ``load_state_dict`` (the optimiser, schedule
and counters), ``snapshot`` (weights and state in one cut, for a checkpoint) and ``close``.

The forms:

* :class:`LocalHost`: the role's backend and :class:`~crl_bench.training.role_trainer.
  RoleTrainer` in this process, behind the model lock (``extractor.runs`` inline / thread, the
  actor of a one-process run);
* :class:`~crl_bench.extractor.worker.ProcessHost`: a :class:`LocalHost` in a child process of
  its own, over a pipe (``extractor.runs=process`` on one machine);
* :class:`~crl_bench.distributed.extractor.RayHost`: a :class:`LocalHost` in a Ray actor
  (``extractor.runs=process`` on Ray);
* the learner forms on Ray, data parallel (:class:`~crl_bench.distributed.learner.
  DataParallelLearner`) or sharded (:class:`~crl_bench.distributed.sharded.ShardedRoleTrainer`),
  whose ranks run the same update loop.

``local`` says whether the host's weights are the driver's model's (a local host) or a copy
held elsewhere, which a checkpoint brings back first (``snapshot``) and a resume pushes out
(``load_weights`` of the driver's, then ``load_state_dict``).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Protocol, Sequence, runtime_checkable


@runtime_checkable
class RoleHost(Protocol):
    """One role's model and trainer, wherever they run (see the module docstring)."""

    role: str
    local: bool

    @property
    def updates(self) -> int:
        """Optimiser updates taken so far."""

    def generate(self, message_lists: list[list[dict]], stop: Sequence[str] = (),
                 seed: int | None = None) -> list[Any]:
        """The role's batched call on chat message lists (``seed``: the sampling seed)."""

    def update(self, samples: Sequence[Any], *, loss: str, loss_kwargs: dict[str, Any],
               agg: str = "token-mean", temperature: float = 1.0) -> dict[str, float]:
        """One update on ``samples`` (:meth:`RoleTrainer.update`'s metrics)."""

    def weights(self) -> list[Any]:
        """CPU copies of the role's trained weights."""

    def load_weights(self, weights: Sequence[Any]) -> None:
        """Set the role's trained weights (and the fp32 masters, where there are)."""

    def snapshot(self) -> dict[str, Any]:
        """``{"weights": ..., "state": ...}`` taken in one cut (no update between them)."""

    def state_dict(self) -> dict[str, Any]:
        """The trainer's checkpoint state (optimiser, schedule, counters)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""

    def close(self) -> None:
        """Release what the host holds (a process, an actor, ranks)."""


def backend_spec(backend: Any, model_cfg: Any, seed: int) -> dict[str, Any]:
    """Keyword arguments that rebuild ``backend`` in another process (a worker, a Ray actor, a
    learner rank): what the built backend holds (model, roles, LoRA shape, role layout), device
    and dtype as configured (resolved where the copy lands), the (hf) batch size, and the run
    seed (same initial weights)."""
    spec: dict[str, Any] = {"model_name": backend.model_name, "roles": tuple(backend.roles),
                            "lora": getattr(backend, "lora", None), "dtype": model_cfg.dtype,
                            "device": model_cfg.device, "seed": seed}
    if model_cfg.backend == "hf":
        spec["max_batch_size"] = model_cfg.max_batch_size
    spec.update({k: getattr(backend, k) for k in ("shared_adapter", "separate_bases")
                 if hasattr(backend, k)})
    return spec


class LocalHost:
    """A role in this process: its backend, sampling settings and trainer.

    Args:
        backend: the role's backend (the weights' owner).
        role: "actor" or "extractor".
        sampling: the role's :class:`~crl_bench.llm.types.SamplingParams` (for ``generate``).
        trainer: its :class:`~crl_bench.training.role_trainer.RoleTrainer` (None: frozen).
        lock: held around generation and every read or write of the weights and state (the
            backend is shared with other threads); default: the trainer's, or a new one.
        generator: the backend ``generate`` calls (default ``backend`` behind ``lock``).
    """

    local = True

    def __init__(self, backend: Any, role: str, *, sampling: Any = None, trainer: Any = None,
                 lock: Any = None, generator: Any = None) -> None:
        from crl_bench.llm.roles import LockedBackend

        self.backend = backend
        self.role = role
        self.sampling = sampling
        self.trainer = trainer
        self.lock = lock if lock is not None else (trainer.lock if trainer is not None
                                                   else threading.RLock())
        self.generator = generator if generator is not None else LockedBackend(backend, self.lock)

    @classmethod
    def from_spec(cls, kind: str, spec: dict[str, Any], role: str, sampling: Any,
                  optim: Any = None, *, total_steps: int = 1, seed: int = 0) -> "LocalHost":
        """Build the backend of ``kind`` from :func:`backend_spec`'s keyword arguments, and a
        trainer when ``optim`` is given (another process's copy of a role)."""
        from crl_bench.llm.backend import backend_class
        from crl_bench.training.role_trainer import RoleTrainer

        spec = dict(spec)
        backend = backend_class(kind)(spec.pop("model_name"), **spec)
        lock = threading.RLock()
        trainer = (RoleTrainer(backend, role, optim, total_steps=total_steps, lock=lock,
                               seed=seed) if optim is not None else None)
        # generation does not take the lock: weights and state are read between optimiser
        # steps, never waiting for a long generation
        return cls(backend, role, sampling=sampling, trainer=trainer, lock=lock,
                   generator=backend)

    @property
    def updates(self) -> int:
        return self.trainer.updates if self.trainer is not None else 0

    def generate(self, message_lists: list[list[dict]], stop: Sequence[str] = (),
                 seed: int | None = None) -> list[Any]:
        from crl_bench.llm.roles import extractor_generate

        if self.role != "extractor":
            raise NotImplementedError(f"the {self.role} role generates through the rollout "
                                      "engine, not through its host")
        sampling = self.sampling if seed is None else dataclasses.replace(self.sampling, seed=seed)
        return extractor_generate(self.generator, sampling, message_lists, tuple(stop))

    def _trainer(self) -> Any:
        if self.trainer is None:
            raise RuntimeError(f"the {self.role} role's host has no trainer (the role is frozen)")
        return self.trainer

    def update(self, samples: Sequence[Any], *, loss: str, loss_kwargs: dict[str, Any],
               agg: str = "token-mean", temperature: float = 1.0) -> dict[str, float]:
        return self._trainer().update(samples, loss=loss, loss_kwargs=loss_kwargs, agg=agg,
                                      temperature=temperature)

    def weights(self) -> list[Any]:
        from crl_bench.training.precision import role_weights

        with self.lock:
            return role_weights(self.backend, self.role)

    def load_weights(self, weights: Sequence[Any]) -> None:
        from crl_bench.training.precision import load_role_weights

        with self.lock:
            if self.trainer is not None:  # the masters too, where there are
                self.trainer.load_weights(weights)
            else:
                load_role_weights(self.backend, self.role, weights)

    def state_dict(self) -> dict[str, Any]:
        """The trainer's state as it stands (the caller holds :attr:`lock` for a cut between
        updates, as :meth:`snapshot` does)."""
        return self.trainer.state_dict() if self.trainer is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.trainer is not None and state:
            with self.lock:
                self.trainer.load_state_dict(state)

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"weights": self.weights(), "state": self.state_dict()}

    def close(self) -> None:
        """The backend belongs to whoever built it (the models part): nothing to release."""


RNG_KEY = "worker_rng"
"""Where a host in a process of its own keeps that process's RNG in its state."""


def process_rng_state() -> dict[str, Any]:
    """This process's RNG: torch's (CPU, and every CUDA device's once CUDA is initialised) and
    python's ``random``: what a generation without a sampling seed draws from."""
    import random

    import torch

    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_process_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`process_rng_state`."""
    import random

    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class ProcessHostServer:
    """A role's :class:`LocalHost` in a process of its own, the serving side of both forms:
    the extractor worker's child (:class:`~crl_bench.extractor.worker.ProcessHost`) and the Ray
    actor (:class:`~crl_bench.distributed.extractor.RayHost`). The process's RNG is seeded with
    ``rng_seed`` and travels in the host's state (:data:`RNG_KEY`), so that a resumed host
    samples what the uninterrupted one would.

    Args: the backend's kind and :func:`backend_spec`, the role, its sampling settings, its
    optimiser config (None: frozen), ``total_steps`` and ``trainer_seed`` as for
    ``RoleTrainer``, the process's ``rng_seed`` and torch ``threads``."""

    def __init__(self, backend_kind: str, spec: dict[str, Any], role: str, sampling: Any,
                 optim: Any = None, *, total_steps: int = 1, trainer_seed: int = 0,
                 rng_seed: int = 0, threads: int = 1) -> None:
        import random

        import torch

        torch.set_num_threads(max(1, int(threads)))
        random.seed(rng_seed)
        torch.manual_seed(rng_seed)
        self.host = LocalHost.from_spec(backend_kind, spec, role, sampling, optim,
                                        total_steps=total_steps, seed=trainer_seed)

    def generate(self, message_lists: list[list[dict]], stop: tuple[str, ...],
                 seed: int | None) -> list[Any]:
        return self.host.generate(message_lists, stop, seed)

    def update(self, samples: list[Any], **kwargs: Any) -> dict[str, float]:
        return self.host.update(samples, **kwargs)

    def updates(self) -> int:
        return self.host.updates

    def weights(self) -> list[Any]:
        return self.host.weights()

    def load_weights(self, weights: list[Any]) -> None:
        self.host.load_weights(weights)

    def state_dict(self) -> dict[str, Any]:
        """The trainer's state between updates, and the process's RNG."""
        with self.host.lock:
            state = self.host.state_dict()
            state[RNG_KEY] = process_rng_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        rng = state.pop(RNG_KEY, None)
        self.host.load_state_dict(state)
        if rng is not None:
            set_process_rng_state(rng)

    def snapshot(self) -> dict[str, Any]:
        with self.host.lock:
            return {"weights": self.weights(), "state": self.state_dict()}
