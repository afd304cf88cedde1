"""The Ray implementations of a run's parts (:mod:`crl_bench.run.parts`): any agent's
``train_step`` runs unchanged, its parts spread over a Ray cluster. :func:`ray_context` is the
context factory that builds them (``RunLoop(..., context=ray_context(...))``).

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

* the extractor's model and trainer go where ``extractor.runs`` says, as in one process: with
  ``process`` into a Ray actor (:class:`~crl_bench.distributed.extractor.RayHost`, the Ray form
  of the process host), with ``thread`` / ``inline`` on the driver behind the model lock; the
  track (its thread, the bank writes to the service, the credit) stays on the driver. With full
  fine-tuning the extractor is served and trained like the actor (its engines and FSDP ranks).

What stays on the driver: the plan, advantages, the extractor track, records and checkpoints.

Synchronous: every verb returns when its remote work is done, in the single-process order, so a
run with one generation engine plays the same tokens as the single-process run for a seed
(tested on the ``tiny`` preset); only the learner's gradient sum changes order (fp32 rounding).
"""

from __future__ import annotations

from typing import Any, Callable

from crl_bench.distributed import require_ray
from crl_bench.distributed.plan import ResourcePlan, check_plan_against_ray, get_plan
from crl_bench.run.context import RunContext
from crl_bench.run.parts import ActorSide, ExperienceSide, Models, Player, RunInfo
from crl_bench.run.parts.models import role_sampling
from crl_bench.training.host import backend_spec


class RayCluster:
    """The cluster a run's Ray parts share: its :class:`ResourcePlan` and whether this run
    started it (then :meth:`close` shuts it down).

    Args:
        threads: torch threads of every remote process (the run's ``threads``).
        address: a Ray cluster to join (``ray.init(address=...)``; "auto" for the local node's
            cluster); None: start a local cluster with ``num_cpus`` CPUs.
        plan: a :class:`ResourcePlan` or the name of one (``cpu``, ``gpu1``, ``paper16``).
        plan_overrides: fields of the plan to replace (``{"env_workers": 4}``).
        num_cpus: CPUs of a local cluster (default: enough for the plan).
    """

    def __init__(self, threads: int, *, address: str | None = None,
                 plan: str | ResourcePlan = "cpu", plan_overrides: dict[str, Any] | None = None,
                 num_cpus: float | None = None) -> None:
        self.plan = get_plan(plan, **(plan_overrides or {}))
        self.threads = threads
        self.owned = False
        ray = require_ray()
        if not ray.is_initialized():
            env = {"OMP_NUM_THREADS": str(threads)}
            if address:
                ray.init(address=address, include_dashboard=False, log_to_driver=False,
                         runtime_env={"env_vars": env})
            else:
                cpus = num_cpus or max(2, int(self.plan.required()["CPU"] + 0.999) + 1)
                # address="local": always a new cluster, never one named by RAY_ADDRESS or left
                # behind in /tmp/ray/ray_current_cluster (which would refuse num_cpus)
                ray.init(address="local", num_cpus=cpus, include_dashboard=False,
                         log_to_driver=False, runtime_env={"env_vars": env})
                self.owned = True
        check_plan_against_ray(self.plan)

    def close(self) -> None:
        if self.owned:
            require_ray().shutdown()


