"""The experience side of a run: the bank and its manager, the extractor track and the
extractor's trainer; the pre-rollout flush.

Where the extractor works is ``extractor.runs``: ``inline`` (inside the actor loop's step),
``thread`` (a background thread; its model calls share the actor's model behind one lock) or
``process`` (the track's thread stays here, the extractor's model and trainer live in a process
of their own: the actor loop waits only where it calls the extractor itself, Search-and-Ask,
while the track's call runs there). The extractor's model and trainer are a role host
(:class:`~crl_bench.training.host.RoleHost`): a :class:`~crl_bench.training.host.LocalHost`
(inline, thread) or a :class:`~crl_bench.extractor.worker.ProcessHost` (process; on Ray a
:class:`~crl_bench.distributed.extractor.RayHost`, :meth:`ExperienceSide.new_host`)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from crl_bench.run.parts.base import Part, RunInfo
from crl_bench.run.parts.models import Models


class ExperienceSide(Part):
    """``manager``: the :class:`~crl_bench.experience.manager.ExperienceManager` over
    ``RUN_DIR/bank.sqlite`` (None: no bank); ``extractor``: the
    :class:`~crl_bench.extractor.track.ExtractorTrack` (None: no extractor); ``host``: the
    extractor's :class:`~crl_bench.training.host.RoleHost` (its model and trainer, wherever they
    run); ``trainer``: the host when the extractor trains (None: frozen). ``search_ask`` /
    ``gate``: the with-experience episodes may query the bank mid-episode / the actor judges
    each retrieved entry first.

    Checkpoint: the bank (``bank.sqlite``, with the manager's RNG, counters and query cache)
    copied under the track's lock together with the track's state, so that the two agree (a
    resumed run re-extracts exactly the batches the copy lacks); the extractor trainer's state;
    the metrics of finished batches not yet in a step record."""

    name = "experience"
    manager_has_state = True
    """The manager's RNG, counters and query cache are checkpointed (the Ray service's are not:
    it reopens the bank file and starts them afresh)."""

    def __init__(self, info: RunInfo, models: Models) -> None:
        self.info = info
        self.models = models
        self.manager: Any = None
        self.extractor: Any = None
        self.trainer: Any = None
        self.search_ask = False
        self.gate = False
        self.runs = "inline"
        """Where the extractor runs (``extractor.runs`` as resolved by :meth:`build_extractor`)."""
        self.host: Any = None
        """The extractor's :class:`~crl_bench.training.host.RoleHost`."""
        self._held_state: dict[str, Any] | None = None
        self._metrics: list[dict[str, Any]] = []
        self._metrics_lock = threading.Lock()

    # -- building ------------------------------------------------------------------------------
    def build_bank(self, *, diversify: bool = True, search_ask: bool = False,
                   gate: bool = False) -> None:
        """The bank, the embedder and the manager."""
        from crl_bench.experience.manager import RetrievalConfig

        cfg = self.info.cfg  # the retrieval section whole, with the agent's switch and the seed
        retrieval = RetrievalConfig.of(cfg.retrieval, diversify=diversify, seed=cfg.seed)
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

        x = self.info.cfg.experience
        embedder = load_embedder(x.embedder, max_tokens=x.embed_max_tokens)
        bank = ExperienceBank(self.info.run.bank_path, dim=embedder.dim, capacity=x.capacity,
                              embedder_name=embedder.name)
        clock = step_clock(lambda: self.info.step, retrieval.step_s,  # the bank's own creation
                           origin=lambda: float(bank.meta.get("created_at", 0.0)))  # (restored too)
        return ExperienceManager(bank, embedder, retrieval, clock=clock)

    def build_extractor(self, extractor_step: Any, *, train: bool, merge: bool = True) -> None:
        """The extractor track (after :meth:`build_bank`), running the agent's ``extractor_step``
        on each step's episodes. ``train``: give the extractor its own optimiser (on the shared
        adapter when the parameters are shared). ``merge``: the bank is merged every
        ``experience.merge_every`` steps (False: never)."""
        if self.manager is None:
            raise RuntimeError("build_experience() must come before build_extractor()")
        cfg = self.info.cfg
        x = cfg.experience
        self.runs = self._resolve_runs()
        settings = dict(extractor_step=extractor_step,
                        temperature=self.models.extractor_sampling.logprob_temperature,
                        merge_every=x.merge_every if merge else 0, merge_chunk=x.merge_chunk,
                        merge_scope=x.merge_scope,
                        asynchronous=self.runs != "inline", run_name=self.info.run.path.name,
                        key_by_episode_start=x.key == "episode_start",
                        fence_merges=(cfg.extractor.fence == "official"
                                      and cfg.extractor.wait_before_rollout))
        self.extractor = self.new_track(settings, train=train)

    def new_track(self, settings: dict[str, Any], *, train: bool) -> Any:
        """The :class:`~crl_bench.extractor.track.ExtractorTrack` with ``settings`` (its keyword
        arguments but ``log``) over this side's manager and the extractor's host
        (:meth:`new_host`)."""
        from crl_bench.extractor.track import ExtractorTrack

        self.host = self.new_host(train=train)
        self.trainer = self.host if train else None
        return ExtractorTrack(self.manager, self.generate, self.trainer,
                              self.info.cfg.extractor, log=self.log, **settings)

    # -- where the extractor runs (extractor.runs) ---------------------------------------------
    def new_host(self, *, train: bool) -> Any:
        """The extractor's role host: in this process behind the model lock (inline, thread),
        or in a process of its own (:meth:`process_host`). ``train``: with its own optimiser
        (on the shared adapter when the parameters are shared)."""
        from crl_bench.training.host import LocalHost
        from crl_bench.training.role_trainer import RoleTrainer

        if self.runs == "process":
            return self.process_host(train=train)
        cfg, m = self.info.cfg, self.models
        trainer = (RoleTrainer(m.ext_raw, "extractor", cfg.extractor, total_steps=cfg.steps,
                               lock=m.lock, seed=cfg.seed + 1) if train else None)
        return LocalHost(m.ext_raw, "extractor", sampling=m.extractor_sampling, trainer=trainer,
                         lock=m.lock, generator=m.ext_backend)

    def _resolve_runs(self) -> str:
        """``extractor.runs``; "process" with parameters shared between actor and extractor
        (one set of weights, trained by both roles) runs as "thread", and says so."""
        import sys

        runs = self.info.cfg.extractor.runs
        if runs == "process" and getattr(self.models.ext_raw, "shared_adapter", False):
            print("[crl-bench] extractor.runs=process: the actor and the extractor share their "
                  "parameters (one set of weights cannot be trained in two processes), so the "
                  "extractor runs in a thread of this process (extractor.runs=thread).",
                  file=sys.stderr)
            runs = "thread"
        return runs

    def process_host(self, *, train: bool) -> Any:
        """The extractor's model (and trainer) in a process of its own
        (:class:`~crl_bench.extractor.worker.ProcessHost`), built like the main backend's
        extractor role (:func:`~crl_bench.training.host.backend_spec`), starting from its
        weights."""
        from crl_bench.extractor.worker import ProcessHost
        from crl_bench.training.host import backend_spec
        from crl_bench.training.precision import role_weights

        cfg, ext_raw = self.info.cfg, self.models.ext_raw
        host = ProcessHost(
            cfg.model.backend, backend_spec(ext_raw, cfg.model, cfg.seed),
            self.models.extractor_sampling, cfg.extractor if train else None,
            total_steps=cfg.steps, trainer_seed=cfg.seed + 1, rng_seed=cfg.seed + 2,
            threads=cfg.threads or 1)
        with self.models.lock:
            host.load_weights(role_weights(ext_raw, "extractor"))
        return host

    def generate(self, message_lists: list[list[dict]], stop: tuple[str, ...] = ()) -> list[Any]:
        """The extractor role, on its host."""
        return self.host.generate(message_lists, stop)

    def take_wait(self, name: str = "MainThread") -> float:
        """Seconds thread ``name`` waited on a host of its own (a process) while the track's
        call ran there (a local host's waits are the model lock's)."""
        take = getattr(self.host, "take_wait", None)
        return take(name) if take is not None else 0.0

    def before_checkpoint(self) -> None:
        """A host that trains a copy elsewhere (``host.local`` false): its weights into the
        main model (whose adapters the checkpoint saves), its trainer state taken in the same
        cut for the same checkpoint."""
        from crl_bench.training.precision import load_role_weights

        if self.host is None or self.host.local:
            return
        snap = self.host.snapshot()
        self._held_state = snap["state"]
        with self.models.lock:
            load_role_weights(self.models.ext_raw, "extractor", snap["weights"])

    def trainer_state(self) -> dict[str, Any] | None:
        """The extractor trainer's checkpoint state (the one :meth:`before_checkpoint` took
        with the weights, when it took one)."""
        held, self._held_state = self._held_state, None
        if self.trainer is None:
            return None
        return held if held is not None else self.trainer.state_dict()

    # -- the extractor's records ---------------------------------------------------------------
    def log(self, metrics: dict[str, Any]) -> None:
        with self._metrics_lock:
            self._metrics.append(metrics)

    def take_metrics(self) -> list[dict[str, Any]]:
        """Metrics of extractor batches finished since the last call."""
        with self._metrics_lock:
            done, self._metrics = self._metrics, []
        return done

    def put_back_metrics(self, metrics: list[dict[str, Any]]) -> None:
        with self._metrics_lock:
            self._metrics = list(metrics) + self._metrics

    # -- the pre-rollout flush -----------------------------------------------------------------
    def wait_for_bank(self, *, merge: bool = True) -> None:
        """``extractor.wait_before_rollout``: pending bank writes finish before a rollout (the
        official flush before each rollout); the wait is logged as ``timing_s/bank_wait``.

        ``merge``: with official fencing the every-``merge_every`` merge sits inside this flush.
        Officially the flush (and its merge) runs once per step, before both the evaluation and
        the training rollout (``multi_agentic_pipeline.py:1237-1261``, evaluation at :1303); here
        evaluation plays after the step's training rollout, so its plays pass False and a merge
        pass runs at most once per merge step (never a second time on the same step)."""
        cfg = self.info.cfg
        if self.extractor is None or not cfg.extractor.wait_before_rollout:
            return
        from crl_bench.training.role_trainer import timed

        fenced = cfg.extractor.fence == "official"
        if fenced and merge:  # the step's flush decision (official: once, before its rollouts)
            # no flush (nor merge) while an update launched earlier is not collected
            # (pipeline.py:1237 decides before :1274 collects): the step after a launch skips
            skip = self.extractor.update_pending()
            self.extractor.collect_update()  # pipeline.py:1274, after the decision
            if skip:
                self.count("flush_skipped")
                return
        elif fenced and self.extractor.update_pending():  # evaluation: the bank as it stands
            return
        timings = self.info.timings
        with timed(timings, "timing_s/bank_wait"):
            self.extractor.wait_writes()
        every = cfg.experience.merge_every
        step = self.info.step
        # merge_period() and count(): methods, so that they answer alike in one process and
        # through the Ray track's forwarding (an attribute read there is a bound method)
        if (merge and fenced and self.extractor.merge_period() and every and step % every == 0
                and not self.extractor.merged_at(step)):
            with timed(timings, "timing_s/merge"):  # the merge sits inside the flush
                self.log({"step": step, **self.extractor.merge(step)})

    def count(self, key: str) -> None:
        """Add one to the extractor's run total ``key`` (logged as ``extractor/<key>``)."""
        if self.extractor is not None:
            self.extractor.count(key)

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self, folder: Path) -> dict[str, Any]:
        import numpy as np

        if self.manager is None:
            return {}
        manager_state: dict[str, Any] = {}

        def backup() -> None:
            # the bank and the manager's RNG, counters and query cache at the same moment
            self.manager.bank.backup(folder / "bank.sqlite")
            if self.manager_has_state:
                manager_state.update(self.manager.state())
                np.save(folder / "query_cache.npy",
                        self.manager.query_cache_vectors(manager_state["query_cache"]))
        track = None
        if self.extractor is not None:
            track = self.extractor.state(also=backup)
        else:
            backup()
        pending = self.take_metrics()  # finished batches not yet in a metrics record
        self.put_back_metrics(pending)
        return {"manager": manager_state, "track": track, "track_metrics": pending,
                "trainer": self.trainer_state()}

    def load_state_dict(self, state: dict[str, Any], folder: Path) -> None:
        """Restores the bank (the checkpoint's copy replaces the run's bank file: entries written
        after the checkpoint belong to work that is redone now), the trainer, the manager and the
        track, and resubmits the batches the checkpoint's bank lacks."""
        import numpy as np

        if self.manager is not None and (folder / "bank.sqlite").is_file():
            self.manager.bank.restore(folder / "bank.sqlite")
        if not state:
            return
        if self.trainer is not None and state.get("trainer") is not None:
            if not self.host.local:  # the checkpoint's weights, loaded into the main model first
                from crl_bench.training.precision import role_weights

                self.host.load_weights(role_weights(self.models.ext_raw, "extractor"))
            self.trainer.load_state_dict(state["trainer"])
        self.put_back_metrics(list(state.get("track_metrics", [])))
        if self.manager is not None and state.get("manager"):
            cache = folder / "query_cache.npy"
            self.manager.load_state(state["manager"], np.load(cache) if cache.is_file() else None)
        if self.extractor is not None and state.get("track"):
            from crl_bench.llm.rollout import Trajectory

            for step, trajs in self.extractor.load_state(state["track"], Trajectory):
                self.extractor.submit(step, trajs)

    def close(self) -> None:
        if self.extractor is not None:
            self.extractor.close()
        if self.host is not None:
            self.host.close()
        if self.manager is not None:
            self.manager.bank.close()
