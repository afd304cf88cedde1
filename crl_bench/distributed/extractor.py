"""The Ray form of a role host: a :class:`~crl_bench.training.host.LocalHost` in a Ray actor
(``extractor.runs=process`` on Ray, as :class:`~crl_bench.extractor.worker.ProcessHost` is on
one machine).

:class:`HostActorImpl` builds the role's backend from the driver's keyword arguments
(:func:`~crl_bench.training.host.backend_spec`: the same initial weights; the driver's weights
are pushed in after the start all the same) and its trainer, and serves the host's calls. The
actor is threaded (``max_concurrency``) so that a checkpoint's ``snapshot`` does not wait for a
long generation (only for an update in progress, as in the process form); generation and
updates take turns, one at a time. :class:`RayHost` is the driver's face of it, a
:class:`~crl_bench.training.host.RoleHost`; the track that calls it (its thread, the bank writes
through the experience service, the credit, the checkpoints) stays on the driver, as in one
process.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Sequence

from crl_bench.distributed import remote_class, require_ray
from crl_bench.training.host import ProcessHostServer


class HostActorImpl(ProcessHostServer):
    """A role's :class:`~crl_bench.training.host.ProcessHostServer` in a Ray actor (plain
    class; :func:`~crl_bench.distributed.remote_class` makes the actor): the process form's
    server, its RNG in its state included. Arguments as
    :class:`~crl_bench.extractor.worker.ProcessHost`'s, with ``role``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._turns = threading.Lock()  # generation and updates, one at a time

    def generate(self, message_lists: list[list[dict]], stop: tuple[str, ...],
                 seed: int | None) -> list[Any]:
        with self._turns:
            return super().generate(message_lists, stop, seed)

    def update(self, samples: list[Any], kwargs: dict[str, Any]) -> dict[str, float]:
        with self._turns:
            return super().update(samples, **kwargs)

    def describe(self) -> dict[str, Any]:
        """Where this host runs: its process, node and GPUs (read back by the run's
        topology)."""
        import ray

        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(),
                "role": self.host.role, "trains": self.host.trainer is not None,
                "gpus": [str(g) for g in ray.get_gpu_ids()]}


class RayHost:
    """A role's host in a Ray actor (see the module docstring); the
    :class:`~crl_bench.training.host.RoleHost` the driver's parts hold."""

    local = False  # its weights are a copy: a checkpoint brings them back first

    def __init__(self, actor: Any, role: str) -> None:
        from crl_bench.llm.roles import WaitTimingLock

        self.actor = actor
        self.role = role
        self._ray = require_ray()
        self.lock = WaitTimingLock()
        """Held around generation and updates; the time a thread waited while another thread's
        call ran is kept per thread name (:meth:`take_wait`), as in the process form."""

    @classmethod
    def start(cls, backend_kind: str, spec: dict[str, Any], role: str, sampling: Any,
              optim: Any = None, *, total_steps: int = 1, trainer_seed: int = 0,
              rng_seed: int = 0, threads: int = 1,
              options: dict[str, Any] | None = None) -> "RayHost":
        actor = remote_class(HostActorImpl).options(max_concurrency=4, **(options or {})).remote(
            backend_kind, spec, role, sampling, optim, total_steps=total_steps,
            trainer_seed=trainer_seed, rng_seed=rng_seed, threads=threads)
        host = cls(actor, role)
        host.describe()  # the model is built (or its error raised) before the run goes on
        return host

    def _get(self, ref: Any) -> Any:
        return self._ray.get(ref)

    @property
    def updates(self) -> int:
        return int(self._get(self.actor.updates.remote()))

    def generate(self, message_lists: list[list[dict]], stop: Sequence[str] = (),
                 seed: int | None = None) -> list[Any]:
        with self.lock:
            return self._get(self.actor.generate.remote(message_lists, tuple(stop), seed))

    def update(self, samples: Sequence[Any], **kwargs: Any) -> dict[str, float]:
        with self.lock:
            return self._get(self.actor.update.remote(list(samples), kwargs))

    def weights(self) -> list[Any]:
        return self._get(self.actor.weights.remote())

    def load_weights(self, weights: Sequence[Any]) -> None:
        self._get(self.actor.load_weights.remote([w.detach().cpu() for w in weights]))

    def state_dict(self) -> dict[str, Any]:
        return self._get(self.actor.state_dict.remote())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._get(self.actor.load_state_dict.remote(state))

    def snapshot(self) -> dict[str, Any]:
        return self._get(self.actor.snapshot.remote())

    def describe(self) -> dict[str, Any]:
        return self._get(self.actor.describe.remote())

    def take_wait(self, name: str) -> float:
        return self.lock.take_wait(name)

    def close(self) -> None:
        self._ray.kill(self.actor)
