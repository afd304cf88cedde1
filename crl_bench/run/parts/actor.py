"""The actor's side of a step: outcome returns, group advantages and the policy update."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crl_bench.run.parts.base import Part, RunInfo
from crl_bench.run.parts.models import Models


class ActorSide(Part):
    """Returns, advantages and the actor's update; :attr:`host` is the actor's
    :class:`~crl_bench.training.host.RoleHost` (None: a frozen actor): here a
    :class:`~crl_bench.training.host.LocalHost` over the actor's backend and
    :class:`~crl_bench.training.role_trainer.RoleTrainer`, on Ray its learner ranks. Its
    checkpoint state is the host's (optimiser, schedule, counters)."""

    name = "actor"

    def __init__(self, info: RunInfo, models: Models) -> None:
        self.info = info
        self.models = models
        self.host: Any = None

    def build_trainer(self) -> None:
        """The actor's host: its backend and trainer in this process."""
        from crl_bench.training.host import LocalHost
        from crl_bench.training.role_trainer import RoleTrainer

        cfg, m = self.info.cfg, self.models
        trainer = RoleTrainer(m.raw_backend, "actor", cfg.actor, total_steps=cfg.steps,
                              lock=m.lock, seed=cfg.seed)
        self.host = LocalHost(m.raw_backend, "actor", sampling=m.actor_sampling,
                              trainer=trainer, lock=m.lock)

    def returns(self, trajectories: list[Any]) -> Any:
        """Outcome reward per episode: the task score (1/0 for success tasks, WebShop's reward in
        [0, 1]) minus ``rollout.format_penalty`` per malformed turn."""
        import torch

        pen = self.info.cfg.rollout.format_penalty
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
        return group_advantages(returns, keys, method=self.info.cfg.actor.advantage)

    def update(self, trajectories: list[Any], advantages: Any, *, loss: str | None = None,
               loss_args: dict[str, Any] | None = None) -> dict[str, float]:
        """One actor update on ``trajectories`` (each turn carries its episode's advantage):
        one sample per turn (``actor.sample_unit: turn``) or one per episode, its whole
        conversation with the loss on every assistant turn (``trajectory``); returns
        ``losses/actor_*`` metrics.

        ``loss``: the agent's own policy loss (a name in ``crl_bench.algorithms.LOSSES``, e.g.
        one its plugin registers) instead of the run's ``actor.loss``; its settings are its
        registered defaults updated by ``loss_args`` (None: the run's ``actor.loss_args`` when
        the loss is the run's own)."""
        from crl_bench.training.role_trainer import TrainSample, timed

        if self.host is None:
            raise RuntimeError("update_actor() needs build_actor_trainer() in the agent's build()")
        a = self.info.cfg.actor
        if a.sample_unit == "trajectory":
            samples = [TrainSample.from_turns(traj.turns, float(adv))
                       for traj, adv in zip(trajectories, advantages.tolist()) if traj.turns]
        else:
            samples = [TrainSample(turn.prompt_ids, turn.completion_ids, turn.logprobs, float(adv))
                       for traj, adv in zip(trajectories, advantages.tolist()) for turn in traj.turns]
        self.info.progress.set_phase("updating actor")
        if loss is None or loss == a.loss:
            name, kwargs = a.loss, {**a.loss_kwargs(), **(loss_args or {})}
        else:
            from crl_bench.algorithms import LOSSES

            name = loss  # an unknown name raises with the registered ones and the closest
            kwargs = {**LOSSES.entry(loss).metadata.get("defaults", {}), **(loss_args or {})}
        with timed(self.info.timings, "timing_s/actor_update"):
            m = self.host.update(samples, loss=name, loss_kwargs=kwargs, agg=a.agg,
                                    temperature=(a.logprob_temperature
                                                 or self.models.actor_sampling.logprob_temperature))
        return {f"losses/actor_{k}": v for k, v in m.items()}

    def state_dict(self, folder: Path) -> dict[str, Any]:
        return {"trainer": self.host.state_dict()} if self.host is not None else {}

    def load_state_dict(self, state: dict[str, Any], folder: Path) -> None:
        if self.host is not None and "trainer" in state:
            self.host.load_state_dict(state["trainer"])
