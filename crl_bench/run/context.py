"""The run context: the parts of a run (:mod:`crl_bench.run.parts`), built once, and the
verbs an agent's step is written in.

An agent's :meth:`~crl_bench.agent.Agent.build` asks for parts (``build_models``,
``build_actor_trainer``, ``build_experience``, ``build_extractor``); its
:meth:`~crl_bench.agent.Agent.train_step` uses the verbs: :meth:`RunContext.plan` task groups,
:meth:`RunContext.play` them, :meth:`RunContext.returns` / :meth:`RunContext.advantages`,
:meth:`RunContext.update_actor`, and hands the episodes to ``ctx.extractor``. The loop
(:mod:`crl_bench.run.loop`) owns evaluation, records and checkpoints (a loop over
:attr:`RunContext.parts`).

Which implementation of each part a run gets is the context's: this one builds every part in
this process; :func:`crl_bench.distributed.context.ray_context` builds their Ray
implementations.
"""

from __future__ import annotations

from typing import Any

from crl_bench.mixes import resolve_tasks
from crl_bench.config.schema import RunConfig
from crl_bench.run.parts import (ActorSide, ExperienceSide, GroupPlan, LockedBackend, Models,
                                    Part, Player, RunInfo, Seeds, WaitTimingLock)
from crl_bench.run.parts.models import extractor_generate
from crl_bench.run.parts.player import check_family_available
from crl_bench.run.parts.seeds import sampling_seed, train_seed
from crl_bench.records.files import RunDir

__all__ = ["GroupPlan", "LockedBackend", "RunContext", "WaitTimingLock", "check_family_available",
           "extractor_generate", "sampling_seed", "train_seed"]


def _member(part: str, name: str) -> property:
    """``ctx.<name>``: the attribute ``name`` of the part ``ctx.<part>`` (read and write)."""
    return property(lambda self: getattr(getattr(self, part), name),
                    lambda self, value: setattr(getattr(self, part), name, value),
                    doc=f"``{part}.{name}``")


