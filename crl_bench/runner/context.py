"""The run context: the parts of a run, built once, and the verbs an agent's step is written in.

An agent's :meth:`~crl_bench.agent.Agent.build` asks for parts (``build_actor_trainer``,
``build_experience``, ``build_extractor``); its :meth:`~crl_bench.agent.Agent.train_step` uses
the verbs: :meth:`RunContext.plan` task groups, :meth:`RunContext.play` them,
:meth:`RunContext.returns` / :meth:`RunContext.advantages`, :meth:`RunContext.update_actor`.
The loop (:mod:`crl_bench.runner.loop`) owns evaluation, records and checkpoints.

The generation backend is shared by the actor loop and the extractor track (a background
thread); a lock serialises model calls, and the time the actor loop waited for it while the
track held it is logged as ``timing_s/extractor_wait``. With ``extractor.runs: process`` the
extractor's model and trainer live in a worker process
(:class:`~crl_bench.extractor.worker.ExtractorWorker`) and no lock is shared: the actor loop
waits only where it calls the extractor itself (Search-and-Ask) while the track's call runs.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from crl_bench.mixes import EVAL_SEED_BLOCK, MixTask, resolve_tasks
from crl_bench.runner.config import ConfigError, RunConfig
from crl_bench.runner.records import RunDir

if TYPE_CHECKING:  # pragma: no cover  (the parts' types; the Ray context puts proxies there)
    import gymnasium

    from crl_bench.experience.manager import ExperienceManager
    from crl_bench.extractor.track import ExtractorTrack
    from crl_bench.llm.backend import Backend
    from crl_bench.runner.trainer import RoleTrainer


def train_seed(run_seed: int, index: int, eval_seed_offset: int) -> int:
    """The env seed of a run's ``index``-th training group (``step * groups + group``).

    ``run_seed * 1_000_003 + index`` (runs of different seeds play disjoint level ranges for
    their first million groups), moved past the block of seeds reserved for evaluation,
    ``[eval_seed_offset, eval_seed_offset + EVAL_SEED_BLOCK)``, when it would land in or after
    it: no training episode of any run seed plays a held-out level. (Before, run seed 1 trained
    on seeds 1,000,003 and up, i.e. on the evaluation's own levels 3, 4, ....) The shift is the
    same for every seed past the offset, so the map stays one-to-one; run seed 0 is unchanged.
    """
    raw = run_seed * 1_000_003 + index
    return raw + EVAL_SEED_BLOCK if raw >= eval_seed_offset else raw


def sampling_seed(run_seed: int, step: int, phase: str = "train") -> int:
    """The sampling seed of a step's episodes: ``run_seed * 7919 + step`` for training, and for
    the evaluation at ``step`` the same moved by 10,007. Each run seed samples its own actions
    (runs of different seeds are independent replicates, so a confidence interval over seeds
    means something) on the same held-out task instances, and an evaluation's seed never equals
    a training step's seed within 10,007 steps."""
    base = run_seed * 7919 + step
    return base if phase == "train" else 10_007 + base


class WaitTimingLock:
    """An RLock that adds the time each thread spent blocked on it to ``waits[thread name]``."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.waits: dict[str, float] = {}
        self._meta = threading.Lock()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(blocking=False):
            return True
        start = time.perf_counter()
        ok = self._lock.acquire(blocking, timeout)
        waited = time.perf_counter() - start
        name = threading.current_thread().name
        with self._meta:
            self.waits[name] = self.waits.get(name, 0.0) + waited
        return ok

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> "WaitTimingLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def take_wait(self, name: str) -> float:
        with self._meta:
            return self.waits.pop(name, 0.0)


class LockedBackend:
    """Proxy that holds the model lock around every call into the backend."""

    def __init__(self, backend: Any, lock: WaitTimingLock) -> None:
        self._backend = backend
        self._lock = lock

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._backend, name)
        if name == "tokenizer":  # callable itself, and its methods (apply_chat_template) too
            return LockedBackend(attr, self._lock)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return attr(*args, **kwargs)
        return call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return self._backend(*args, **kwargs)


@dataclass(frozen=True)
class GroupPlan:
    """One task group of a step: ``size`` episodes of one task instance (``seed``); the first
    ``with_experience`` of them get entries retrieved at episode start."""

    task: MixTask
    seed: int
    group_id: int
    with_experience: int
    size: int


def extractor_generate(backend: Any, sampling: Any, message_lists: list[list[dict]],
                       stop: tuple[str, ...] = ()) -> list[Any]:
    """One batched extractor call. A message list ending with an assistant message is a pre-fill:
    the assistant turn starts with that text (prompt tokens) and the model continues it.
    ``stop`` replaces the default stop strings."""
    prompts = []
    for m in message_lists:
        if m and m[-1].get("role") == "assistant":
            ids = backend.chat_prompt_ids(m[:-1])
            ids += backend.tokenizer(m[-1]["content"], add_special_tokens=False)["input_ids"]
        else:
            ids = backend.chat_prompt_ids(m)
        prompts.append(ids)
    if stop:
        sampling = dataclasses.replace(sampling, stop=tuple(stop))
    return backend.generate(prompts, sampling, adapter="extractor")


def check_family_available(task: MixTask, make_kwargs: dict[str, Any]) -> None:
    """Make one env of ``task``; on failure say which family is missing and how to get it."""
    import gymnasium

    from crl_bench.registry import ENVS

    if task.env_id not in ENVS:
        raise ConfigError(
            f"Task {task.name!r} needs env {task.env_id!r} (family {task.family!r}), which is not "
            f"registered in this installation. Install the family's extra "
            f"(pip install -e '.[{task.family}]') or pick another task set; `crl-bench list envs` "
            "shows what is available.")
    try:
        env = gymnasium.make(task.env_id, **make_kwargs)
        env.close()
    except Exception as exc:
        raise ConfigError(f"Task {task.name!r} ({task.env_id}) cannot start: {type(exc).__name__}: "
                          f"{exc}") from exc


SWE_VERIFIED_ENV = "CRL_BENCH_SWE_VERIFIED"
"""Path of a SWE-bench Verified instances file (.json/.jsonl, the docker backend runs them)."""


def swe_verified_file() -> Any:
    """The SWE-bench Verified instances file named by ``$CRL_BENCH_SWE_VERIFIED`` if it exists,
    else None. Under ``--preset paper`` SWE is then evaluated on it (the paper's benchmark);
    without it SWE trains and evaluates on our ``mini`` task set, as under every other preset."""
    import os
    from pathlib import Path

    value = os.environ.get(SWE_VERIFIED_ENV, "").strip()
    path = Path(value) if value else None
    return path if path is not None and path.is_file() else None


sampling_seed_of = sampling_seed  # the module function, where ``play`` has an argument of its name


class RunContext:
    """Everything a run builds once: config, tasks, envs, the model backend, trainers, the bank
    and the extractor track. Parts an agent did not ask for stay ``None``.

    Attributes:
        cfg: the run's :class:`RunConfig`.
        run: the :class:`RunDir` (records, checkpoints, the bank file).
        tasks: the resolved task list of the mix.
        actor_trainer: the actor's :class:`~crl_bench.runner.trainer.RoleTrainer` (None: frozen).
        manager: the :class:`~crl_bench.experience.manager.ExperienceManager` (None: no bank).
        extractor: the :class:`~crl_bench.extractor.track.ExtractorTrack` (None: no extractor).
        step: the actor step being played (0 during the first evaluation).
    """

    def __init__(self, cfg: RunConfig, run_dir: RunDir) -> None:
        self.cfg = cfg
        self.run = run_dir
        self.tasks = resolve_tasks(cfg.tasks)
        self.step = 0
        self.lock = WaitTimingLock()
        self._envs: dict[tuple[str, str], list[gymnasium.Env]] = {}
        self.raw_backend: Backend | None = None
        self.ext_raw: Backend | None = None
        self.backend: LockedBackend | None = None
        self.ext_backend: LockedBackend | None = None
        self.actor_trainer: RoleTrainer | None = None
        self.extractor_trainer: RoleTrainer | None = None
        self.manager: ExperienceManager | None = None
        self.extractor: ExtractorTrack | None = None
        self.extractor_runs = "inline"
        """Where the extractor runs (``extractor.runs``, after :meth:`_resolve_extractor_runs`)."""
        self.ext_worker: Any = None
        """The :class:`~crl_bench.extractor.worker.ExtractorWorker` (``extractor.runs: process``)."""
        self.search_ask = False
        self.gate = False
        """The actor judges each retrieved entry before acting (accept / refine / reject;
        :mod:`crl_bench.extractor.gate`); set by :meth:`build_experience`."""
        self.task_scores: dict[str, list[float]] = {}
        """Per task: [score sum, episodes] of training episodes (the gate's historical performance)."""
        self.timings: dict[str, float] = {}
        """``timing_s/...`` of the current step (the loop writes and resets them)."""
        from crl_bench.runner.progress import NullProgress

        self.progress: Any = NullProgress()
        """The run's :class:`~crl_bench.runner.progress.ProgressReporter` (the loop sets it)."""
        self._extractor_metrics: list[dict[str, Any]] = []
        self._extractor_metrics_lock = threading.Lock()

    # -- building ------------------------------------------------------------------------------
    def seed_everything(self) -> None:
        """torch's thread count (``threads``) and the run seed in every RNG."""
        import numpy as np
        import torch

        if self.cfg.threads:
            torch.set_num_threads(self.cfg.threads)
        random.seed(self.cfg.seed)
        np.random.seed(self.cfg.seed)
        torch.manual_seed(self.cfg.seed)

    def check_tasks(self) -> None:
        """Make one env of every task: a missing family is named before any model loads."""
        for task in self.tasks:
            check_family_available(task, self.env_kwargs(task, "train"))

    def build_models(self, *, extractor: bool, shared_params: bool = False) -> None:
        """The generation/training backend(s): one base model with an ``actor`` adapter (and an
        ``extractor`` adapter, or one adapter both roles share); or, when ``model.extractor``
        names another model (the paper: Qwen3-4B beside a Qwen2.5-7B actor), one backend per
        role."""
        from crl_bench.llm.backend import backend_class
        from crl_bench.llm.types import LoraSpec, SamplingParams

        m = self.cfg.model
        backend_cls = backend_class(m.backend)
        # lora_r=0: full fine-tuning (the official runs train every parameter of both models)
        lora = LoraSpec(r=m.lora_r, alpha=m.lora_alpha) if m.lora_r > 0 else None
        common: dict[str, Any] = dict(lora=lora, dtype=m.dtype, device=m.device, seed=self.cfg.seed)
        if m.backend == "hf":
            common["max_batch_size"] = m.max_batch_size
        roles = ("actor", "extractor") if extractor else ("actor",)
        # shared parameters: one model serves both roles, so the actor's model is the extractor's
        # too (model.extractor is not used; the ablation is a single switch, also under `paper`)
        if extractor and m.extractor and m.extractor != m.actor and not shared_params:
            self.raw_backend = backend_cls(m.actor, roles=("actor",), **common)
            self.ext_raw = backend_cls(m.extractor, roles=("extractor",), **common)
        else:
            self.raw_backend = backend_cls(m.actor, roles=roles, shared_adapter=shared_params, **common)
            self.ext_raw = self.raw_backend
        self.backend = LockedBackend(self.raw_backend, self.lock)
        self.ext_backend = (self.backend if self.ext_raw is self.raw_backend
                            else LockedBackend(self.ext_raw, self.lock))
        r, e = self.cfg.rollout, self.cfg.extractor
        self.actor_sampling = SamplingParams(temperature=r.temperature, top_p=r.top_p,
                                             top_k=r.top_k, max_new_tokens=r.max_new_tokens)
        self.extractor_sampling = SamplingParams(temperature=e.temperature, top_p=e.top_p,
                                                 top_k=e.top_k, max_new_tokens=e.max_new_tokens,
                                                 stop=("</answer>",))

    def build_actor_trainer(self) -> None:
        from crl_bench.runner.trainer import RoleTrainer

        self.actor_trainer = RoleTrainer(self.raw_backend, "actor", self.cfg.actor,
                                         total_steps=self.cfg.steps, lock=self.lock, seed=self.cfg.seed)

    def build_experience(self, *, diversify: bool = True, search_ask: bool = False,
                         gate: bool = False) -> None:
        """The bank (``RUN_DIR/bank.sqlite``), the embedder and the manager. ``search_ask``: the
        with-experience episodes may query the bank mid-episode (train and evaluation).
        ``gate``: the actor accepts / refines / rejects each retrieved entry before it acts."""
        from crl_bench.experience.manager import RetrievalConfig

        x = self.cfg.experience
        retrieval = RetrievalConfig(k=x.k, oversample=x.oversample, diversify=diversify, lam=x.lam,
                                    recent_s=x.recent_s, drop_recent_top1_p=x.drop_recent_top1_p,
                                    seed=self.cfg.seed, usage_per=x.usage_per)
        self.manager = self.new_manager(retrieval)
        self.search_ask = search_ask
        self.gate = gate

    def new_manager(self, retrieval: Any) -> Any:
        """The experience manager over ``RUN_DIR/bank.sqlite`` with ``retrieval`` settings; its
        recency runs on the run's logical clock (steps, see ``RetrievalConfig.step_s``), not wall
        time, so that a resumed run takes the uninterrupted run's decisions."""
        from crl_bench.experience.bank import ExperienceBank
        from crl_bench.experience.embedder import load_embedder
        from crl_bench.experience.manager import ExperienceManager, step_clock

        x = self.cfg.experience
        embedder = load_embedder(x.embedder)
        bank = ExperienceBank(self.run.bank_path, dim=embedder.dim, capacity=x.capacity,
                              embedder_name=embedder.name)
        clock = step_clock(lambda: self.step, retrieval.step_s,
                           origin=float(bank.meta.get("created_at", 0.0)))
        return ExperienceManager(bank, embedder, retrieval, clock=clock)

    def build_extractor(self, extractor_step: Any, *, train: bool, merge: bool = True) -> None:
        """The extractor track (after :meth:`build_experience`), running the agent's
        ``extractor_step`` on each step's episodes. ``train``: give the extractor its own
        optimiser (on the shared adapter when the parameters are shared). ``merge``: the bank
        is merged every ``experience.merge_every`` steps (False: never)."""
        from crl_bench.runner.trainer import RoleTrainer

        if self.manager is None:
            raise RuntimeError("build_experience() must come before build_extractor()")
        x = self.cfg.experience
        self.extractor_runs = self._resolve_extractor_runs()
        if train and self.extractor_runs != "process":  # else the worker's, see new_track
            self.extractor_trainer = RoleTrainer(self.ext_raw, "extractor", self.cfg.extractor,
                                                 total_steps=self.cfg.steps, lock=self.lock,
                                                 seed=self.cfg.seed + 1)
        settings = dict(extractor_step=extractor_step,
                        temperature=self.extractor_sampling.logprob_temperature,
                        merge_every=x.merge_every if merge else 0, merge_chunk=x.merge_chunk,
                        asynchronous=self.extractor_runs != "inline", run_name=self.run.path.name,
                        key_by_episode_start=x.key == "episode_start",
                        fence_merges=(self.cfg.extractor.fence == "official"
                                      and self.cfg.extractor.wait_before_rollout))
        self.extractor = self.new_track(settings, train=train)

    def new_track(self, settings: dict[str, Any], *, train: bool) -> Any:
        """The :class:`~crl_bench.extractor.track.ExtractorTrack` with ``settings`` (its keyword
        arguments but ``log``) over this context's manager, extractor model and trainer."""
        from crl_bench.extractor.track import ExtractorTrack

        if self.extractor_runs == "process":
            self._start_extractor_worker(train=train)
        return ExtractorTrack(self.manager, self.extractor_generate, self.extractor_trainer,
                              self.cfg.extractor, log=self._log_extractor, **settings)

    def _log_extractor(self, metrics: dict[str, Any]) -> None:
        with self._extractor_metrics_lock:
            self._extractor_metrics.append(metrics)

    def take_extractor_metrics(self) -> list[dict[str, Any]]:
        """Metrics of extractor batches finished since the last call."""
        with self._extractor_metrics_lock:
            done, self._extractor_metrics = self._extractor_metrics, []
        return done

    def put_back_extractor_metrics(self, metrics: list[dict[str, Any]]) -> None:
        with self._extractor_metrics_lock:
            self._extractor_metrics = list(metrics) + self._extractor_metrics

    # -- the extractor in its own process (extractor.runs: process) ----------------------------
    def _resolve_extractor_runs(self) -> str:
        """``extractor.runs``; "process" with parameters shared between actor and extractor
        (one set of weights, trained by both roles) runs as "thread", and says so."""
        import sys

        runs = self.cfg.extractor.runs
        if runs == "process" and getattr(self.ext_raw, "shared_adapter", False):
            print("[crl-bench] extractor.runs=process: the actor and the extractor share their "
                  "parameters (one set of weights cannot be trained in two processes), so the "
                  "extractor runs in a thread of this process (extractor.runs=thread).",
                  file=sys.stderr)
            runs = "thread"
        return runs

    def _start_extractor_worker(self, *, train: bool) -> None:
        """The extractor's model (and trainer) in a worker process built like the main
        backend's extractor role, starting from its weights; ``extractor_trainer`` becomes the
        worker's (:class:`~crl_bench.extractor.worker.WorkerTrainer`)."""
        from crl_bench.distributed.learner import role_weights
        from crl_bench.extractor.worker import ExtractorWorker, WorkerTrainer, worker_spec

        self.ext_worker = ExtractorWorker(
            self.cfg.model.backend, worker_spec(self.ext_raw, self.cfg.model, self.cfg.seed),
            self.extractor_sampling, self.cfg.extractor if train else None,
            total_steps=self.cfg.steps, trainer_seed=self.cfg.seed + 1, rng_seed=self.cfg.seed + 2,
            threads=self.cfg.threads or 1)
        with self.lock:
            self.ext_worker.load_weights(role_weights(self.ext_raw, "extractor"))
        self.extractor_trainer = WorkerTrainer(self.ext_worker, self.ext_raw) if train else None

    def pull_extractor_weights(self) -> None:
        """Before a checkpoint: the worker's extractor weights into the main model (whose
        adapters the checkpoint saves), its trainer state held for the same checkpoint. Nothing
        to do when the extractor runs in this process."""
        from crl_bench.distributed.learner import load_role_weights

        if self.ext_worker is None:
            return
        if self.extractor_trainer is not None:
            weights = self.extractor_trainer.hold_snapshot()
        else:
            weights = self.ext_worker.weights()
        with self.lock:
            load_role_weights(self.ext_raw, "extractor", weights)

    def take_extractor_wait(self) -> float:
        """Seconds the actor loop (the main thread) waited on the extractor since the last call:
        on the shared model's lock, and on the worker while the track's call ran there."""
        wait = self.lock.take_wait("MainThread")
        if self.ext_worker is not None:
            wait += self.ext_worker.take_wait("MainThread")
        return wait

    # -- model calls ---------------------------------------------------------------------------
    def extractor_generate(self, message_lists: list[list[dict]], stop: tuple[str, ...] = ()
                           ) -> list[Any]:
        """The extractor role (see :func:`extractor_generate`), in the worker when there is one."""
        if self.ext_worker is not None:
            return self.ext_worker.generate(message_lists, stop)
        return extractor_generate(self.ext_backend, self.extractor_sampling, message_lists, stop)

    # -- envs and episodes ---------------------------------------------------------------------
    def env_kwargs(self, task: MixTask, phase: str) -> dict[str, Any]:
        kwargs = dict(task.train_kwargs if phase == "train" else task.eval_kwargs)
        verified = swe_verified_file() if self.cfg.preset == "paper" else None
        if verified is not None and task.family == "swe" and phase != "train":
            # the paper evaluates SWE on SWE-bench Verified: used where its data exists
            kwargs.update(task_set=str(verified), split="all")
        kwargs.update(self.cfg.rollout.env_kwargs.get(task.family, {}))
        cap = self.cfg.rollout.env_max_steps.get(task.family)
        if cap:
            kwargs.setdefault("max_steps", cap)
        return kwargs

    def envs_for(self, task: MixTask, phase: str, n: int) -> list[Any]:
        import gymnasium

        pool = self._envs.setdefault((task.env_id, phase), [])
        while len(pool) < n:
            pool.append(gymnasium.make(task.env_id, **self.env_kwargs(task, phase)))
        return pool[:n]

    def plan(self, step: int, *, with_experience: int = 0) -> list[GroupPlan]:
        """The step's G task groups (tasks of the mix in turn, a fresh seed each), K episodes
        each, the first ``with_experience`` of every group with retrieved experience."""
        r = self.cfg.rollout
        plan = []
        for g in range(r.groups):
            task = self.tasks[(step * r.groups + g) % len(self.tasks)]
            seed = train_seed(self.cfg.seed, step * r.groups + g, task.eval_seed_offset)
            plan.append(GroupPlan(task, seed, g, with_experience, r.group_size))
        return plan

    def eval_plan(self, with_experience: bool) -> list[GroupPlan]:
        n = self.cfg.eval.episodes_per_task
        return [GroupPlan(task, task.eval_seed_offset + i, ti * n + i, int(with_experience), 1)
                for ti, task in enumerate(self.tasks) for i in range(n)]

    def _episode_specs(self, phase: str, step: int, plan: list[GroupPlan]) -> list[Any]:
        """All K episodes of a group share the seed, i.e. the same task instance."""
        from crl_bench.experience.manager import retrieval_query
        from crl_bench.llm.rollout import EpisodeSpec

        specs = []
        gates: list[tuple[Any, str]] = []
        by_task: dict[str, int] = {}
        for g in plan:
            used = by_task.get(g.task.env_id, 0)
            envs = self.envs_for(g.task, phase, used + g.size)[used:used + g.size]
            by_task[g.task.env_id] = used + g.size
            retrieved: list[list[Any]] = [[] for _ in range(g.size)]
            query = goal = first_obs = None
            # the episode's starting query (goal + first observation): the retrieval query, and
            # with experience.key="episode_start" the key its distilled entries are stored under
            if self.manager is not None and (g.with_experience or self.cfg.experience.key == "episode_start"):
                try:
                    obs, info = envs[0].reset(seed=g.seed)
                except Exception:  # noqa: BLE001 - the engine's own reset records the env error
                    obs, info = None, None
                if info is not None:
                    goal, first_obs = str(info.get("goal", "")), str(obs)
                    query = retrieval_query(g.task.family, goal, first_obs,
                                            self.cfg.experience.query)
                    if g.with_experience:
                        retrieved[:g.with_experience] = self.manager.retrieve(
                            [query] * g.with_experience, family=g.task.family)
            for i, env in enumerate(envs):
                entries = retrieved[i]
                meta = {"family": g.task.family, "env_id": g.task.env_id, "phase": phase, "step": step}
                if query is not None:
                    meta["query"] = query
                specs.append(EpisodeSpec(
                    env=env, seed=g.seed, options=None, group_id=g.group_id, task_name=g.task.name,
                    with_experience=i < g.with_experience, experience_ids=[e.id for e in entries],
                    experience_text="\n".join(e.render() for e in entries),
                    meta=meta))
                if self.gate and entries:
                    gates.append((specs[-1], f"Goal: {goal}\nObservation: {first_obs}"))
        if gates:
            self._run_gate(gates)
        return specs

    def _run_gate(self, gates: list[tuple[Any, str]]) -> None:
        """The accept / refine / reject gate (:mod:`crl_bench.extractor.gate`): one batched actor
        call judges the entry each with-experience episode was given; the verdict sets what the
        episode is shown (``experience_text``) and, through ``meta["gate"]``, the credit it gives
        (:func:`~crl_bench.extractor.gate.gate_credit`). Unparseable: nothing shown, no credit."""
        from crl_bench.extractor.gate import gate_messages, parse_gate
        from crl_bench.runner.trainer import timed

        prompts = []
        for spec, task_prompt in gates:
            total, n = self.task_scores.get(spec.task_name, (0.0, 0))
            prompts.append(self.backend.chat_prompt_ids(gate_messages(
                task_prompt, spec.experience_text, total / max(n, 1), int(n))))
        with timed(self.timings, "timing_s/gate"):
            generations = self.backend.generate(prompts, self.actor_sampling, adapter="actor")
        for (spec, _), gen in zip(gates, generations):
            decision = parse_gate(gen.text, spec.experience_text)
            verdict = decision.verdict or "invalid"
            if self.extractor is not None:  # logged as extractor/gate_<verdict> (run totals)
                key = f"gate_{verdict}"
                self.extractor.stats[key] = self.extractor.stats.get(key, 0) + 1
            spec.meta["gate"] = decision.verdict
            spec.experience_text = decision.knowledge
            if decision.verdict is None:  # official: memory_uids = [] (nothing shown)
                if self.cfg.experience.gate_invalid_credit:  # writers still credited (score)
                    spec.meta["credit_ids"] = list(spec.experience_ids)
                spec.experience_ids = []

    def wait_for_bank(self) -> None:
        """``extractor.wait_before_rollout``: pending bank writes finish before a rollout (the
        official flush before each rollout); the wait is logged as ``timing_s/bank_wait``."""
        if self.extractor is None or not self.cfg.extractor.wait_before_rollout:
            return
        from crl_bench.runner.trainer import timed

        fenced = self.cfg.extractor.fence == "official"
        if fenced and self.extractor.training:  # official: no flush (nor merge) while it trains
            self.extractor.stats["flush_skipped"] = self.extractor.stats.get("flush_skipped", 0) + 1
            return
        with timed(self.timings, "timing_s/bank_wait"):
            self.extractor.wait_writes()
        every = self.cfg.experience.merge_every
        if fenced and self.extractor.merge_every and every and self.step % every == 0:
            with timed(self.timings, "timing_s/merge"):  # the merge sits inside the flush
                self._log_extractor({"step": self.step, **self.extractor.merge(self.step)})

    def _engine(self, ask: Any, seed: int) -> Any:
        from crl_bench.llm.rollout import PromptConfig, RolloutEngine

        r = self.cfg.rollout
        sampling = dataclasses.replace(self.actor_sampling, seed=seed)
        kwargs = dict(history=r.history, think=r.think, max_episode_tokens=r.max_episode_tokens,
                      sequence_length=r.sequence_length or None,
                      ask_style=self.cfg.experience.ask_style,
                      format_penalty=r.format_penalty, max_asks=self.cfg.experience.max_asks,
                      conversation=r.conversation, observation_last=r.observation_last)
        if r.small_model_prompt:
            kwargs.pop("think")
            prompt = PromptConfig.for_small_model(example_pick=r.example_pick, **kwargs)
        else:
            prompt = PromptConfig(**kwargs)
        # experience.ask_offer="with_experience": Search-and-Ask is not even offered to
        # without-experience episodes; "all": offered to every episode (official tool wrapper)
        return RolloutEngine(self.backend, sampling, prompt, adapter="actor", ask_callback=ask,
                             progress=False, on_progress=self.progress.on_play_progress,
                             ask_requires_experience=self.cfg.experience.ask_offer != "all")

    def play(self, phase: str, step: int, plan: list[GroupPlan], *,
             sampling_seed: int | None = None) -> list[Any]:
        """Play every episode of ``plan`` concurrently (one batched model call per turn), with
        the phase's sampling seed (:func:`sampling_seed`) unless ``sampling_seed`` is given.

        With Search-and-Ask on (:meth:`build_experience`) the with-experience episodes may query
        the bank; on training episodes of a trained extractor the asks become extractor samples
        credited with the asking episode's score."""
        from crl_bench.runner.trainer import timed

        self.wait_for_bank()
        specs = self._episode_specs(phase, step, plan)
        callback, ask_samples = self._ask_callback(
            self.search_ask, record=(phase == "train" and self.extractor_trainer is not None))
        self.progress.begin_play("playing" if phase == "train" else "evaluating", len(specs))
        with timed(self.timings, f"timing_s/{'rollout' if phase == 'train' else 'eval_rollout'}"):
            seed = sampling_seed_of(self.cfg.seed, step, phase) if sampling_seed is None else sampling_seed
            trajectories = self._engine(callback, seed).run(specs)
        self.progress.end_play()
        for spec, traj in zip(specs, trajectories):
            traj.meta.update(spec.meta)
            if phase == "train":  # the gate's historical performance per task
                acc = self.task_scores.setdefault(traj.task_name, [0.0, 0])
                acc[0] += float(traj.score)
                acc[1] += 1
            samples = ask_samples.get(id(spec), [])
            if samples and self.extractor is not None:
                self.extractor.add_ask_samples(samples, traj.score)
        return trajectories

    def _ask_callback(self, enabled: bool, record: bool) -> tuple[Any, dict[int, list[Any]]]:
        if not enabled or self.manager is None:
            return None, {}
        from crl_bench.extractor.search_ask import SearchAndAsk
        from crl_bench.extractor.track import ExtractorSample
        from crl_bench.runner.trainer import timed

        saa = SearchAndAsk(self.manager, self.extractor_generate, k=self.cfg.experience.ask_k,
                           style=self.cfg.experience.ask_style)
        by_episode: dict[int, list[ExtractorSample]] = {}

        def ask(query: str, spec: Any, context: dict[str, Any]) -> str:
            if not spec.with_experience and self.cfg.experience.ask_offer != "all":
                return "Searching the experience library is not available in this episode."
            before = len(saa.samples)
            with timed(self.timings, "timing_s/ask"):  # the actor's time in Search-and-Ask
                answer = saa(query, {"goal": context.get("goal", ""),
                                     "observation": context.get("observation", ""),
                                     "family": spec.meta.get("family"), "task_id": str(spec.seed)})
            if record and spec.with_experience:  # only with-memory asks are trained (official)
                for rec in saa.samples[before:]:
                    gen = rec.generation
                    by_episode.setdefault(id(spec), []).append(ExtractorSample(
                        list(gen.prompt_ids), list(gen.completion_ids), list(gen.logprobs),
                        kind="ask", created_step=self.step, malformed=bool(rec.malformed)))
            return answer
        return ask, by_episode

    # -- the step's algebra --------------------------------------------------------------------
    def returns(self, trajectories: list[Any]) -> Any:
        """Outcome reward per episode: the task score (1/0 for success tasks, WebShop's reward in
        [0, 1]) minus ``rollout.format_penalty`` per malformed turn."""
        import torch

        pen = self.cfg.rollout.format_penalty
        return torch.tensor([t.score - pen * t.n_invalid_format for t in trajectories],
                            dtype=torch.float32)

    def advantages(self, trajectories: list[Any], returns: Any, *, split: bool) -> Any:
        """Advantages inside task groups with the estimator ``actor.advantage`` (a name in
        ``ADVANTAGES``); ``split``: inside (group, with/without experience) halves."""
        import torch

        from crl_bench.algorithms.advantages import group_advantages, group_keys

        groups = torch.tensor([t.group_id for t in trajectories], dtype=torch.long)
        with_exp = torch.tensor([t.with_experience for t in trajectories], dtype=torch.bool)
        keys = group_keys(groups, with_exp, split=split)
        return group_advantages(returns, keys, method=self.cfg.actor.advantage)

    def update_actor(self, trajectories: list[Any], advantages: Any) -> dict[str, float]:
        """One actor update on ``trajectories`` (each turn carries its episode's advantage):
        one sample per turn (``actor.sample_unit: turn``) or one per episode, its whole
        conversation with the loss on every assistant turn (``trajectory``); returns
        ``losses/actor_*`` metrics."""
        from crl_bench.runner.trainer import TrainSample

        if self.actor_trainer is None:
            raise RuntimeError("update_actor() needs build_actor_trainer() in the agent's build()")
        if self.cfg.actor.sample_unit == "trajectory":
            samples = [TrainSample.from_turns(traj.turns, float(a))
                       for traj, a in zip(trajectories, advantages.tolist()) if traj.turns]
        else:
            samples = [TrainSample(turn.prompt_ids, turn.completion_ids, turn.logprobs, float(a))
                       for traj, a in zip(trajectories, advantages.tolist()) for turn in traj.turns]
        from crl_bench.runner.trainer import timed

        a = self.cfg.actor
        self.progress.set_phase("updating actor")
        with timed(self.timings, "timing_s/actor_update"):
            m = self.actor_trainer.update(samples, loss=a.loss, loss_kwargs=a.loss_kwargs(), agg=a.agg,
                                          temperature=self.actor_sampling.logprob_temperature)
        return {f"losses/actor_{k}": v for k, v in m.items()}

    def close(self) -> None:
        if self.extractor is not None:
            self.extractor.close()
        if self.ext_worker is not None:
            self.ext_worker.close()
        if self.manager is not None:
            self.manager.bank.close()
        for envs in self._envs.values():
            for env in envs:
                env.close()
