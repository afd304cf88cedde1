"""A plugin agent the core does not have: GRPO with a leave-one-out baseline (RLOO's estimator).

Each episode's advantage is its return minus the mean return of the *other* episodes of its
group, A_i = r_i - (sum_j r_j - r_i) / (K - 1) = K/(K-1) * (r_i - mean(r)) (Ahmadian et al. 2024,
"Back to Basics: Revisiting REINFORCE Style Optimization for RLHF", eq. 8). The estimator is
registered in crl-bench's ``ADVANTAGES`` registry as ``"loo"``, so any agent (and
``--set actor.advantage=loo``) can use it; this agent uses it by default.

Registered through the entry point ``grpo_loo = "crl_echo_plugin.agent:AGENT"``. crl-bench
imports this module only when the agent is used, so heavy imports here never slow ``list``.
"""

from __future__ import annotations

from dataclasses import dataclass

from crl_bench.agent import Agent, StepResult
from crl_bench.algorithms import ADVANTAGES


def loo_advantages(scores, keys, *, eps: float = 1e-6):
    """Leave-one-out advantages inside each group of ``keys`` (a group of one gets 0)."""
    import torch

    out = torch.zeros_like(scores, dtype=torch.float32)
    for key in torch.unique(keys):
        idx = (keys == key).nonzero(as_tuple=True)[0]
        k = idx.numel()
        if k < 2:
            continue
        r = scores[idx].float()
        out[idx] = r - (r.sum() - r) / (k - 1)
    return out


if "loo" not in ADVANTAGES:
    ADVANTAGES.register("loo", loo_advantages, source="entry-point:crl-echo-plugin",
                        description="leave-one-out baseline (RLOO)")


@dataclass
class LOOConfig:
    estimator: str = "loo"
    """The advantage estimator: a name in ``crl_bench.algorithms.ADVANTAGES``."""
    scale: float = 1.0
    """Multiplies every advantage (a step-size knob that leaves the optimiser's state alone)."""


class GRPOLeaveOneOut(Agent):
    Config = LOOConfig

    def check_options(self) -> None:
        if self.config.estimator not in ADVANTAGES:
            raise ValueError(f"method.estimator={self.config.estimator!r} is not a registered "
                             f"advantage estimator; known: {', '.join(ADVANTAGES.names())}.")

    def build(self, ctx) -> None:
        ctx.build_models(extractor=False)
        ctx.build_actor_trainer()

    def train_step(self, ctx, step: int) -> StepResult:
        import torch

        from crl_bench.algorithms.advantages import group_keys

        trajectories = ctx.play("train", step, ctx.plan(step))
        returns = ctx.returns(trajectories)
        keys = group_keys(torch.tensor([t.group_id for t in trajectories]),
                          torch.zeros(len(trajectories), dtype=torch.bool), split=False)
        advantages = ADVANTAGES.get(self.config.estimator)(returns, keys) * self.config.scale
        metrics = {"charts/adv_abs_mean": float(advantages.abs().mean())}
        metrics.update(ctx.update_actor(trajectories, advantages))
        return StepResult(trajectories, metrics)


AGENT = GRPOLeaveOneOut("grpo_loo", label="GRPO (leave-one-out)",
                        description="GRPO with a leave-one-out baseline (plugin example)")
