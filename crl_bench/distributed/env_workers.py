"""Env workers: Ray actors that hold pools of text envs, and the driver side that plays them.

* :class:`EnvWorker` (a Ray actor class, made by :func:`env_worker_class`): holds envs by slot
  number (``gymnasium.make`` of ``crl/`` ids, made in the worker process), resets them and steps
  batches of ``(slot, action)``. Env exceptions are returned per item, so one bad action never
  fails a batch.
* :class:`RemoteEnvPool` (driver): makes the workers (optionally spread with a placement group),
  hands out :class:`RemoteEnv` proxies, steps many envs at once (one call per worker, all
  workers in parallel) and keeps, per env, what is needed to rebuild it: id, kwargs, reset seed
  and options, the actions so far and a digest of every observation.
* **Faults**: a worker that dies (killed, OOM, node lost) makes its calls fail with a Ray actor
  error; every env that lived on it is rebuilt on another live worker by replaying its episode
  (make, reset with the same seed and options, the recorded actions in order); the replayed
  observations are checked against the recorded digests (a non-deterministic env raises
  :class:`EnvReplayError` instead of silently diverging); then the interrupted step is issued
  again. An action is recorded only once its result has come back, so nothing is lost or done
  twice. Workers are made with ``max_restarts`` so that Ray brings a dead one back; it rejoins
  the pool after :meth:`RemoteEnvPool.revive` sees it answer.
* :class:`RemoteEnv`: a gymnasium-like proxy the rollout engine plays as if it were local.
* :class:`BatchedStepRolloutEngine`: the rollout engine with the turn's env steps issued to all
  workers at once, right after the batched generation (resets likewise), instead of one
  round-trip per env. It reads each completion with the engine's own parser to know the actions
  in advance, then the engine's own code consumes the results in its usual order, so
  trajectories are the same as with local envs (tested).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Sequence

from crl_bench.distributed import remote_class, require_ray


class EnvReplayError(RuntimeError):
    """Replaying an episode on another worker did not reproduce its recorded observations."""


class EnvWorkerError(RuntimeError):
    """No live env worker is left to replay episodes on."""


def _digest(obs: Any) -> str:
    return hashlib.sha1(repr(obs).encode("utf-8", "surrogatepass")).hexdigest()[:16]


class _Failure:
    """An exception raised by an env inside the worker (returned, not raised, per item)."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class EnvWorkerImpl:
    """The worker's body (plain class; :func:`env_worker_class` makes it a Ray actor).

    Args:
        index: the worker's number (logs).
        imports: modules to import before making envs (plugins that register ``crl/`` ids).
        step_delay_s: sleep before each env step (fault-injection tests and benchmarks only).
    """

    def __init__(self, index: int = 0, imports: Sequence[str] = (), step_delay_s: float = 0.0) -> None:
        import importlib

        import crl_bench  # noqa: F401  registers the crl/ envs

        for name in imports:
            importlib.import_module(name)
        self.index = index
        self.step_delay_s = step_delay_s
        self.envs: dict[int, Any] = {}
        self.steps = 0

    def pid(self) -> int:
        return os.getpid()

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def make(self, slot: int, env_id: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        import gymnasium

        old = self.envs.pop(slot, None)
        if old is not None:
            old.close()
        env = gymnasium.make(env_id, **kwargs)
        self.envs[slot] = env
        unwrapped = env.unwrapped
        return {"spec_id": env.spec.id if env.spec is not None else env_id,
                "family": str(getattr(unwrapped, "family", "text")),
                "max_steps": getattr(unwrapped, "max_steps", None)}

    def make_many(self, items: list[tuple[int, str, dict[str, Any]]]) -> list[dict[str, Any]]:
        return [self.make(slot, env_id, kwargs) for slot, env_id, kwargs in items]

    def reset(self, items: list[tuple[int, int | None, dict | None]]) -> list[Any]:
        out: list[Any] = []
        for slot, seed, options in items:
            try:
                out.append(self.envs[slot].reset(seed=seed, options=options))
            except Exception as exc:  # returned per item, as a local env would raise it
                out.append(_Failure(exc))
        return out

    def step(self, items: list[tuple[int, Any]]) -> list[Any]:
        out: list[Any] = []
        for slot, action in items:
            if self.step_delay_s:
                time.sleep(self.step_delay_s)
            try:
                out.append(self.envs[slot].step(action))
            except Exception as exc:
                out.append(_Failure(exc))
            self.steps += 1
        return out

    def replay(self, slot: int, env_id: str, kwargs: dict[str, Any], seed: int | None,
               options: dict | None, actions: list[Any]) -> list[str]:
        """Make the env, reset it and step ``actions``; the digests of the reset observation and
        of each step's observation (an env exception digests as ``"!"``)."""
        self.make(slot, env_id, kwargs)
        env = self.envs[slot]
        digests: list[str] = []
        try:
            obs, _ = env.reset(seed=seed, options=options)
            digests.append(_digest(obs))
        except Exception:
            return ["!"]
        for a in actions:
            try:
                digests.append(_digest(env.step(a)[0]))
            except Exception:
                digests.append("!")
        return digests

    def call(self, slot: int, method: str, *args: Any) -> Any:
        """``env.unwrapped.METHOD(*args)`` (e.g. ``walkthrough`` for scripted benchmarks)."""
        return getattr(self.envs[slot].unwrapped, method)(*args)

    def close_slot(self, slot: int) -> None:
        env = self.envs.pop(slot, None)
        if env is not None:
            env.close()

    def stats(self) -> dict[str, Any]:
        return {"index": self.index, "pid": os.getpid(), "envs": len(self.envs), "steps": self.steps}

    def close(self) -> None:
        for slot in list(self.envs):
            self.close_slot(slot)


def env_worker_class() -> Any:
    """The Ray actor class of :class:`EnvWorkerImpl` (made once, after ``import ray``)."""
    return remote_class(EnvWorkerImpl)


@dataclass
class _Slot:
    env_id: str
    kwargs: dict[str, Any]
    worker: int
    info: dict[str, Any]
    seed: int | None = None
    options: dict | None = None
    reset_done: bool = False
    actions: list[Any] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    closed: bool = False


class RemoteEnv:
    """A text env living in an env worker; plays like a local one (``reset``, ``step``,
    ``close``, ``spec.id``, ``unwrapped.family`` / ``max_steps``)."""

    def __init__(self, pool: "RemoteEnvPool", slot: int, info: dict[str, Any]) -> None:
        self.pool = pool
        self.slot = slot
        self.spec = SimpleNamespace(id=info["spec_id"])
        self.unwrapped = SimpleNamespace(family=info["family"], max_steps=info["max_steps"])

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        return self.pool.reset_one(self.slot, seed, options)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        return self.pool.step_one(self.slot, action)

    def call(self, method: str, *args: Any) -> Any:
        return self.pool.call(self.slot, method, *args)

    def close(self) -> None:
        self.pool.close_slot(self.slot)

    def __repr__(self) -> str:
        return f"RemoteEnv({self.spec.id!r}, slot={self.slot}, worker={self.pool.slots[self.slot].worker})"


class RemoteEnvPool:
    """Env workers and the envs on them. See the module docstring.

    Args:
        n_workers: number of worker actors.
        worker_options: Ray options of each worker (``{"num_cpus": 1}``); see
            :meth:`~crl_bench.distributed.plan.ResourcePlan.env_worker_options`.
        spread: place the workers with a SPREAD placement group (one bundle each), so that
            they land on different nodes when the cluster has several.
        max_restarts: Ray restarts a dead worker this many times (its envs are replayed
            elsewhere all the same; a restarted worker rejoins after :meth:`revive`).
        imports: modules each worker imports before making envs (plugins).
        step_delay_s: sleep before each step in the workers (fault tests and benchmarks).
    """

    def __init__(self, n_workers: int, *, worker_options: dict[str, Any] | None = None,
                 spread: bool = False, max_restarts: int = 1, imports: Sequence[str] = (),
                 step_delay_s: float = 0.0) -> None:
        ray = require_ray()
        if n_workers < 1:
            raise ValueError(f"n_workers must be >= 1, got {n_workers}")
        self._ray = ray
        opts = dict(worker_options or {"num_cpus": 1})
        self.placement_group = None
        cls = env_worker_class()
        handles = []
        if spread:
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            bundle = {"CPU": float(opts.get("num_cpus", 1))}
            self.placement_group = placement_group([bundle] * n_workers, strategy="SPREAD")
            ray.get(self.placement_group.ready())
            for i in range(n_workers):
                strategy = PlacementGroupSchedulingStrategy(self.placement_group,
                                                            placement_group_bundle_index=i)
                handles.append(cls.options(**opts, max_restarts=max_restarts, max_task_retries=0,
                                           scheduling_strategy=strategy)
                               .remote(i, tuple(imports), step_delay_s))
        else:
            handles = [cls.options(**opts, max_restarts=max_restarts, max_task_retries=0)
                       .remote(i, tuple(imports), step_delay_s) for i in range(n_workers)]
        self.workers: list[Any] = handles
        self.alive: list[bool] = [True] * n_workers
        self.slots: dict[int, _Slot] = {}
        self._next_slot = 0
        self._lock = threading.RLock()
        self._prefetched: dict[int, tuple[str, Any, Any]] = {}
        self.inflight: dict[int, float] = {}
        """worker index -> time its current call was issued (tests kill a worker mid-step)."""
        self.replays = 0
        """Episodes replayed on another worker after their worker died."""
        self.worker_failures = 0
        ray.get([w.pid.remote() for w in handles])  # all up before anything is placed on them

    # -- workers ---------------------------------------------------------------------------------
    def pids(self) -> list[int]:
        return self._ray.get([w.pid.remote() for w in self.workers])

    def nodes(self) -> list[str]:
        return self._ray.get([w.node.remote() for w in self.workers])

    def live_workers(self) -> list[int]:
        return [i for i, a in enumerate(self.alive) if a]

    def revive(self, timeout_s: float = 5.0) -> list[int]:
        """Let restarted workers (Ray's ``max_restarts``) rejoin; returns those that did."""
        back = []
        for i, a in enumerate(self.alive):
            if a:
                continue
            try:
                self._ray.get(self.workers[i].pid.remote(), timeout=timeout_s)
            except Exception:
                continue
            self.alive[i] = True
            back.append(i)
        return back

    def _pick_worker(self, exclude: set[int] = frozenset()) -> int:
        live = [i for i in self.live_workers() if i not in exclude]
        if not live:
            self.revive()
            live = [i for i in self.live_workers() if i not in exclude] or self.live_workers()
        if not live:
            raise EnvWorkerError("every env worker is dead and none came back")
        load = {i: 0 for i in live}
        for s in self.slots.values():
            if not s.closed and s.worker in load:
                load[s.worker] += 1
        return min(live, key=lambda i: (load[i], i))

    # -- envs --------------------------------------------------------------------------------------
    def make(self, env_id: str, **kwargs: Any) -> RemoteEnv:
        """A new env on the least-loaded live worker."""
        return self.make_many(env_id, 1, **kwargs)[0]

    def make_many(self, env_id: str, n: int, **kwargs: Any) -> list[RemoteEnv]:
        with self._lock:
            slots = []
            for _ in range(n):
                slot = self._next_slot
                self._next_slot += 1
                self.slots[slot] = _Slot(env_id, dict(kwargs), self._pick_worker(), {})
                slots.append(slot)
            self._call_grouped([(slot, None) for slot in slots], "make")
            return [RemoteEnv(self, slot, self.slots[slot].info) for slot in slots]

    def close_slot(self, slot: int) -> None:
        s = self.slots.get(slot)
        if s is None or s.closed:
            return
        s.closed = True
        if self.alive[s.worker]:
            try:
                self._ray.get(self.workers[s.worker].close_slot.remote(slot))
            except Exception:
                pass

    def call(self, slot: int, method: str, *args: Any) -> Any:
        s = self.slots[slot]
        return self._ray.get(self.workers[s.worker].call.remote(slot, method, *args))

    # -- reset and step ------------------------------------------------------------------------
    def reset_many(self, items: list[tuple[int, int | None, dict | None]]) -> list[Any]:
        """Reset ``(slot, seed, options)`` envs, all workers in parallel."""
        return self._call_grouped([(slot, (seed, options)) for slot, seed, options in items], "reset")

    def step_many(self, items: list[tuple[int, Any]]) -> list[Any]:
        """Step ``(slot, action)`` envs, one call per worker, all workers in parallel; results in
        the order of ``items`` (an env exception comes back as a :class:`_Failure`)."""
        return self._call_grouped(list(items), "step")

    def reset_one(self, slot: int, seed: int | None, options: dict | None) -> tuple[str, dict]:
        hit = self._take_prefetched(slot, "reset", (seed, options))
        res = hit if hit is not None else self.reset_many([(slot, seed, options)])[0]
        return self._unwrap(res)

    def step_one(self, slot: int, action: Any) -> tuple[Any, float, bool, bool, dict]:
        hit = self._take_prefetched(slot, "step", action)
        res = hit if hit is not None else self.step_many([(slot, action)])[0]
        return self._unwrap(res)

    def prefetch(self, kind: str, items: list[tuple[int, Any]]) -> None:
        """Issue ``kind`` ("step": ``(slot, action)``; "reset": ``(slot, (seed, options))``) now;
        the matching :meth:`step_one` / :meth:`reset_one` takes the result without a call."""
        if not items:
            return
        results = self._call_grouped(items, kind)
        with self._lock:
            for (slot, arg), res in zip(items, results):
                self._prefetched[slot] = (kind, arg, res)

    def _take_prefetched(self, slot: int, kind: str, arg: Any) -> Any:
        with self._lock:
            hit = self._prefetched.get(slot)
            if hit is not None and hit[0] == kind and hit[1] == arg:
                del self._prefetched[slot]
                return hit[2]
            if hit is not None:  # stale: the caller did something else than was prefetched
                del self._prefetched[slot]
                if hit[0] == "step":
                    self._rewind(slot)
            return None

    def _rewind(self, slot: int) -> None:
        """Undo a prefetched step nobody asked for: replay the episode without it."""
        s = self.slots[slot]
        s.actions.pop()
        s.digests.pop()
        self._move_slots_of([slot], exclude=set())

    @staticmethod
    def _unwrap(res: Any) -> Any:
        if isinstance(res, _Failure):
            raise res.exc
        return res

    def _call_grouped(self, items: list[tuple[int, Any]], kind: str) -> list[Any]:
        """Run ``items`` grouped by worker; a dead worker's envs are replayed elsewhere and their
        items re-issued. Records each result in the slots' logs."""
        results: list[Any] = [None] * len(items)
        pending = list(range(len(items)))
        with self._lock:
            while pending:
                by_worker: dict[int, list[int]] = {}
                for k in pending:
                    by_worker.setdefault(self.slots[items[k][0]].worker, []).append(k)
                refs = {}
                for w, ks in by_worker.items():
                    refs[w] = self._issue(w, kind, [items[k] for k in ks])
                    self.inflight[w] = time.monotonic()
                failed: list[int] = []
                for w, ks in by_worker.items():
                    try:
                        out = self._ray.get(refs[w])
                    except (self._ray.exceptions.RayActorError,
                            self._ray.exceptions.ActorUnavailableError):
                        self._worker_died(w)
                        failed.append(w)
                        continue
                    finally:
                        self.inflight.pop(w, None)
                    for k, res in zip(ks, out):
                        self._record(items[k], kind, res)
                        results[k] = res
                pending = [k for w in failed for k in by_worker[w]]
                if failed:
                    self._move_slots(failed)
        return results

    def _issue(self, w: int, kind: str, items: list[tuple[int, Any]]) -> Any:
        worker = self.workers[w]
        if kind == "step":
            return worker.step.remote(items)
        if kind == "reset":
            return worker.reset.remote([(slot, seed, options) for slot, (seed, options) in items])
        if kind == "make":
            return worker.make_many.remote([(slot, self.slots[slot].env_id, self.slots[slot].kwargs)
                                            for slot, _ in items])
        raise ValueError(kind)

    def _record(self, item: tuple[int, Any], kind: str, res: Any) -> None:
        slot, arg = item
        s = self.slots[slot]
        if kind == "make":
            s.info = res
        elif kind == "reset":
            s.seed, s.options = arg
            s.reset_done = True
            s.actions = []
            s.digests = ["!" if isinstance(res, _Failure) else _digest(res[0])]
        elif kind == "step":
            s.actions.append(arg)
            s.digests.append("!" if isinstance(res, _Failure) else _digest(res[0]))

    def _worker_died(self, w: int) -> None:
        self.alive[w] = False
        self.worker_failures += 1

    def _move_slots(self, dead: list[int]) -> None:
        """Rebuild every open env of the dead workers on live ones, replaying its episode."""
        dead_set = set(dead)
        slots = [slot for slot, s in sorted(self.slots.items())
                 if not s.closed and s.worker in dead_set]
        self._move_slots_of(slots, exclude=dead_set)
        self.replays += len(slots)

    def _move_slots_of(self, slots: list[int], exclude: set[int]) -> None:
        """Rebuild ``slots`` on live workers outside ``exclude`` (their own worker when the set
        is empty) by replaying their episodes, checking the observation digests."""
        dead_set = set(exclude)
        for slot in slots:
            s = self.slots[slot]
            while True:
                target = self._pick_worker(exclude=dead_set) if dead_set else s.worker
                s.worker = target
                try:
                    if s.reset_done:
                        digests = self._ray.get(self.workers[target].replay.remote(
                            slot, s.env_id, s.kwargs, s.seed, s.options, list(s.actions)))
                        if digests != s.digests:
                            raise EnvReplayError(
                                f"env {s.env_id} (seed {s.seed}) replayed on worker {target} "
                                f"diverged from its record after a worker died (observation "
                                f"digests {digests} != {s.digests}): the env is not "
                                "deterministic given its seed and actions.")
                    else:
                        s.info = self._ray.get(self.workers[target].make.remote(
                            slot, s.env_id, s.kwargs))
                    break
                except (self._ray.exceptions.RayActorError,
                        self._ray.exceptions.ActorUnavailableError):
                    self._worker_died(target)
                    dead_set.add(target)

    def stats(self) -> dict[str, Any]:
        live = self.live_workers()
        per = self._ray.get([self.workers[i].stats.remote() for i in live])
        return {"workers": len(self.workers), "live": len(live), "replays": self.replays,
                "worker_failures": self.worker_failures, "per_worker": per}

    def close(self) -> None:
        for i in self.live_workers():
            try:
                self._ray.get(self.workers[i].close.remote(), timeout=30)
            except Exception:
                pass
        for w in self.workers:
            try:
                self._ray.kill(w)
            except Exception:
                pass
        if self.placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.placement_group)


