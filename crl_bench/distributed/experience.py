"""The experience service: the :class:`~crl_bench.experience.manager.ExperienceManager` (bank +
index) inside one Ray actor that every other part calls.

The actor runs one call at a time (Ray's default ``max_concurrency=1``), so it is the bank's one
writer by construction: adds, updates and merges never interleave, and a retrieval sees either
all of a write or none of it. Retrievals stay batched: the rollout asks for all of a step's
queries in one call, as it does in one process.

:class:`RemoteManager` is the driver-side (or any actor's) face: the manager's methods
(``retrieve``, ``apply_operations``, ``record_outcomes``, ``mark_trained``, ``delete``, ``get``,
``replace_if_unchanged``, ``count_merge``, ``stats``) and ``manager.bank`` (``backup``,
``close``, ``size`` and the other bank methods) become actor calls. ``read_lock()`` is a no-op
context on this side: a read through the service is one call, atomic by itself, and the merge
walk's write goes through ``replace_if_unchanged``, which checks inside the service that the
entries it read are unchanged.

The service has ``max_restarts``: a restarted service reopens the same SQLite bank file (every
write is committed before its call returns), so a crash loses no committed entry.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from crl_bench.distributed import remote_class, require_ray


class ExperienceServiceImpl:
    """The actor's body: builds the bank, embedder and manager exactly as
    ``RunContext.build_experience`` does (same arguments)."""

    def __init__(self, bank_path: str, embedder: str, capacity: int, retrieval: Any,
                 step_clock: bool = False, embed_max_tokens: int = 256) -> None:
        from crl_bench.experience.bank import ExperienceBank
        from crl_bench.experience.embedder import load_embedder
        from crl_bench.experience.manager import ExperienceManager, RetrievalConfig

        emb = load_embedder(embedder, max_tokens=embed_max_tokens)
        bank = ExperienceBank(bank_path, dim=emb.dim, capacity=capacity, embedder_name=emb.name)
        if isinstance(retrieval, dict):
            retrieval = RetrievalConfig(**retrieval)
        self.step = 0
        kwargs: dict[str, Any] = {}
        if step_clock:  # recency on the run's logical clock: the driver sends the step
            from crl_bench.experience.manager import step_clock as make_clock

            # the origin is asked at every reading: a bank restored from a checkpoint (a bank
            # call swaps the file under the same object) brings its own creation time
            kwargs["clock"] = make_clock(lambda: self.step, retrieval.step_s,
                                         origin=lambda: float(bank.meta.get("created_at", 0.0)))
        self.manager = ExperienceManager(bank, emb, retrieval, **kwargs)
        self.calls = 0

    def set_step(self, step: int) -> None:
        self.step = int(step)

    def pid(self) -> int:
        return os.getpid()

    def call(self, method: str, args: tuple, kwargs: dict) -> Any:
        self.calls += 1
        return getattr(self.manager, method)(*args, **kwargs)

    def bank_call(self, method: str, args: tuple, kwargs: dict) -> Any:
        self.calls += 1
        attr = getattr(self.manager.bank, method)
        return attr(*args, **kwargs) if callable(attr) else attr


def experience_service_class() -> Any:
    return remote_class(ExperienceServiceImpl)


class _RemoteBank:
    def __init__(self, actor: Any) -> None:
        self._actor = actor
        self._ray = require_ray()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._ray.get(self._actor.bank_call.remote(name, args, kwargs))
        return call

    def __len__(self) -> int:
        return int(self._ray.get(self._actor.bank_call.remote("__len__", (), {})))


class RemoteManager:
    """An ExperienceManager living in the experience service (see the module docstring).

    Args:
        actor: the service's actor handle (pass it to other actors: they build their own
            ``RemoteManager(actor)``).
    """

    _METHODS = frozenset({"retrieve", "apply_operations", "record_outcomes", "mark_trained",
                          "delete", "get", "replace_if_unchanged", "count_merge", "stats"})

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self._ray = require_ray()
        self.bank = _RemoteBank(actor)

    @classmethod
    def start(cls, bank_path: str, embedder: str, capacity: int, retrieval: Any, *,
              step_clock: bool = False, embed_max_tokens: int = 256,
              num_cpus: float = 0.0, max_restarts: int = 3, name: str | None = None,
              here: bool = True) -> "RemoteManager":
        """Start the service. ``here``: on this process's node (the bank file and checkpoint
        backups are paths of this node's file system)."""
        ray = require_ray()
        opts: dict[str, Any] = {"num_cpus": num_cpus, "max_restarts": max_restarts,
                                "max_task_retries": 0}
        if here:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                ray.get_runtime_context().get_node_id(), soft=False)
        if name:
            opts["name"] = name
        actor = experience_service_class().options(**opts).remote(str(bank_path), embedder,
                                                                  capacity, retrieval, step_clock,
                                                                  embed_max_tokens)
        require_ray().get(actor.pid.remote())
        return cls(actor)

    def __getattr__(self, name: str) -> Any:
        if name not in self._METHODS:
            raise AttributeError(f"RemoteManager has no {name!r} (the service forwards: "
                                 f"{', '.join(sorted(self._METHODS))})")

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._ray.get(self.actor.call.remote(name, args, kwargs))
        return call

    def set_step(self, step: int) -> None:
        """The run's actor step (the service's logical clock, when it has one)."""
        self._ray.get(self.actor.set_step.remote(step))

    @contextlib.contextmanager
    def read_lock(self) -> Any:
        yield

    def close(self) -> None:
        try:
            self.bank.close()
        except Exception:  # already closed (RunContext.close closes the bank first)
            pass
        self._ray.kill(self.actor)