class RayModels(Models):
    """The actor's generation on engine actors
    (:class:`~crl_bench.distributed.generation.RemoteGenerationBackend`); the driver keeps the
    tokenizer and chat template (prompts built exactly as in one process) and the extractor's
    own generation. :meth:`sync_engines` pushes new trainable weights before a rollout."""

    def __init__(self, info: RunInfo, cluster: RayCluster) -> None:
        super().__init__(info)
        self.cluster = cluster
        self.gen: Any = None
        self.ext_gen: Any = None
        """The extractor's generation engines (a sharded extractor; None: it generates with
        ``ext_raw``, on the driver or in its actor)."""
        self.actor_spec: dict[str, Any] = {}
        self.ext_spec: dict[str, Any] = {}
        self.holds_weights = True
        """False with full fine-tuning: the driver keeps tokenizers only; the engines and the
        sharded learner ranks hold every weight (their checkpoints too)."""
        self._engine_roles: tuple[str, ...] = ()
        self._pushed: tuple[int, ...] | None = None
        self.groups: dict[str, Any] = {}
        """Colocated: each role's placement group (its engines and its ranks)."""
        self.ext_lock: Any = None
        """Full fine-tuning: the extractor engines' own lock (held from sleep to wake-up)."""

    def build(self, *, extractor: bool, shared_params: bool = False) -> None:
        from crl_bench.distributed.generation import RemoteGenerationBackend
        from crl_bench.run.parts.models import LockedBackend

        if self.info.cfg.model.lora_r == 0 and not shared_params:
            self._build_weightless(extractor)
            return
        super().build(extractor=extractor, shared_params=shared_params)
        spec = backend_spec(self.raw_backend, self.info.cfg.model, self.info.cfg.seed)
        self.actor_spec = spec
        local_ext = self.ext_backend  # the extractor keeps generating on the driver
        self.gen = RemoteGenerationBackend.start(
            self.raw_backend, self.info.cfg.model.backend, spec, self.cluster.plan.generation_engines,
            options=self.cluster.plan.engine_options(), threads=self.cluster.threads)
        self._engine_roles = tuple(spec["roles"])
        self.sync_engines((), force=True)
        self.backend = LockedBackend(self.gen, self.lock)
        self.ext_backend = local_ext

    def _build_weightless(self, extractor: bool) -> None:
        """Full fine-tuning on Ray: the driver loads no model. Each role gets its engines
        (``engine_settings`` from the config, the plan's GPUs per engine = its tensor-parallel
        size) and, in the actor and experience sides, its FSDP ranks; the driver keeps the
        tokenizer and chat template of each model (:class:`PromptBackend`)."""
        import threading

        from crl_bench.distributed.generation import PromptBackend, RemoteGenerationBackend
        from crl_bench.distributed.weight_sync import engine_transfer
        from crl_bench.run.parts.models import LockedBackend, engine_settings

        cfg, plan = self.info.cfg, self.cluster.plan
        m = cfg.model
        self.holds_weights = False
        check_engine_gpus(plan, cfg)
        common = dict(lora=None, dtype=m.dtype, device=m.device, seed=cfg.seed)
        self.actor_spec = dict(model_name=m.actor, roles=("actor",), **common)
        self.raw_backend = PromptBackend(m.actor, ("actor",))
        self.gen = RemoteGenerationBackend.start(
            self.raw_backend, m.backend, self.actor_spec, plan.generation_engines,
            options=plan.engine_options(), threads=self.cluster.threads,
            settings=dict(engine_settings(cfg, "actor"), sleep_mode=plan.colocated,
                          **engine_transfer(plan, cfg)),
            **self._placed("actor"))
        self._engine_roles = ("actor",)
        self.backend = LockedBackend(self.gen, self.lock)
        self.ext_raw = self.raw_backend
        self.ext_backend = self.backend
        if extractor:
            name = m.extractor or m.actor
            self.ext_spec = dict(model_name=name, roles=("extractor",), **common)
            self.ext_raw = PromptBackend(name, ("extractor",))
            if not plan.sharded_extractor:
                raise ValueError(
                    f"ray plan {plan.name!r} has no extractor engines and ranks "
                    "(extractor_engines, extractor_ranks), and with full fine-tuning "
                    "(model.lora_r=0) the extractor is served and trained like the actor. Give "
                    "the plan extractor_engines >= 1 and extractor_ranks >= 1 (paper16 does).")
            self.ext_gen = RemoteGenerationBackend.start(
                self.ext_raw, m.backend, self.ext_spec, plan.extractor_engines,
                options=plan.extractor_engine_options(), threads=self.cluster.threads,
                settings=dict(engine_settings(cfg, "extractor"), sleep_mode=plan.colocated,
                              **engine_transfer(plan, cfg)),
                **self._placed("extractor"))
            # its own lock: the actor's rollout never waits on the extractor's engines
            self.ext_lock = threading.RLock()
            self.ext_backend = LockedBackend(self.ext_gen, self.ext_lock)
        self.actor_sampling, self.extractor_sampling = role_sampling(cfg)

    def _placed(self, role: str) -> dict[str, Any]:
        """Colocated: the role's placement group (made here; its ranks join it), the bundle
        each engine starts in and, for an engine over several bundles, where vLLM's Ray
        executor puts its tensor-parallel workers."""
        from crl_bench.distributed.plan import role_group

        plan = self.cluster.plan
        if not plan.colocated:
            return {}
        self.groups[role] = role_group(plan, role)
        return {"placement_group": self.groups[role], "bundles": plan.engine_bundles(role),
                "ray_executor": plan.ray_executor_env(role)}

    def events(self) -> dict[str, Any]:
        """Each role's engines' call logs (:meth:`RemoteGenerationBackend.events`)."""
        return {role: gen.events() for role, gen in (("actor", self.gen),
                                                     ("extractor", self.ext_gen))
                if gen is not None}

    def describe(self) -> dict[str, Any]:
        """What runs where, read back from the running engine actors (see
        :meth:`RayRunContext.topology`)."""
        ray = require_ray()
        out: dict[str, Any] = {"driver_holds_weights": self.holds_weights, "driver_backends": sorted(
            {type(b).__name__ for b in (self.raw_backend, self.ext_raw) if b is not None})}
        for role, gen in (("actor", self.gen), ("extractor", self.ext_gen)):
            if gen is not None:
                out[f"{role}_engines"] = ray.get([e.describe.remote() for e in gen.engines])
        return out

    def state_dict(self, folder: Any) -> dict[str, Any]:
        if not self.holds_weights:
            # the learner ranks checkpoint the weights (sharded, RUN_DIR/learner_checkpoints/);
            # the checkpoint's adapters folder says so instead of holding a copy
            import json
            from pathlib import Path

            out = Path(folder) / "adapters"
            out.mkdir(parents=True, exist_ok=True)
            (out / "sharded.json").write_text(json.dumps({
                "weights": "held by the FSDP learner ranks: torch.distributed.checkpoint folders "
                           "in RUN_DIR/learner_checkpoints, named by the trainers' states",
                "models": {"actor": self.actor_spec.get("model_name"),
                           "extractor": self.ext_spec.get("model_name")}}, indent=1))
            return {}
        return super().state_dict(folder)

    def load_state_dict(self, state: dict[str, Any], folder: Any) -> None:
        if self.holds_weights:
            super().load_state_dict(state, folder)

    def sync_engines(self, versions: tuple[int, ...], force: bool = False,
                     direct: tuple[str, ...] = ()) -> None:
        """Push the driver's trainable weights to the engines when ``versions`` (the roles'
        update counts) changed since the last push; ``direct``: roles whose learner pushes its
        weights into the engines itself (full fine-tuning), skipped unless ``force``."""
        from crl_bench.training.precision import role_weights

        if self.gen is None or (not force and versions == self._pushed):
            return
        ray = require_ray()
        with self.lock:
            for role in self._engine_roles:
                if role not in direct or force:
                    self.gen.push_weights(role, ray.put(role_weights(self.raw_backend, role)))
        self._pushed = versions

    def close(self) -> None:
        for gen in (self.gen, self.ext_gen):
            if gen is not None:
                gen.close()
        if self.groups:
            from ray.util.placement_group import remove_placement_group

            for group in self.groups.values():
                remove_placement_group(group)