class RunContext:
    """A run's parts and the verbs agents use. Parts an agent did not ask for stay empty.

    Attributes:
        cfg: the run's :class:`RunConfig`; run: the :class:`RunDir`; tasks: the mix's tasks.
        seeds, models, actor, experience, player: the parts (:mod:`crl_bench.run.parts`).
        step: the actor step being played (0 during the first evaluation).
    """

    def __init__(self, cfg: RunConfig, run_dir: RunDir) -> None:
        self.cfg = cfg
        self.run = run_dir
        self.tasks = resolve_tasks(cfg.tasks)
        from crl_bench.run.progress import NullProgress

        self.info = RunInfo(cfg, run_dir, tuple(self.tasks), progress=NullProgress())
        self.seeds = Seeds(self.info)
        self.make_parts()

    def make_parts(self) -> None:
        """Build the parts' implementations (here: all in this process)."""
        self.models: Models = Models(self.info)
        self.actor: ActorSide = ActorSide(self.info, self.models)
        self.experience: ExperienceSide = ExperienceSide(self.info, self.models)
        self.player: Player = Player(self.info, self.models, self.experience)

    @property
    def parts(self) -> tuple[Part, ...]:
        """The parts in checkpoint order (the models before the trainers that step them; the
        RNG first, so that batches resubmitted on resume sample as they would have)."""
        return (self.seeds, self.models, self.actor, self.experience, self.player)

    # -- the run's shared state ----------------------------------------------------------------
    @property
    def step(self) -> int:
        return self.info.step

    @step.setter
    def step(self, value: int) -> None:
        self.info.step = value

    @property
    def timings(self) -> dict[str, float]:
        """``timing_s/...`` of the current step (the loop writes and resets them)."""
        return self.info.timings

    @property
    def progress(self) -> Any:
        """The run's :class:`~crl_bench.run.progress.ProgressReporter` (the loop sets it)."""
        return self.info.progress

    @progress.setter
    def progress(self, value: Any) -> None:
        self.info.progress = value

    # -- the parts' members, by the names agents and tools use ----------------------------------
    lock = _member("models", "lock")
    raw_backend = _member("models", "raw_backend")
    ext_raw = _member("models", "ext_raw")
    backend = _member("models", "backend")
    ext_backend = _member("models", "ext_backend")
    ext_host = _member("experience", "host")
    extractor_runs = _member("experience", "runs")
    actor_sampling = _member("models", "actor_sampling")
    extractor_sampling = _member("models", "extractor_sampling")
    actor_host = _member("actor", "host")
    extractor_trainer = _member("experience", "trainer")
    manager = _member("experience", "manager")
    extractor = _member("experience", "extractor")
    task_scores = _member("player", "task_scores")

    # -- building (an agent's build()) ---------------------------------------------------------
    def seed_everything(self) -> None:
        self.seeds.seed_everything()

    def check_tasks(self) -> None:
        self.player.check_tasks()

    def build_models(self, *, extractor: bool, shared_params: bool = False) -> None:
        """See :meth:`Models.build <crl_bench.run.parts.models.Models.build>`."""
        self.models.build(extractor=extractor, shared_params=shared_params)

    def build_actor_trainer(self) -> None:
        self.actor.build_trainer()

    def build_experience(self, *, diversify: bool = True, search_ask: bool = False,
                         gate: bool = False) -> None:
        """The bank (``RUN_DIR/bank.sqlite``), the embedder and the manager. ``search_ask``: the
        with-experience episodes may query the bank mid-episode (train and evaluation).
        ``gate``: the actor accepts / refines / rejects each retrieved entry before it acts."""
        self.experience.build_bank(diversify=diversify, search_ask=search_ask, gate=gate)

    def build_extractor(self, extractor_step: Any, *, train: bool, merge: bool = True) -> None:
        """See :meth:`ExperienceSide.build_extractor
        <crl_bench.run.parts.experience.ExperienceSide.build_extractor>`."""
        self.experience.build_extractor(extractor_step, train=train, merge=merge)

    # -- the verbs (an agent's train_step()) ---------------------------------------------------
    def plan(self, step: int, *, with_experience: int = 0) -> list[GroupPlan]:
        return self.player.plan(step, with_experience=with_experience)

    def eval_plan(self, with_experience: bool) -> list[GroupPlan]:
        return self.player.eval_plan(with_experience)

    def play(self, phase: str, step: int, plan: list[GroupPlan], *,
             sampling_seed: int | None = None) -> list[Any]:
        """See :meth:`Player.play <crl_bench.run.parts.player.Player.play>`."""
        return self.player.play(phase, step, plan, sampling_seed=sampling_seed)

    def returns(self, trajectories: list[Any]) -> Any:
        return self.actor.returns(trajectories)

    def advantages(self, trajectories: list[Any], returns: Any, *, split: bool) -> Any:
        return self.actor.advantages(trajectories, returns, split=split)

    def update_actor(self, trajectories: list[Any], advantages: Any, *, loss: str | None = None,
                     loss_args: dict[str, Any] | None = None) -> dict[str, float]:
        """One actor update; ``loss``/``loss_args``: the agent's own policy loss (see
        :meth:`ActorSide.update <crl_bench.run.parts.actor.ActorSide.update>`)."""
        return self.actor.update(trajectories, advantages, loss=loss, loss_args=loss_args)

    def extractor_generate(self, message_lists: list[list[dict]], stop: tuple[str, ...] = ()
                           ) -> list[Any]:
        """The extractor role (in its worker process under ``extractor.runs: process``)."""
        return self.experience.generate(message_lists, stop)

    def take_extractor_wait(self) -> float:
        """Seconds the actor loop (the main thread) waited on the extractor since the last call:
        on the shared model's lock, and on the worker while the track's call ran there."""
        return self.models.lock.take_wait("MainThread") + self.experience.take_wait("MainThread")

    def env_kwargs(self, task: Any, phase: str) -> dict[str, Any]:
        return self.player.env_kwargs(task, phase)

    def envs_for(self, task: Any, phase: str, n: int) -> list[Any]:
        return self.player.envs_for(task, phase, n)

    def wait_for_bank(self) -> None:
        self.experience.wait_for_bank()

    def take_extractor_metrics(self) -> list[dict[str, Any]]:
        """Metrics of extractor batches finished since the last call."""
        return self.experience.take_metrics()

    def close(self) -> None:
        """Close every part (the last built first); the first error is raised after all."""
        error: BaseException | None = None
        for part in reversed(self.parts):
            try:
                part.close()
            except Exception as exc:  # noqa: BLE001 - the others still close
                error = error or exc
        if error is not None:
            raise error