# -- the rollout engine with batched env steps -------------------------------------------------
class _PrefetchingBackend:
    """Backend proxy: after each batched generation, parse the completions with the engine's own
    parser and issue the resulting env steps to the workers at once."""

    def __init__(self, backend: Any, engine: "Any") -> None:
        self._backend = backend
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def generate(self, prompts: Any, *args: Any, **kwargs: Any) -> Any:
        gens = self._backend.generate(prompts, *args, **kwargs)
        self._engine._prefetch_steps(gens)
        return gens


def batched_step_engine_class() -> Any:
    """:class:`BatchedStepRolloutEngine` (made lazily: it subclasses the rollout engine)."""
    from crl_bench.llm.prompting import parse_completion
    from crl_bench.llm.rollout import RolloutEngine

    class BatchedStepRolloutEngine(RolloutEngine):
        """:class:`~crl_bench.llm.rollout.RolloutEngine` whose remote envs are reset and stepped
        all at once per turn (one call per worker). Local envs play as usual."""

        def __init__(self, backend: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(backend, *args, **kwargs)
            self.backend = _PrefetchingBackend(self.backend, self)
            self._eps: list[Any] = []
            self.prefetched_steps = 0

        def run(self, episodes: list[Any]) -> list[Any]:
            self._eps = []
            by_pool: dict[int, tuple[RemoteEnvPool, list[tuple[int, Any]]]] = {}
            for spec in episodes:
                if isinstance(spec.env, RemoteEnv):
                    pool = spec.env.pool
                    by_pool.setdefault(id(pool), (pool, []))[1].append(
                        (spec.env.slot, (spec.seed, spec.options)))
            for pool, items in by_pool.values():
                pool.prefetch("reset", items)
            try:
                return super().run(episodes)
            finally:
                self._eps = []

        def _start(self, spec: Any) -> Any:
            ep = super()._start(spec)
            self._eps.append(ep)
            return ep

        def _prefetch_steps(self, gens: list[Any]) -> None:
            batch = [ep for ep in self._eps if not ep.done]
            if len(batch) != len(gens):  # not the engine's turn call: nothing to prefetch
                return
            by_pool: dict[int, tuple[RemoteEnvPool, list[tuple[int, Any]]]] = {}
            for ep, gen in zip(batch, gens):
                env = ep.spec.env
                if not isinstance(env, RemoteEnv):
                    continue
                parsed = parse_completion(self.prompt.response_prefix + gen.text, self.prompt,
                                          self._asks_left(ep))
                if parsed.kind == "action":
                    by_pool.setdefault(id(env.pool), (env.pool, []))[1].append(
                        (env.slot, parsed.action))
            for pool, items in by_pool.values():
                pool.prefetch("step", items)
                self.prefetched_steps += len(items)

    return BatchedStepRolloutEngine


def as_batched_engine(engine: Any) -> Any:
    """The same engine (every setting kept) as a :class:`BatchedStepRolloutEngine`."""
    cls = batched_step_engine_class()
    new = cls.__new__(cls)
    new.__dict__.update(engine.__dict__)
    new.backend = _PrefetchingBackend(engine.backend, new)
    new._eps = []
    new.prefetched_steps = 0
    return new