def check_engine_gpus(plan: ResourcePlan, cfg: Any) -> None:
    """On GPUs each engine's share of the plan is its tensor-parallel size
    (``model.<role>_tensor_parallel``); refuse a plan and a config that disagree."""
    from crl_bench.config.schema import ConfigError

    pairs = [("actor", plan.gpus_per_engine, "generation_engines")]
    if plan.sharded_extractor:
        pairs.append(("extractor", plan.gpus_per_extractor_engine, "extractor_engines"))
    for role, gpus, field in pairs:
        tp = int(getattr(cfg.model, f"{role}_tensor_parallel"))
        if gpus >= 1 and gpus != tp:
            raise ConfigError(f"ray plan {plan.name!r} gives each {role} engine {gpus:g} GPUs "
                              f"but model.{role}_tensor_parallel={tp}: use --set "
                              f"model.{role}_tensor_parallel={gpus:g}, or change the plan's "
                              f"{field}.")


class RayActorSide(ActorSide):
    """The actor's update on :class:`~crl_bench.distributed.learner.DataParallelLearner` ranks
    (placement group, gloo on CPU, NCCL on GPU)."""

    def __init__(self, info: RunInfo, models: RayModels, cluster: RayCluster) -> None:
        super().__init__(info, models)
        self.cluster = cluster
        self.learner: Any = None

    def build_trainer(self) -> None:
        """The actor's learner ranks: FSDP2-sharded for full fine-tuning (they load the model
        from its spec in fp32 and push their weights into the engines themselves,
        :mod:`crl_bench.distributed.sharded`), replicated data parallelism for LoRA (the
        driver's adapters loaded into every rank)."""
        from crl_bench.distributed.learner import DataParallelLearner
        from crl_bench.training.precision import role_weights

        cfg, plan = self.info.cfg, self.cluster.plan
        options = dict(total_steps=cfg.steps, seed=cfg.seed, bundle=plan.rank_bundle(),
                       threads=self.cluster.threads)
        if self.models.actor_spec.get("lora") is None:
            from crl_bench.distributed.sharded import ShardedRayLearner, ShardedRoleTrainer

            from crl_bench.distributed.weight_sync import synced

            self.learner = ShardedRayLearner(plan.learner_ranks, self.models.actor_spec, "actor",
                                             cfg.actor, group=self.models.groups.get("actor"),
                                             **options)
            # colocated: the engines sleep through the update; the push by the plan's path
            self.host = ShardedRoleTrainer(
                self.models, self.info, synced(self.learner, self.models.gen, plan, cfg, "actor",
                                               lock=self.models.lock), "actor")
            return
        self.learner = DataParallelLearner(plan.learner_ranks, self.models.actor_spec, "actor",
                                           cfg.actor, driver=(self.models.raw_backend,
                                                              self.models.lock), **options)
        self.learner.load_weights(role_weights(self.models.raw_backend, "actor"))
        self.host = self.learner

    def before_checkpoint(self) -> None:
        """A sharded learner's weights into the driver's model, whose adapters the checkpoint
        saves (the only time the driver needs them)."""
        sync = getattr(self.host, "sync_driver", None)
        if sync is not None:
            sync()

    def close(self) -> None:
        if self.learner is not None:
            self.learner.close()


