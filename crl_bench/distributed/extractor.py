"""The extractor track as its own Ray actor, so the actor loop never shares a process (or a
model lock) with it.

:class:`ExtractorActorImpl` holds the extractor's model (a backend built from the same keyword
arguments as the driver's, so the same initial weights), its :class:`RoleTrainer` and the
:class:`~crl_bench.extractor.track.ExtractorTrack` (in its background thread, inside the actor),
and reaches the bank through the experience service (:class:`RemoteManager`). The actor is
threaded (``max_concurrency``) so that ``submit``, ``backlog`` and ``stats`` answer while the
track works.

:class:`RemoteExtractorTrack` stands where ``ctx.extractor`` stands: ``submit``,
``add_ask_samples``, ``credit``, ``record_usage``, ``wait_writes``, ``wait_idle`` (any public
method of the track), ``backlog``, ``stats``,
``state`` / ``load_state`` and ``close`` become actor calls. ``state(also=...)`` keeps the
single-process guarantee (the track's state and the bank backup agree): the actor takes the
track's lock in a holder thread and snapshots the state, the driver runs ``also()`` (the bank
backup, through the experience service) while the lock is held, then the actor lets go.
Metrics the track logs are fetched with :meth:`RemoteExtractorTrack.take_metrics`.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

from crl_bench.distributed import remote_class, require_ray


class ExtractorActorImpl:
    """See the module docstring. ``track_kwargs``: ExtractorTrack's keyword arguments other than
    manager / generate / trainer / cfg / log (``temperature``, ``merge_every``, ...)."""

    def __init__(self, service: Any, backend_kind: str, spec: dict[str, Any], cfg: Any,
                 sampling: Any, track_kwargs: dict[str, Any], *, train: bool, total_steps: int,
                 seed: int, threads: int = 1) -> None:
        import torch

        from crl_bench.distributed.experience import RemoteManager
        from crl_bench.distributed.generation import make_backend
        from crl_bench.extractor.track import ExtractorTrack
        from crl_bench.training.role_trainer import RoleTrainer

        torch.set_num_threads(threads)
        self.backend = make_backend(backend_kind, spec)
        self.lock = threading.RLock()
        self.sampling = sampling
        self.trainer = (RoleTrainer(self.backend, "extractor", cfg, total_steps=total_steps,
                                    lock=self.lock, seed=seed) if train else None)
        self.manager = RemoteManager(service)
        self._metrics: list[dict[str, Any]] = []
        self._mlock = threading.Lock()
        self.track = ExtractorTrack(self.manager, self.generate, self.trainer, cfg,
                                    log=self._log, **track_kwargs)
        self._hold_release: threading.Event | None = None

    def pid(self) -> int:
        return os.getpid()

    def generate(self, message_lists: list[list[dict]], stop: tuple[str, ...] = ()) -> list[Any]:
        """The extractor role on this actor's model."""
        from crl_bench.run.context import extractor_generate

        with self.lock:
            return extractor_generate(self.backend, self.sampling, message_lists, stop)

    def _log(self, metrics: dict[str, Any]) -> None:
        with self._mlock:
            self._metrics.append(metrics)

    def take_metrics(self) -> list[dict[str, Any]]:
        with self._mlock:
            out, self._metrics = self._metrics, []
        return out

    def call(self, method: str, args: tuple, kwargs: dict) -> Any:
        attr = getattr(self.track, method)
        if not callable(attr):
            raise TypeError(f"ExtractorTrack.{method} is not a method: through "
                            f"RemoteExtractorTrack it reads as a bound method (always true); "
                            f"read it through one of the track's methods (e.g. merge_period())")
        return attr(*args, **kwargs)

    def backlog(self) -> int:
        return self.track.backlog

    def stats(self) -> dict[str, Any]:
        return dict(self.track.stats)

    def updates(self) -> int:
        return self.trainer.updates if self.trainer is not None else 0

    def weights(self) -> list[Any]:
        from crl_bench.training.precision import role_weights

        with self.lock:
            return role_weights(self.backend, "extractor")

    def load_weights(self, weights: list[Any]) -> None:
        from crl_bench.training.precision import load_role_weights

        with self.lock:
            load_role_weights(self.backend, "extractor", weights)

    def trainer_state(self) -> dict[str, Any] | None:
        return self.trainer.state_dict() if self.trainer is not None else None

    def load_trainer_state(self, state: dict[str, Any]) -> None:
        if self.trainer is not None and state is not None:
            self.trainer.load_state_dict(state)

    # -- state under the track's lock, across processes ----------------------------------------
    def hold_state(self) -> dict[str, Any]:
        """Take the track's lock in a holder thread, return the state snapshot; the lock stays
        held until :meth:`release_state`."""
        ready = threading.Event()
        release = threading.Event()
        box: dict[str, Any] = {}

        def holder() -> None:
            with self.track._state_lock:
                box["state"] = self.track.state()
                ready.set()
                release.wait(timeout=600)

        self._hold_release = release
        threading.Thread(target=holder, name="extractor-state-hold", daemon=True).start()
        ready.wait()
        return box["state"]

    def release_state(self) -> None:
        if self._hold_release is not None:
            self._hold_release.set()
            self._hold_release = None

    def close(self) -> None:
        self.track.close()


