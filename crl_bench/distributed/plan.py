"""Resource plans: how many GPUs and CPUs each part of a Ray run gets, checked at start.

A :class:`ResourcePlan` says how many GPUs go to actor generation, actor training and the
extractor, how many env workers there are and how many CPUs each part takes. :func:`check_plan`
compares it with what the cluster has (``ray.cluster_resources()`` and, per node,
``ray.nodes()``) before anything is placed, and raises :class:`ResourcePlanError` naming every
missing resource, instead of letting Ray wait forever for a placement group that cannot fit.

Documented plans (:data:`PLANS`, ``--set ray.plan=NAME``):

* ``paper16``: the paper's 16 GPUs (8 actor, 8 extractor), colocated as officially: the 7B
  actor's 8 vLLM engines (1 GPU each) and 8 FSDP learner ranks share GPUs 0-7, the extractor's
  (4B thinking model) 2 vLLM engines over 4 GPUs each (tensor parallel 4, the official
  ``memory_model``) and 8 FSDP learner ranks share GPUs 8-15; the engines sleep while the ranks
  update; 32 env workers on the CPUs of the cluster.
* ``paper16-split``: the same 16 GPUs split: per role 4 GPUs of engines (actor 4 x 1, extractor
  1 x 4) and 4 of learner ranks (``model.placement=split``).
* ``gpu1``: one GPU shared by everything (both roles as LoRA adapters on one base model):
  generation 0.5, training 0.25, extractor 0.25 of the device (Ray's fractional GPUs; memory is
  not enforced by Ray, the split only makes the placement explicit), 4 env workers.
* ``cpu``: no GPU (CI and laptops): 1 HF generation engine, 2 gloo learner ranks, 2 env workers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

PLACEMENTS = ("split", "colocated")
WEIGHT_SYNCS = ("auto", "object_store", "broadcast")
ENGINE_SHARE = 0.5
"""Colocated: the share of a GPU Ray gives the engine on it (the learner rank gets the rest).
Ray does not enforce GPU memory; vLLM takes its ``gpu_memory_utilization`` while awake and
sleeps while the rank updates (the memory plan's two phases)."""
TP_SHARE = ENGINE_SHARE / 2
"""Colocated, an engine over several GPUs (tensor parallel): the share of each of its GPUs one
of its tensor-parallel workers takes (``VLLM_RAY_PER_WORKER_GPUS``) and the share of its first
GPU its own process takes (the Ray actor, vLLM's driver), so that the engine's share of its first
GPU holds both. OpenRLHF's colocated workers take 0.2 of a GPU each
(``openrlhf/trainer/ray/vllm_engine.py:280``, set at ``:86``) and its engine actor over several
GPUs none (``:244``, ``:304-305``); this engine's process also keeps an HF copy of its model
(:class:`~crl_bench.llm.vllm_backend.VLLMBackend`), so it holds a share of its first GPU."""


class ResourcePlanError(RuntimeError):
    """The cluster lacks what the plan needs (the message names each missing resource)."""


@dataclass(frozen=True)
class ResourcePlan:
    """GPUs and CPUs per part of a Ray run.

    Attributes:
        name: the plan's name (in errors and records).
        actor_generation_gpus: GPUs for the actor's generation engines (all engines together).
        generation_engines: number of generation engines; each gets
            ``actor_generation_gpus / generation_engines`` GPUs (its tensor-parallel group).
        actor_training_gpus: GPUs for the actor's learner ranks (all ranks together).
        learner_ranks: data-parallel ranks of the actor learner; each gets
            ``actor_training_gpus / learner_ranks`` GPUs (0: gloo on CPU).
        extractor_gpus: GPUs for the extractor (its generation and training, all together).
        extractor_engines, extractor_engine_gpus, extractor_ranks: with ``extractor_ranks > 0``
            (full fine-tuning) the extractor is served and trained like the actor: that many
            generation engines on ``extractor_engine_gpus`` GPUs (each engine's share is its
            tensor-parallel size) and FSDP learner ranks on the rest of ``extractor_gpus``; 0:
            with ``extractor.runs=process`` one extractor actor holds the model and its trainer
            on ``extractor_gpus`` (``thread`` / ``inline``: the driver).
        env_workers: env worker actors (CPU only; they may live on GPU-less nodes).
        envs_per_worker: a hint for the pool size of each worker (the pool grows on demand).
        cpus_per_env_worker: CPUs reserved per env worker (SWE sandboxes want more).
        cpus_per_engine, cpus_per_rank, cpus_extractor, cpus_experience: CPUs of the other parts.
    """

    name: str = "custom"
    actor_generation_gpus: float = 0.0
    generation_engines: int = 1
    actor_training_gpus: float = 0.0
    learner_ranks: int = 1
    extractor_gpus: float = 0.0
    env_workers: int = 2
    envs_per_worker: int = 8
    cpus_per_env_worker: float = 1.0
    cpus_per_engine: float = 1.0
    cpus_per_rank: float = 1.0
    cpus_extractor: float = 0.0
    cpus_experience: float = 0.0
    extractor_engines: int = 0
    extractor_engine_gpus: float = 0.0
    extractor_ranks: int = 0
    placement: str = "split"
    """``split``: engines and learner ranks on GPUs of their own; ``colocated``: a role's
    engines and ranks on the same GPUs (one placement group per role, one bundle per GPU, the
    engine taking :data:`ENGINE_SHARE` of it and the rank the rest; the engines sleep while the
    ranks update). ``*_generation_gpus`` / ``*_engine_gpus`` and the ranks' GPUs then count the
    same GPUs twice: :meth:`role_gpus` is what the role holds."""
    weight_sync: str = "auto"
    """How a trained role's weights reach its engines (:mod:`crl_bench.distributed.
    weight_sync`): ``auto`` (CUDA: a GPU-to-GPU transfer, NCCL broadcast or CUDA IPC; CPU: the
    object store), ``object_store``, ``broadcast`` (a process group created for the push: NCCL
    on GPUs, gloo on CPUs)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
                raise ValueError(f"ray plan {self.name!r}: {f.name} must be >= 0, got {v}")
        if self.generation_engines < 1 or self.learner_ranks < 1:
            raise ValueError(f"ray plan {self.name!r}: generation_engines and learner_ranks must "
                             "be >= 1")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"ray plan {self.name!r}: placement={self.placement!r}; use one of "
                             f"{', '.join(PLACEMENTS)}")
        if self.weight_sync not in WEIGHT_SYNCS:
            raise ValueError(f"ray plan {self.name!r}: weight_sync={self.weight_sync!r}; use one "
                             f"of {', '.join(WEIGHT_SYNCS)}")
        if self.colocated and (self.actor_generation_gpus > self.actor_training_gpus
                               or self.extractor_engine_gpus > self.extractor_gpus):
            raise ValueError(f"ray plan {self.name!r}: colocated, a role's engines run on its "
                             "ranks' GPUs: actor_generation_gpus must be <= actor_training_gpus "
                             "and extractor_engine_gpus <= extractor_gpus")
        if self.extractor_ranks and (self.extractor_engines < 1
                                     or self.extractor_engine_gpus > self.extractor_gpus):
            raise ValueError(f"ray plan {self.name!r}: a sharded extractor (extractor_ranks="
                             f"{self.extractor_ranks}) needs extractor_engines >= 1 and "
                             "extractor_engine_gpus <= extractor_gpus")

    # -- per-actor requests --------------------------------------------------------------------
    @property
    def colocated(self) -> bool:
        return self.placement == "colocated"

    @property
    def gpus_per_engine(self) -> float:
        """GPUs one actor engine spans (its tensor-parallel group)."""
        return self.actor_generation_gpus / self.generation_engines

    @property
    def gpus_per_rank(self) -> float:
        return self.actor_training_gpus / self.learner_ranks

    def role_gpus(self, role: str) -> float:
        """GPUs ``role`` holds: colocated, its engines' GPUs are its ranks' GPUs."""
        if role == "actor":
            return (self.actor_training_gpus if self.colocated else
                    self.actor_generation_gpus + self.actor_training_gpus)
        return self.extractor_gpus

    def role_bundles(self, role: str) -> list[dict[str, float]]:
        """Colocated: the placement group of ``role``, one bundle per GPU (per rank on CPUs),
        each holding a learner rank and, for the GPUs an engine starts on, that engine."""
        if not self.colocated:
            raise ValueError(f"ray plan {self.name!r} is split: its engines and ranks have "
                             "bundles of their own")
        ranks = self.learner_ranks if role == "actor" else self.extractor_ranks
        gpu = self.role_gpus(role) / max(ranks, 1)
        b = {"CPU": self.cpus_per_engine + self.cpus_per_rank}
        return [dict(b, GPU=gpu) if gpu else dict(b) for _ in range(ranks)]

    def engine_bundles(self, role: str) -> list[int]:
        """Colocated: the bundle of ``role``'s placement group each engine starts in (engine k
        of tensor-parallel size t on bundle k x t; its other t - 1 GPUs are the next bundles)."""
        return [b[0] for b in self.worker_bundles(role)]

    def worker_bundles(self, role: str) -> list[list[int]]:
        """Colocated: the bundles of each engine's tensor-parallel workers, one per GPU (engine
        k of tensor-parallel size t: bundles k x t ... k x t + t - 1; a one-GPU engine runs its
        worker in its own process, in its first bundle)."""
        engines = self.generation_engines if role == "actor" else self.extractor_engines
        per = (self.gpus_per_engine if role == "actor" else self.gpus_per_extractor_engine)
        ranks = self.learner_ranks if role == "actor" else self.extractor_ranks
        # on CPUs (no GPUs) the engines take the layout's tensor-parallel spacing from the ranks
        step = int(per) if per >= 1 else max(1, ranks // max(engines, 1))
        return [list(range(k * step, (k + 1) * step)) for k in range(engines)]

    def ray_executor_env(self, role: str) -> list[dict[str, str] | None]:
        """Colocated: per engine of ``role``, the environment its actor sets before it builds
        vLLM with ``distributed_executor_backend="ray"`` when the engine spans several bundles
        (None: one bundle, vLLM's in-process worker). vLLM's Ray executor starts worker i in
        bundle ``VLLM_RAY_BUNDLE_INDICES[i]`` of the actor's placement group, each taking
        ``VLLM_RAY_PER_WORKER_GPUS`` of its GPU (vLLM ``vllm/v1/executor/ray_executor.py``,
        ``RayDistributedExecutor._init_workers_ray``; set as OpenRLHF sets them,
        ``openrlhf/trainer/ray/vllm_engine.py:85-87``). Rank r is in bundle r, so each worker
        shares its GPU with one rank: with ``cuda_ipc`` every rank puts its handles under its
        GPU's UUID and each worker opens its own GPU's (vLLM's ``IPCWeightTransferEngine.
        receive_weights``; OpenRLHF ``openrlhf/trainer/ray/vllm_worker_wrap.py:61``)."""
        share = TP_SHARE if self.role_gpus(role) else 0.0
        return [{"VLLM_RAY_BUNDLE_INDICES": ",".join(map(str, b)),
                 "VLLM_RAY_PER_WORKER_GPUS": f"{share:g}"} if len(b) > 1 else None
                for b in self.worker_bundles(role)]

    def _engine_request(self, gpus: float) -> dict[str, float]:
        """Ray options of one engine actor spanning ``gpus`` GPUs (colocated: its share of the
        first GPU of its bundles, :data:`ENGINE_SHARE`, or :data:`TP_SHARE` beside a worker)."""
        if self.colocated:
            gpus = TP_SHARE if gpus > 1 else ENGINE_SHARE * gpus
        return {"num_cpus": self.cpus_per_engine, "num_gpus": gpus}

    def engine_options(self) -> dict[str, float]:
        return self._engine_request(self.gpus_per_engine)

    @property
    def sharded_extractor(self) -> bool:
        """The extractor on its own engines and FSDP ranks (``extractor_ranks > 0``)."""
        return self.extractor_ranks > 0

    @property
    def gpus_per_extractor_engine(self) -> float:
        return self.extractor_engine_gpus / max(self.extractor_engines, 1)

    @property
    def gpus_per_extractor_rank(self) -> float:
        if self.colocated:
            return self.extractor_gpus / max(self.extractor_ranks, 1)
        return (self.extractor_gpus - self.extractor_engine_gpus) / max(self.extractor_ranks, 1)

    def extractor_engine_options(self) -> dict[str, float]:
        return self._engine_request(self.gpus_per_extractor_engine)

    def extractor_rank_bundle(self) -> dict[str, float]:
        """One placement-group bundle per extractor learner rank (colocated: the rank's share
        of its GPU, the rest is its engine's)."""
        b = {"CPU": self.cpus_per_rank}
        gpus = (self.extractor_gpus / max(self.extractor_ranks, 1) * (1 - ENGINE_SHARE)
                if self.colocated else self.gpus_per_extractor_rank)
        if gpus:
            b["GPU"] = gpus
        return b

    def rank_bundle(self) -> dict[str, float]:
        """One placement-group bundle per learner rank (colocated: the rank's share of its
        GPU)."""
        b = {"CPU": self.cpus_per_rank}
        gpus = self.gpus_per_rank * ((1 - ENGINE_SHARE) if self.colocated else 1)
        if gpus:
            b["GPU"] = gpus
        return b

    def env_worker_options(self) -> dict[str, float]:
        return {"num_cpus": self.cpus_per_env_worker}

    def parts(self) -> list[tuple[str, int, dict[str, float]]]:
        """(part, count, resources of one) for every part of the plan."""
        if self.colocated:
            return [
                *((f"{role} GPU (an engine's share and a learner rank)", len(bundles), bundles[0])
                  for role in ("actor", "extractor")
                  for bundles in [self.role_bundles(role)] if bundles),
                ("experience service", 1, {"CPU": self.cpus_experience}),
                ("env worker", self.env_workers, {"CPU": self.cpus_per_env_worker}),
            ]
        return [
            ("actor generation engine", self.generation_engines,
             {"CPU": self.cpus_per_engine, "GPU": self.gpus_per_engine}),
            ("actor learner rank", self.learner_ranks,
             {"CPU": self.cpus_per_rank, "GPU": self.gpus_per_rank}),
            *([("extractor generation engine", self.extractor_engines,
                {"CPU": self.cpus_per_engine, "GPU": self.gpus_per_extractor_engine}),
               ("extractor learner rank", self.extractor_ranks,
                {"CPU": self.cpus_per_rank, "GPU": self.gpus_per_extractor_rank})]
              if self.sharded_extractor else
              [("extractor", 1, {"CPU": self.cpus_extractor, "GPU": self.extractor_gpus})]),
            ("experience service", 1, {"CPU": self.cpus_experience}),
            ("env worker", self.env_workers, {"CPU": self.cpus_per_env_worker}),
        ]

    def required(self) -> dict[str, float]:
        """Total CPU and GPU the plan reserves."""
        total: dict[str, float] = {"CPU": 0.0, "GPU": 0.0}
        for _, count, res in self.parts():
            for k, v in res.items():
                total[k] += count * v
        return total

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


PLANS: dict[str, ResourcePlan] = {
    "paper16": ResourcePlan(
        name="paper16", placement="colocated", actor_generation_gpus=8, generation_engines=8,
        actor_training_gpus=8, learner_ranks=8, extractor_gpus=8, extractor_engines=2,
        extractor_engine_gpus=8, extractor_ranks=8, env_workers=32, envs_per_worker=4,
        cpus_per_env_worker=1, cpus_per_engine=2, cpus_per_rank=2, cpus_extractor=4,
        cpus_experience=2),
    "paper16-split": ResourcePlan(
        name="paper16-split", actor_generation_gpus=4, generation_engines=4,
        actor_training_gpus=4, learner_ranks=4, extractor_gpus=8, extractor_engines=1,
        extractor_engine_gpus=4, extractor_ranks=4, env_workers=32, envs_per_worker=4,
        cpus_per_env_worker=1, cpus_per_engine=2, cpus_per_rank=2, cpus_extractor=4,
        cpus_experience=2),
    "gpu1": ResourcePlan(
        name="gpu1", actor_generation_gpus=0.5, generation_engines=1, actor_training_gpus=0.25,
        learner_ranks=1, extractor_gpus=0.25, env_workers=4, envs_per_worker=32,
        cpus_per_env_worker=1, cpus_per_engine=1, cpus_per_rank=1),
    "cpu": ResourcePlan(
        name="cpu", generation_engines=1, learner_ranks=2, env_workers=2, envs_per_worker=16,
        cpus_per_env_worker=0.25, cpus_per_engine=0.25, cpus_per_rank=0.25),
}


def get_plan(name_or_plan: str | ResourcePlan | dict, **overrides: Any) -> ResourcePlan:
    """A plan by name (:data:`PLANS`), as given, or from a dict of fields; ``overrides`` replace
    fields (``env_workers=4``)."""
    if isinstance(name_or_plan, ResourcePlan):
        plan = name_or_plan
    elif isinstance(name_or_plan, dict):
        plan = ResourcePlan(**name_or_plan)
    elif name_or_plan in PLANS:
        plan = PLANS[name_or_plan]
    else:
        raise ValueError(f"unknown ray plan {name_or_plan!r}; known: {', '.join(PLANS)}")
    return dataclasses.replace(plan, **overrides) if overrides else plan


def layout_config(cfg: Any) -> Any:
    """``cfg`` for the layout alone: engines, ranks and engine settings do not depend on the
    architecture, so a model the memory plan has no numbers for (a test model) is counted as the
    paper's (Qwen2.5-7B-Instruct actor, Qwen3-4B-Thinking extractor)."""
    import copy

    from crl_bench.distributed.memory_plan import QWEN3_4B, QWEN25_7B, SHAPES

    out = copy.deepcopy(cfg)
    if out.model.actor not in SHAPES:
        out.model.actor = QWEN25_7B.name
    if (out.model.extractor or out.model.actor) not in SHAPES:
        out.model.extractor = QWEN3_4B.name
    return out


def layout_plan(cfg: Any, gpus: int, *, name: str | None = None, on_gpus: bool = True,
                **overrides: Any) -> ResourcePlan:
    """The :class:`ResourcePlan` of ``crl-bench plan --gpus N``'s layout for ``cfg`` (a
    ``RunConfig``): the memory plan's engines (each over its tensor-parallel GPUs) and learner
    ranks per role, so that what a Ray run builds is what the memory plan counted.
    ``on_gpus=False``: the same processes with no GPUs (the layout at toy size on CPUs);
    ``overrides``: other fields (env workers, CPUs)."""
    from crl_bench.distributed.memory_plan import role_specs, split_gpus

    from crl_bench.distributed.memory_plan import placement_of

    placement = placement_of(cfg)
    split = split_gpus(gpus, placement)
    if placement == "split" and any(split.get(f"{r}_colocated") for r in ("actor", "extractor")):
        raise ValueError(f"--gpus {gpus}: a role with one GPU holds its engine and its learner "
                         "on it; a split Ray plan gives each its own GPUs: use 4 or more, or "
                         "--set model.placement=colocated")
    if placement == "colocated" and split["all_colocated"]:
        raise ValueError(f"--gpus {gpus}: a colocated Ray plan gives each role GPUs of its own: "
                         "use 2 or more")
    a, x = role_specs(layout_config(cfg), split)
    g = 1.0 if on_gpus else 0.0
    colocated = placement == "colocated"
    fields = dict(
        name=name or f"layout{gpus}", placement=placement,
        actor_generation_gpus=g * a.engines * a.gpus_per_engine,
        generation_engines=a.engines, actor_training_gpus=g * a.ranks, learner_ranks=a.ranks,
        extractor_gpus=g * (x.ranks if colocated else x.engines * x.gpus_per_engine + x.ranks),
        extractor_engines=x.engines, extractor_engine_gpus=g * x.engines * x.gpus_per_engine,
        extractor_ranks=x.ranks)
    fields.update(overrides)
    return ResourcePlan(**fields)


def _fmt(x: float) -> str:
    return f"{x:g}"


def check_plan(plan: ResourcePlan, cluster: dict[str, float],
               nodes: list[dict[str, float]] | None = None) -> None:
    """Raise :class:`ResourcePlanError` when ``cluster`` (``ray.cluster_resources()``) cannot
    hold ``plan``; ``nodes`` (the ``Resources`` of each alive node in ``ray.nodes()``) adds the
    check that every single actor fits on some node (a 1-GPU rank needs a node with a GPU).

    The message names each missing resource, what it is for and what the cluster has."""
    need = plan.required()
    problems: list[str] = []
    for res in ("GPU", "CPU"):
        have = float(cluster.get(res, 0.0))
        if need[res] > have + 1e-9:
            users = [f"{part} {_fmt(count * r[res])}" for part, count, r in plan.parts()
                     if count * r.get(res, 0.0) > 0]
            problems.append(f"{_fmt(need[res])} {res} ({' + '.join(users)}), the cluster has "
                            f"{_fmt(have)} {res}: {_fmt(need[res] - have)} {res} missing")
    if nodes is not None and not problems:
        for part, count, res in plan.parts():
            if count == 0:
                continue
            fits = any(all(float(n.get(k, 0.0)) + 1e-9 >= v for k, v in res.items()) for n in nodes)
            if not fits:
                want = ", ".join(f"{_fmt(v)} {k}" for k, v in res.items() if v)
                problems.append(f"one {part} needs {want} on one node; no node has that "
                                f"(nodes: {[{k: n.get(k, 0) for k in ('CPU', 'GPU')} for n in nodes]})")
    if problems:
        raise ResourcePlanError(f"ray plan {plan.name!r} does not fit the cluster: needs "
                                + "; ".join(problems)
                                + ". Pick a smaller plan (--set ray.plan=...), lower its counts, "
                                  "or add nodes.")


def check_plan_against_ray(plan: ResourcePlan) -> None:
    """:func:`check_plan` against the connected Ray cluster."""
    from crl_bench.distributed import require_ray

    ray = require_ray()
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    check_plan(plan, ray.cluster_resources(), nodes)


# -- what a Ray run builds, as `crl-bench plan` prints it --------------------------------------
def built_topology(cfg: Any, plan: ResourcePlan) -> dict[str, Any]:
    """What a Ray run of ``cfg`` on ``plan`` builds, per role: placement, GPUs, engines (each
    with its tensor-parallel GPUs and, colocated, the bundle of the role's placement group it
    starts in), learner ranks, whether the engines sleep during the update, and the weight
    path (:func:`~crl_bench.distributed.weight_sync.sync_method`). A colocated engine over
    several bundles is built with vLLM's Ray executor: ``worker_bundles`` are its
    tensor-parallel workers' bundles and ``ray_executor_env`` what its actor sets for vLLM
    (:meth:`ResourcePlan.ray_executor_env`). The toy paper-topology test compares it with what
    the running actors report."""
    from crl_bench.distributed.weight_sync import sync_method

    out: dict[str, Any] = {"placement": plan.placement, "plan": plan.name,
                           "gpus": plan.required()["GPU"]}
    device = str(cfg.model.device)
    if device == "auto":
        device = "cuda" if plan.required()["GPU"] else "cpu"
    for role in ("actor", "extractor"):
        if role == "actor":
            engines, ranks, tp = plan.generation_engines, plan.learner_ranks, plan.gpus_per_engine
        else:
            if not plan.sharded_extractor:
                continue
            engines, ranks = plan.extractor_engines, plan.extractor_ranks
            tp = plan.gpus_per_extractor_engine
        workers = plan.worker_bundles(role) if plan.colocated else []
        spans = any(len(b) > 1 for b in workers)
        out[role] = {
            "gpus": plan.role_gpus(role), "engines": engines, "gpus_per_engine": tp,
            "ranks": ranks, "sleep_wake": plan.colocated,
            "engine_bundles": plan.engine_bundles(role) if plan.colocated else None,
            "worker_bundles": workers if spans else None,
            "ray_executor_env": plan.ray_executor_env(role) if spans else None,
            "weight_sync": sync_method(plan.weight_sync, device, str(cfg.model.backend),
                                       plan.colocated)}
    return out


def format_topology(topo: dict[str, Any]) -> list[str]:
    """``crl-bench plan``'s lines for :func:`built_topology`."""
    how = ("colocated: each role's engines and learner ranks share its GPUs, one placement "
           "group per role" if topo["placement"] == "colocated" else
           "split: engines and learner ranks on GPUs of their own")
    out = [f"built on Ray (plan {topo['plan']!r}, {topo['gpus']:g} GPUs): {how}"]
    for role in ("actor", "extractor"):
        r = topo.get(role)
        if r is None:
            continue
        bundles = (f", engines starting on bundles {r['engine_bundles']}"
                   if r["engine_bundles"] is not None else "")
        weights = f"weights by {r['weight_sync']}"
        if r["worker_bundles"] is not None:
            share = r["ray_executor_env"][0]["VLLM_RAY_PER_WORKER_GPUS"]
            bundles += (f", their tensor-parallel workers (vLLM's Ray executor, {share} GPU "
                        f"each) on bundles {r['worker_bundles']}")
            if r["weight_sync"] == "cuda_ipc":
                weights += " (each worker's from the rank on its GPU)"
        out.append(f"  {role}: {r['gpus']:g} GPUs; {r['engines']} engine(s) x "
                   f"{r['gpus_per_engine']:g} GPU{bundles}; {r['ranks']} FSDP rank(s); "
                   f"{'engines sleep during the update, wake before the push' if r['sleep_wake'] else 'engines stay awake'}; "
                   f"{weights}")
    return out


def role_group(plan: ResourcePlan, role: str) -> Any:
    """Colocated: the placement group of ``role`` (:meth:`ResourcePlan.role_bundles`, PACK),
    ready; its engines start in :meth:`~ResourcePlan.engine_bundles`, its ranks in bundle r."""
    from crl_bench.distributed import require_ray

    ray = require_ray()
    from ray.util.placement_group import placement_group

    group = placement_group(plan.role_bundles(role), strategy="PACK")
    ray.get(group.ready())
    return group
