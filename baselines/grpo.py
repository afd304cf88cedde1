"""Baseline: plain GRPO on outcome reward. No bank, no extractor.

One step: G task groups of K episodes each (the same task instance within a group) ->
advantage = the episode's return minus its group's mean (``actor.advantage``; the official code
does not divide by the std) -> one PPO-clip update on every turn of every episode.
"""

from __future__ import annotations

from crl_bench.agent import Agent, StepResult
from crl_bench.run.context import RunContext


class GRPO(Agent):
    """GRPO with group-mean advantages (no options)."""

    def build(self, ctx: RunContext) -> None:
        ctx.build_models(extractor=False)
        ctx.build_actor_trainer()

    def train_step(self, ctx: RunContext, step: int) -> StepResult:
        plan = ctx.plan(step)                                       # G groups x K, no experience
        trajectories = ctx.play("train", step, plan)
        returns = ctx.returns(trajectories)                         # score - format penalty
        advantages = ctx.advantages(trajectories, returns, split=False)
        metrics = {"charts/adv_abs_mean": float(advantages.abs().mean())}
        metrics.update(ctx.update_actor(trajectories, advantages))  # PPO-clip, one step
        return StepResult(trajectories, metrics)


AGENT = GRPO("grpo", label="Baseline", description="Baseline: plain GRPO actor, no experience")