def extractor_actor_class() -> Any:
    return remote_class(ExtractorActorImpl)


class RemoteExtractorTrack:
    """The driver's face of the extractor actor (see the module docstring)."""

    # every other public method of ExtractorTrack (submit, add_ask_samples, credit,
    # record_usage, wait_writes, wait_idle, raise_if_failed, update_pending, merge_period,
    # count, ...) becomes an actor call; a data attribute (merge_every, training) does NOT read
    # as its value here (it is a bound method, always true): read it through a method

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self._ray = require_ray()

    @classmethod
    def start(cls, service: Any, backend_kind: str, spec: dict[str, Any], cfg: Any, sampling: Any,
              track_kwargs: dict[str, Any], *, train: bool, total_steps: int, seed: int,
              threads: int = 1, options: dict[str, Any] | None = None) -> "RemoteExtractorTrack":
        actor = extractor_actor_class().options(max_concurrency=4, **(options or {})).remote(
            service, backend_kind, spec, cfg, sampling, track_kwargs, train=train,
            total_steps=total_steps, seed=seed, threads=threads)
        require_ray().get(actor.pid.remote())
        return cls(actor)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._ray.get(self.actor.call.remote(name, args, kwargs))
        return call

    @property
    def backlog(self) -> int:
        return int(self._ray.get(self.actor.backlog.remote()))

    @property
    def stats(self) -> dict[str, Any]:
        return self._ray.get(self.actor.stats.remote())

    def take_metrics(self) -> list[dict[str, Any]]:
        return self._ray.get(self.actor.take_metrics.remote())

    def updates(self) -> int:
        return int(self._ray.get(self.actor.updates.remote()))

    def weights(self) -> list[Any]:
        return self._ray.get(self.actor.weights.remote())

    def state(self, also: Callable[[], Any] | None = None) -> dict[str, Any]:
        state = self._ray.get(self.actor.hold_state.remote())
        try:
            if also is not None:
                also()
        finally:
            self._ray.get(self.actor.release_state.remote())
        return state

    def load_state(self, state: dict[str, Any], trajectory_cls: Any) -> list[tuple[int, list[Any]]]:
        # trajectories travel as JSON and are rebuilt here, as in one process
        self._ray.get(self.actor.call.remote("load_state", (state, trajectory_cls), {}))
        return [(st, [trajectory_cls.from_json(t) for t in trs])
                for st, trs in state.get("pending", [])]

    def close(self) -> None:
        try:
            self._ray.get(self.actor.close.remote(), timeout=600)
        finally:
            self._ray.kill(self.actor)
