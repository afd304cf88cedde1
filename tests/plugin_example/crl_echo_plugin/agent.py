"""A plugin agent the core does not have: GRPO with a leave-one-out baseline (RLOO's estimator),
trained with a loss of its own, keeping a state of its own across steps and resumes.

Each episode's advantage is its return minus the mean return of the *other* episodes of its
group, A_i = r_i - (sum_j r_j - r_i) / (K - 1) = K/(K-1) * (r_i - mean(r)) (Ahmadian et al. 2024,
"Back to Basics: Revisiting REINFORCE Style Optimization for RLHF", eq. 8). The estimator and the
loss are registered through the entry points ``crl_bench.advantages`` (``loo``) and
``crl_bench.losses`` (``reinforce``), so any agent can use them (``--set actor.advantage=loo``,
``--set actor.loss=reinforce``).

Registered through the entry point ``grpo_loo = "crl_echo_plugin.agent:AGENT"``. crl-bench
imports this module only when it is used, so heavy imports here never slow ``list``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from crl_bench.agent import Agent, StepResult


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


def reinforce_loss(logprobs, old_logprobs, advantages, mask, *, agg: str = "token-mean"):
    """Policy gradient with the importance ratio and no clipping: ``-A exp(lp - old)`` per
    token, aggregated like the built-in losses. Returns ``(loss, metrics)``."""
    import torch

    from crl_bench.algorithms.losses import aggregate

    ratio = torch.exp(logprobs - old_logprobs.detach())
    loss = aggregate(-advantages.detach() * ratio, mask, agg)
    n = mask.sum().clamp(min=1)
    return loss, {"ratio_mean": float((ratio * mask).sum() / n)}


@dataclass
class LOOConfig:
    estimator: str = "loo"
    """The advantage estimator: a name in ``crl_bench.algorithms.ADVANTAGES``."""
    loss: str = "reinforce"
    """The policy loss of the actor's updates: a name in ``crl_bench.algorithms.LOSSES``."""
    scale: float = 1.0
    """Multiplies every advantage (a step-size knob that leaves the optimiser's state alone)."""


class GRPOLeaveOneOut(Agent):
    Config = LOOConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.updates = 0  # the agent's own state: saved in checkpoints, restored on --resume

    def check_options(self) -> None:
        from crl_bench.algorithms import ADVANTAGES, LOSSES

        for what, name, registry in (("estimator", self.config.estimator, ADVANTAGES),
                                     ("loss", self.config.loss, LOSSES)):
            if name not in registry:
                raise ValueError(f"method.{what}={name!r} is not registered; known: "
                                 f"{', '.join(registry.names())}.")

    def build(self, ctx) -> None:
        ctx.build_models(extractor=False)
        ctx.build_actor_trainer()

    def train_step(self, ctx, step: int) -> StepResult:
        import torch

        from crl_bench.algorithms import ADVANTAGES
        from crl_bench.algorithms.advantages import group_keys

        trajectories = ctx.play("train", step, ctx.plan(step))
        returns = ctx.returns(trajectories)
        keys = group_keys(torch.tensor([t.group_id for t in trajectories]),
                          torch.zeros(len(trajectories), dtype=torch.bool), split=False)
        advantages = ADVANTAGES.get(self.config.estimator)(returns, keys) * self.config.scale
        metrics = {"charts/adv_abs_mean": float(advantages.abs().mean())}
        metrics.update(ctx.update_actor(trajectories, advantages, loss=self.config.loss))
        self.updates += 1
        metrics["charts/agent_updates"] = float(self.updates)
        return StepResult(trajectories, metrics)

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = int(state.get("updates", 0))


AGENT = GRPOLeaveOneOut("grpo_loo", label="GRPO (leave-one-out)",
                        description="GRPO with a leave-one-out baseline (plugin example)")