class RayExperienceSide(ExperienceSide):
    """The bank and its index in the experience service actor
    (:class:`~crl_bench.distributed.experience.RemoteManager`, on the driver's node: the bank
    file and checkpoint backups live in the run directory); the extractor's host where
    ``extractor.runs`` says (:meth:`process_host`: a Ray actor), or, with full fine-tuning, its
    engines and FSDP ranks (:meth:`new_host`). The track stays on the driver."""

    manager_has_state = False  # the service reopens the bank; its counters start afresh

    def __init__(self, info: RunInfo, models: Models, cluster: RayCluster) -> None:
        super().__init__(info, models)
        self.cluster = cluster
        self.ext_learner: Any = None
        """The extractor's FSDP ranks (a sharded extractor)."""

    def new_manager(self, retrieval: Any) -> Any:
        from crl_bench.distributed.experience import RemoteManager

        x = self.info.cfg.experience
        return RemoteManager.start(str(self.info.run.bank_path), x.embedder, x.capacity, retrieval,
                                   step_clock=True, num_cpus=self.cluster.plan.cpus_experience,
                                   embed_max_tokens=x.embed_max_tokens)

    def new_host(self, *, train: bool) -> Any:
        """As in one process; a sharded extractor (full fine-tuning: the driver holds no
        extractor weights) is served and trained like the actor: generation on its engines
        (``extractor_engines``), its update on FSDP ranks (``extractor_ranks``, placed like the
        actor's), each update's weights pushed by rank 0 into the engines, which also answer
        Search-and-Ask: the answers come from the trained weights."""
        from crl_bench.training.host import LocalHost

        m = self.models
        if getattr(m, "ext_gen", None) is None:
            return super().new_host(train=train)
        if not train:
            return LocalHost(m.ext_raw, "extractor", sampling=m.extractor_sampling,
                             lock=m.lock, generator=m.ext_backend)
        from crl_bench.distributed.sharded import ShardedRayLearner, ShardedRoleTrainer

        cfg, plan = self.info.cfg, self.cluster.plan
        from crl_bench.distributed.weight_sync import synced

        self.ext_learner = ShardedRayLearner(
            plan.extractor_ranks, m.ext_spec, "extractor", cfg.extractor,
            total_steps=cfg.steps, seed=cfg.seed + 1, bundle=plan.extractor_rank_bundle(),
            threads=self.cluster.threads, group=m.groups.get("extractor"))
        learner = synced(self.ext_learner, m.ext_gen, plan, cfg, "extractor",
                         lock=m.ext_lock)
        return ShardedRoleTrainer(m, self.info, learner, "extractor", gen=m.ext_gen)

    def process_host(self, *, train: bool) -> Any:
        """``extractor.runs=process`` on Ray: the extractor's model and trainer in a Ray actor
        (:class:`~crl_bench.distributed.extractor.RayHost`; the plan's ``cpus_extractor`` and
        ``extractor_gpus``), built like the driver's extractor role, starting from its
        weights."""
        from crl_bench.distributed.extractor import RayHost
        from crl_bench.training.precision import role_weights

        cfg, p, ext_raw = self.info.cfg, self.cluster.plan, self.models.ext_raw
        host = RayHost.start(
            cfg.model.backend, backend_spec(ext_raw, cfg.model, cfg.seed), "extractor",
            self.models.extractor_sampling, cfg.extractor if train else None,
            total_steps=cfg.steps, trainer_seed=cfg.seed + 1, rng_seed=cfg.seed + 2,
            threads=self.cluster.threads,
            options={"num_cpus": p.cpus_extractor, "num_gpus": p.extractor_gpus})
        with self.models.lock:
            host.load_weights(role_weights(ext_raw, "extractor"))
        return host

    def describe(self) -> dict[str, Any]:
        """Where the extractor runs (``extractor.runs`` and its host's process, read back from
        a Ray host) and its learner ranks (a sharded extractor)."""
        import os

        from crl_bench.training.host import LocalHost

        if self.host is None:
            return {}
        ray = require_ray()
        out: dict[str, Any] = {"extractor": {"runs": self.runs, "host": type(self.host).__name__}}
        describe = getattr(self.host, "describe", None)
        if describe is not None:  # a Ray host: its actor's process
            out["extractor"].update(describe())
        elif isinstance(self.host, LocalHost):  # the driver's process
            out["extractor"]["pid"] = os.getpid()
        if self.ext_learner is not None:
            out["extractor_ranks"] = ray.get([r.describe.remote() for r in self.ext_learner.ranks])
        return out

    def close(self) -> None:
        try:
            super().close()  # the host too (a sharded extractor's: its ranks)
        finally:
            if self.manager is not None:
                self.manager.close()


