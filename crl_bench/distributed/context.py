"""A Ray-backed :class:`~crl_bench.runner.context.RunContext`: any agent's ``train_step`` runs
unchanged, its parts spread over a Ray cluster.

What moves (per the :class:`~crl_bench.distributed.plan.ResourcePlan`, checked against the
cluster at start):

* envs -> :class:`~crl_bench.distributed.env_workers.RemoteEnvPool` workers (SPREAD placement
  group); the rollout engine steps every worker at once per turn; a dead worker's episodes are
  replayed on another;
* actor generation -> generation engine actors
  (:class:`~crl_bench.distributed.generation.RemoteGenerationBackend`); the driver keeps the
  tokenizer and chat template, so prompts are built exactly as in one process;
* the actor's update -> :class:`~crl_bench.distributed.learner.DataParallelLearner` ranks
  (placement group, gloo on CPU, NCCL on GPU). After each update the new weights are loaded into
  the driver's model (checkpoints, the extractor when parameters are shared) and pushed to the
  engines as one object ref before the next rollout.

* the experience manager (bank + index) -> the experience service actor
  (:class:`~crl_bench.distributed.experience.RemoteManager`), pinned to the driver's node.

* the extractor track (its model, CISPO trainer and background thread) -> the extractor actor
  (:class:`~crl_bench.distributed.extractor.RemoteExtractorTrack`), talking to the service; its
  newest weights come back to the driver before each rollout (Search-and-Ask answers are
  generated on the driver; checkpoints save the driver's adapters). With shared actor/extractor
  parameters (the ablation) the track stays on the driver.

What stays on the driver: the plan, advantages, records and checkpoints.

Synchronous: every verb returns when its remote work is done, in the single-process order, so a
run with one generation engine plays the same tokens as the single-process run for a seed
(tested on the ``tiny`` preset); only the learner's gradient sum changes order (fp32 rounding).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from crl_bench.distributed import require_ray
from crl_bench.distributed.plan import ResourcePlan, check_plan_against_ray, get_plan
from crl_bench.runner.context import RunContext


class _LearnerTrainer:
    """Stands where ``ctx.actor_trainer`` (a RoleTrainer) stands: ``update`` runs on the ranks,
    then the driver's model gets the new weights; checkpoints hold the ranks' optimiser state."""

    def __init__(self, ctx: "RayRunContext", learner: Any, local: Any) -> None:
        self.ctx = ctx
        self.learner = learner
        self.local = local  # the driver's RoleTrainer: its counters and parameters
        self.adapter = local.adapter
        self.params = local.params
        self.cfg = local.cfg

    @property
    def updates(self) -> int:
        return self.local.updates

    def update(self, samples: Any, **kwargs: Any) -> dict[str, float]:
        from crl_bench.distributed.learner import load_role_weights

        metrics = self.learner.update(samples, **kwargs)
        if not metrics.get("skipped"):
            with self.ctx.lock:
                load_role_weights(self.ctx.raw_backend, self.adapter, self.learner.weights())
            self.local.updates += 1
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"ray_learner": self.learner.state_dict(), "updates": self.local.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from crl_bench.distributed.learner import role_weights

        self.learner.load_state_dict(state["ray_learner"])
        self.local.updates = int(state["updates"])
        # the loop loaded the checkpoint's adapters into the driver's model first
        self.learner.load_weights(role_weights(self.ctx.raw_backend, self.adapter))


class _RemoteExtractorTrainer:
    """Stands where ``ctx.extractor_trainer`` stands when the extractor lives in its actor:
    update counts and checkpoint state come from there."""

    def __init__(self, track: Any, ctx: "RayRunContext") -> None:
        self.track = track
        self.ctx = ctx
        self.adapter = "extractor"

    @property
    def updates(self) -> int:
        return self.track.updates()

    def state_dict(self) -> dict[str, Any]:
        return require_ray().get(self.track.actor.trainer_state.remote())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from crl_bench.distributed.learner import role_weights

        ray = require_ray()
        ray.get(self.track.actor.load_trainer_state.remote(state))
        # the loop loaded the checkpoint's adapters into the driver's model first
        ray.get(self.track.actor.load_weights.remote(role_weights(self.ctx.ext_raw, "extractor")))


class RayRunContext(RunContext):
    """:class:`RunContext` with envs, actor generation and the actor learner on Ray.

    Args:
        cfg, run_dir: as for :class:`RunContext`.
        address: a Ray cluster to join (``ray.init(address=...)``; "auto" for the local node's
            cluster); None: start a local cluster with ``num_cpus`` CPUs.
        plan: a :class:`ResourcePlan` or the name of one (``cpu``, ``gpu1``, ``paper16``).
        plan_overrides: fields of the plan to replace (``{"env_workers": 4}``).
        num_cpus: CPUs of a local cluster (default: enough for the plan).
    """

    def __init__(self, cfg: Any, run_dir: Any, *, address: str | None = None,
                 plan: str | ResourcePlan = "cpu", plan_overrides: dict[str, Any] | None = None,
                 num_cpus: float | None = None) -> None:
        super().__init__(cfg, run_dir)
        self.ray_plan = get_plan(plan, **(plan_overrides or {}))
        self.address = address
        self.num_cpus = num_cpus
        self._owns_ray = False
        self.pool: Any = None
        self.gen: Any = None
        self.learner: Any = None
        self._engine_roles: tuple[str, ...] = ()
        self._pushed: tuple[int, ...] | None = None
        self.connect()

    # -- the cluster ---------------------------------------------------------------------------
    def connect(self) -> None:
        ray = require_ray()
        if not ray.is_initialized():
            env = {"OMP_NUM_THREADS": str(self.cfg.threads or 1)}
            if self.address:
                ray.init(address=self.address, include_dashboard=False, log_to_driver=False,
                         runtime_env={"env_vars": env})
            else:
                cpus = self.num_cpus or max(2, int(self.ray_plan.required()["CPU"] + 0.999) + 1)
                # address="local": always a new cluster, never one named by RAY_ADDRESS or left
                # behind in /tmp/ray/ray_current_cluster (which would refuse num_cpus)
                ray.init(address="local", num_cpus=cpus, include_dashboard=False,
                         log_to_driver=False, runtime_env={"env_vars": env})
                self._owns_ray = True
        check_plan_against_ray(self.ray_plan)

    def _threads(self) -> int:
        return int(self.cfg.threads or 1)

    # -- models --------------------------------------------------------------------------------
    def _spec_of(self, backend: Any) -> dict[str, Any]:
        """Keyword arguments that rebuild ``backend`` in another process: what the built backend
        holds (model, roles, LoRA shape, role layout), with device and dtype as configured (they
        are resolved on the node the copy lands on) and the run's seed (same initial weights)."""
        m = self.cfg.model
        spec: dict[str, Any] = dict(model_name=backend.model_name, roles=tuple(backend.roles),
                                    lora=getattr(backend, "lora", None), dtype=m.dtype,
                                    device=m.device, seed=self.cfg.seed)
        for key in ("shared_adapter", "separate_bases"):
            if hasattr(backend, key):
                spec[key] = getattr(backend, key)
        return spec

    def build_models(self, *, extractor: bool, shared_params: bool = False) -> None:
        from crl_bench.distributed.generation import RemoteGenerationBackend
        from crl_bench.runner.context import LockedBackend

        super().build_models(extractor=extractor, shared_params=shared_params)
        spec = self._spec_of(self.raw_backend)
        self._actor_spec = spec
        local_ext = self.ext_backend  # the extractor keeps generating on the driver
        self.gen = RemoteGenerationBackend.start(
            self.raw_backend, self.cfg.model.backend, spec, self.ray_plan.generation_engines,
            options=self.ray_plan.engine_options(), threads=self._threads())
        self._engine_roles = tuple(spec["roles"])
        self._sync_engines(force=True)
        self.backend = LockedBackend(self.gen, self.lock)
        self.ext_backend = local_ext

    def _versions(self) -> tuple[int, ...]:
        return tuple(t.updates if t is not None else -1
                     for t in (self.actor_trainer, self.extractor_trainer))

    def _sync_engines(self, force: bool = False) -> None:
        """Push the driver's trainable weights to the engines when an update happened since."""
        from crl_bench.distributed.learner import role_weights

        if self.gen is None:
            return
        now = self._versions()
        if not force and now == self._pushed:
            return
        ray = require_ray()
        # roles whose learner pushes its weights into the engines itself (full fine-tuning)
        direct = getattr(self.actor_trainer, "pushed_roles", ())
        with self.lock:
            for role in self._engine_roles:
                if role not in direct or force:
                    self.gen.push_weights(role, ray.put(role_weights(self.raw_backend, role)))
        self._pushed = now

    def build_actor_trainer(self) -> None:
        """The actor's learner ranks: FSDP2-sharded for full fine-tuning (they load the model
        from its spec in fp32 and push their weights into the engines themselves), replicated
        data parallelism for LoRA (the driver's adapters loaded into every rank)."""
        from crl_bench.distributed.learner import DataParallelLearner, role_weights

        options = dict(total_steps=self.cfg.steps, seed=self.cfg.seed,
                       bundle=self.ray_plan.rank_bundle(), threads=self._threads())
        if self._actor_spec.get("lora") is None:
            from crl_bench.distributed.sharded import ShardedRayLearner, ShardedRoleTrainer

            self.learner = ShardedRayLearner(self.ray_plan.learner_ranks, self._actor_spec,
                                             "actor", self.cfg.actor, **options)
            self.actor_trainer = ShardedRoleTrainer(self, self.learner, "actor")
            return
        super().build_actor_trainer()
        self.learner = DataParallelLearner(
            self.ray_plan.learner_ranks, self._actor_spec, "actor", self.cfg.actor, **options)
        self.learner.load_weights(role_weights(self.raw_backend, "actor"))
        self.actor_trainer = _LearnerTrainer(self, self.learner, self.actor_trainer)

    def new_manager(self, retrieval: Any) -> Any:
        """The bank and its index in the experience service actor (on this node: the bank file
        and checkpoint backups live in the run directory), with the single-process retrieval
        settings and a step clock the driver advances before each rollout."""
        from crl_bench.distributed.experience import RemoteManager

        x = self.cfg.experience
        return RemoteManager.start(str(self.run.bank_path), x.embedder, x.capacity, retrieval,
                                   step_clock=True, num_cpus=self.ray_plan.cpus_experience)

    def new_track(self, settings: dict[str, Any], *, train: bool) -> Any:
        """The extractor track in its own actor (its model, trainer and track thread there, the
        bank through the experience service), with the single-process track's settings; on the
        driver when the plan says so or the parameters are shared with the actor (the
        shared-parameters ablation)."""
        from crl_bench.distributed.extractor import RemoteExtractorTrack
        from crl_bench.distributed.learner import role_weights

        shared = bool(getattr(self.ext_raw, "shared_adapter", False))
        if not self.ray_plan.extractor_actor or shared or not hasattr(self.manager, "actor"):
            return super().new_track(settings, train=train)
        spec = self._spec_of(self.ext_raw)
        p = self.ray_plan
        track = RemoteExtractorTrack.start(
            self.manager.actor, self.cfg.model.backend, spec, self.cfg.extractor,
            self.extractor_sampling, settings, train=train, total_steps=self.cfg.steps,
            seed=self.cfg.seed + 1, threads=self._threads(),
            options={"num_cpus": p.cpus_extractor, "num_gpus": p.extractor_gpus})
        require_ray().get(track.actor.load_weights.remote(role_weights(self.ext_raw, "extractor")))
        self.extractor_trainer = _RemoteExtractorTrainer(track, self) if train else None
        self._ext_pulled = 0
        return track

    def _pull_extractor(self) -> None:
        """The extractor actor's newest weights into the driver's model (Search-and-Ask answers
        are generated here; checkpoints save the driver's adapters)."""
        from crl_bench.distributed.learner import load_role_weights

        if not isinstance(self.extractor_trainer, _RemoteExtractorTrainer):
            return
        n = self.extractor_trainer.updates
        if n != self._ext_pulled:
            weights = self.extractor.weights()
            with self.lock:
                load_role_weights(self.ext_raw, "extractor", weights)
            self._ext_pulled = n

    def take_extractor_metrics(self) -> list[dict[str, Any]]:
        from crl_bench.distributed.extractor import RemoteExtractorTrack

        if isinstance(self.extractor, RemoteExtractorTrack):
            for m in self.extractor.take_metrics():
                self._log_extractor(m)
        return super().take_extractor_metrics()

    # -- envs and episodes ---------------------------------------------------------------------
    def envs_for(self, task: Any, phase: str, n: int) -> list[Any]:
        from crl_bench.distributed.env_workers import RemoteEnvPool

        if self.pool is None:
            self.pool = RemoteEnvPool(self.ray_plan.env_workers,
                                      worker_options=self.ray_plan.env_worker_options(), spread=True)
        pool = self._envs.setdefault((task.env_id, phase), [])
        if len(pool) < n:
            pool.extend(self.pool.make_many(task.env_id, n - len(pool),
                                            **self.env_kwargs(task, phase)))
        return pool[:n]

    def _engine(self, ask: Any, seed: int) -> Any:
        from crl_bench.distributed.env_workers import as_batched_engine

        return as_batched_engine(super()._engine(ask, seed))

    def play(self, phase: str, step: int, plan: list[Any], *,
             sampling_seed: int | None = None) -> list[Any]:
        if hasattr(self.manager, "set_step"):
            self.manager.set_step(self.step)
        self._pull_extractor()
        self._sync_engines()
        if self.pool is not None:
            self.pool.revive(timeout_s=0.5)
        return super().play(phase, step, plan, sampling_seed=sampling_seed)

    def ray_stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"plan": self.ray_plan.name}
        if self.pool is not None:
            out["env_pool"] = self.pool.stats()
        return out

    def close(self) -> None:
        try:
            super().close()
        finally:
            for part in (self.pool, self.gen, self.learner,
                         self.manager if hasattr(self.manager, "actor") else None):
                if part is not None:
                    try:
                        part.close()
                    except Exception:
                        pass
            if self._owns_ray:
                require_ray().shutdown()


def ray_context(*, address: str | None = None, plan: str | ResourcePlan = "cpu",
                plan_overrides: dict[str, Any] | None = None, num_cpus: float | None = None
                ) -> Callable[[Any, Any], RayRunContext]:
    """The context factory of a run on Ray, for ``Trainer(..., context=ray_context(...))``:
    ``factory(cfg, run_dir)`` builds a :class:`RayRunContext` with these cluster settings."""
    return functools.partial(RayRunContext, address=address, plan=plan,
                             plan_overrides=plan_overrides, num_cpus=num_cpus)