class RayPlayer(Player):
    """Envs on :class:`~crl_bench.distributed.env_workers.RemoteEnvPool` workers (SPREAD
    placement group), every worker stepped at once per turn (a dead worker's episodes are
    replayed on another); before each play the bank's step clock advances and the engines and
    the driver get the roles' newest weights."""

    def __init__(self, info: RunInfo, models: RayModels, experience: RayExperienceSide,
                 actor: ActorSide, cluster: RayCluster) -> None:
        super().__init__(info, models, experience)
        self.actor = actor
        self.cluster = cluster
        self.pool: Any = None
        self.on_first_play: Callable[[], None] | None = None

    def envs_for(self, task: Any, phase: str, n: int) -> list[Any]:
        from crl_bench.distributed.env_workers import RemoteEnvPool

        if self.pool is None:
            self.pool = RemoteEnvPool(self.cluster.plan.env_workers,
                                      worker_options=self.cluster.plan.env_worker_options(),
                                      spread=True)
        pool = self._envs.setdefault((task.env_id, phase), [])
        if len(pool) < n:
            pool.extend(self.pool.make_many(task.env_id, n - len(pool),
                                            **self.env_kwargs(task, phase)))
        return pool[:n]

    def engine(self, ask: Any, seed: int, temperature: float | None = None) -> Any:
        from crl_bench.distributed.env_workers import as_batched_engine

        return as_batched_engine(super().engine(ask, seed, temperature))

    def play(self, phase: str, step: int, plan: list[Any], *,
             sampling_seed: int | None = None) -> list[Any]:
        if self.on_first_play is not None:  # every part is built by now
            hook, self.on_first_play = self.on_first_play, None
            hook()
        manager = self.experience.manager
        if manager is not None:
            manager.set_step(self.info.step)
        versions = tuple(t.updates if t is not None else -1
                         for t in (self.actor.host, self.experience.trainer))
        self.models.sync_engines(versions, direct=getattr(self.actor.host, "pushed_roles", ()))
        if self.pool is not None:
            self.pool.revive(timeout_s=0.5)
        return super().play(phase, step, plan, sampling_seed=sampling_seed)

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.pool is not None:
                self.pool.close()


class RayRunContext(RunContext):
    """A :class:`RunContext` whose parts are the Ray implementations above, on ``cluster``
    (closed with the run when the run started it)."""

    def __init__(self, cfg: Any, run_dir: Any, cluster: RayCluster) -> None:
        self.cluster = cluster
        super().__init__(cfg, run_dir)

    def make_parts(self) -> None:
        c = self.cluster
        self.models = RayModels(self.info, c)
        self.actor = RayActorSide(self.info, self.models, c)
        self.experience = RayExperienceSide(self.info, self.models, c)
        self.player = RayPlayer(self.info, self.models, self.experience, self.actor, c)
        self.player.on_first_play = self.write_topology

    def write_topology(self) -> None:
        """``RUN_DIR/ray_topology.json``: the plan and :meth:`topology` (what was built)."""
        import json

        out = {"plan": self.cluster.plan.to_dict(), **self.topology()}
        (self.info.run.path / "ray_topology.json").write_text(json.dumps(out, indent=1,
                                                                        default=str))

    def topology(self) -> dict[str, Any]:
        """What this run built, read back from the running Ray actors: the driver's weights,
        every engine (process, GPUs, model, engine settings) and every learner rank (process,
        GPUs, process group, checkpointing) per role; compare with ``crl-bench plan``."""
        ray = require_ray()
        out = self.models.describe()
        learner = getattr(self.actor, "learner", None)
        if learner is not None and hasattr(learner, "ranks"):
            out["actor_ranks"] = ray.get([r.describe.remote() for r in learner.ranks
                                          if hasattr(r, "describe")])
        out.update(self.experience.describe())
        return out

    def ray_stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"plan": self.cluster.plan.name}
        if self.player.pool is not None:
            out["env_pool"] = self.player.pool.stats()
        return out

    def close(self) -> None:
        self.write_events()
        try:
            super().close()
        finally:
            self.cluster.close()

    def write_events(self) -> None:
        """``RUN_DIR/ray_topology.json`` gets ``engine_events``: each role's engines' call logs
        (generate, sleep, wake_up, weights: the run's order, read back before they stop), and
        ``learner_events``: each sharded role's ranks' offload / reload logs."""
        import json

        path = self.info.run.path / "ray_topology.json"
        learners = {"actor": self.actor.learner, "extractor": self.experience.ext_learner}
        try:
            events = self.models.events()
            states = {role: lr.state_events() for role, lr in learners.items()
                      if hasattr(lr, "state_events")}
        except Exception:  # engines or ranks already gone: nothing to add
            return
        if path.is_file():
            doc = json.loads(path.read_text())
            doc["engine_events"], doc["learner_events"] = events, states
            path.write_text(json.dumps(doc, indent=1, default=str))


def ray_context(*, address: str | None = None, plan: str | ResourcePlan = "cpu",
                plan_overrides: dict[str, Any] | None = None, num_cpus: float | None = None
                ) -> Callable[[Any, Any], RayRunContext]:
    """The context factory of a run on Ray, for ``RunLoop(..., context=ray_context(...))``:
    ``factory(cfg, run_dir)`` joins or starts the cluster with these settings and builds a
    :class:`RayRunContext` on it."""
    def factory(cfg: Any, run_dir: Any) -> RayRunContext:
        cluster = RayCluster(int(cfg.threads or 1), address=address, plan=plan,
                             plan_overrides=plan_overrides, num_cpus=num_cpus)
        return RayRunContext(cfg, run_dir, cluster)
    return factory
