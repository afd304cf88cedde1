"""Complementary RL: an actor and an experience extractor co-evolve around one bank.

The actor's half of a step (:meth:`CompRL.train_step`):

1. plan G task groups of K episodes; the first K/2 of each group get an entry retrieved from the
   bank at episode start (diversified retrieval), the other K/2 play without;
2. play them all (the with-experience half may Search-and-Ask mid-episode);
3. credit the entries each with-experience episode used with its outcome (the extractor's reward);
4. advantages inside each (group, with/without) half — split GRPO — and one PPO-clip actor update
   (not during the first ``experience.bank_fill_steps`` steps, which only fill the bank);
5. hand the episodes to the extractor and go on without waiting.

The extractor's half (:meth:`CompRL.extractor_step`, run by the extractor track in the
background on the episodes handed over):

1. distil each episode into add/update operations on the bank;
2. merge the bank every M steps;
3. train the extractor with CISPO on the credit its entries earned, with count-aware weights.

Each mechanism is an option (``--set method.NAME=false`` switches it off); the ablations of the
paper are variants with one option off, and ``static_exp`` / ``exp_only`` freeze one role.
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import TYPE_CHECKING, Any

from crl_bench.agent import Agent, StepResult
from crl_bench.run.context import RunContext

if TYPE_CHECKING:  # pragma: no cover
    from crl_bench.extractor.track import ExtractorTrack


@dataclass
class CompRLConfig:
    train_actor: bool = True
    """Update the actor with GRPO (False: the actor stays frozen — ``exp_only``)."""
    train_extractor: bool = True
    """Train the extractor with CISPO on its entries' credit (False: it keeps writing, frozen —
    ``static_exp``)."""
    with_experience_fraction: float = 0.5
    """Share of each group's K episodes that get retrieved experience (the paper: K/2)."""
    split_advantages: bool = True
    """Advantages inside the (group, with/without experience) halves; False: over the whole group."""
    diversify: bool = True
    """Retrieval diversification (oversample, penalise popular and recently used entries)."""
    count_reweight: bool = True
    """Count-aware reweighting of extractor samples ((1 + times trained)^-power, cooldown)."""
    merge: bool = True
    """Merge the bank every ``experience.merge_every`` steps (the one switch of the merge)."""
    search_ask: bool = True
    """The with-experience episodes may query the bank mid-episode (``<ask>...</ask>``, at most
    ``experience.max_asks`` times; the one switch of Search-and-Ask)."""
    shared_params: bool = False
    """Actor and extractor share one set of parameters (one adapter, or one fully trained model
    with ``model.lora_r=0``); each role keeps its own optimiser and settings. The actor's model
    serves both roles (``model.extractor`` is not used), so the ablation is this one switch."""


class CompRL(Agent):
    """Complementary RL and its variants (see the module docstring)."""

    Config = CompRLConfig

    @property
    def roles(self) -> tuple[str, ...]:
        return ("actor", "extractor")

    @property
    def shares_parameters(self) -> bool:
        return self.config.shared_params

    @property
    def uses_bank(self) -> bool:
        return True

    @property
    def split_groups(self) -> bool:
        c = self.config
        return c.split_advantages and 0.0 < c.with_experience_fraction < 1.0

    def check_options(self) -> None:
        if not 0.0 <= self.config.with_experience_fraction <= 1.0:
            raise ValueError("method.with_experience_fraction must be in [0, 1], got "
                             f"{self.config.with_experience_fraction}.")

    def build(self, ctx: RunContext) -> None:
        c = self.config
        ctx.build_models(extractor=True, shared_params=self.shares_parameters)
        if c.train_actor:
            ctx.build_actor_trainer()
        ctx.build_experience(diversify=c.diversify, search_ask=c.search_ask,
                             gate=ctx.cfg.experience.gate)
        ctx.build_extractor(self.extractor_step, train=c.train_extractor, merge=c.merge)

    def train_step(self, ctx: RunContext, step: int) -> StepResult:
        c = self.config
        n_with = round(ctx.cfg.rollout.group_size * c.with_experience_fraction)
        plan = ctx.plan(step, with_experience=n_with)
        trajectories = ctx.play("train", step, plan)
        ctx.extractor.credit(trajectories)       # entries used -> their outcome (extractor reward)
        returns = ctx.returns(trajectories)
        advantages = ctx.advantages(trajectories, returns, split=c.split_advantages)
        metrics = {"charts/adv_abs_mean": float(advantages.abs().mean())}
        if c.train_actor and step > ctx.cfg.experience.bank_fill_steps:
            metrics.update(ctx.update_actor(trajectories, advantages))
        else:  # the first steps only fill the bank
            metrics["losses/actor_skipped"] = 1.0
        ctx.extractor.submit(step, trajectories)  # the extractor's half, in the background
        return StepResult(trajectories, metrics)

    def extractor_step(self, ext: "ExtractorTrack", step: int, trajectories: list[Any]) -> dict[str, Any]:
        """The extractor's half of ``step`` on the episodes its actor step handed over; their
        credit arrives later, from the episodes that use what it writes (``credit`` above)."""
        c = self.config
        metrics = ext.distil(step, trajectories)     # each episode -> add / update operations
        if ext.merge_in_step(step):
            metrics.update(ext.merge(step))          # consolidate the bank every M steps
        ext.writes_done()                            # the next rollout may read the bank now
        metrics.update(ext.train(step, count_aware=c.count_reweight))  # CISPO on credited samples
        return metrics


AGENT = CompRL("comp_rl", label="Comp. RL",
               description="Complementary RL: split-GRPO actor + CISPO extractor, co-evolving")

NO_SPLIT = AGENT.variant("comp_rl_no_split", label="Comp. RL, no split advantages",
                         description="ablation: advantages over the whole group (no with/without split)",
                         split_advantages=False)
NO_DIVERSIFY = AGENT.variant("comp_rl_no_diversify", label="Comp. RL, no retrieval diversification",
                             description="ablation: plain top-k retrieval", diversify=False)
NO_REWEIGHT = AGENT.variant("comp_rl_no_reweight", label="Comp. RL, no count-aware reweighting",
                            description="ablation: no count-aware reweighting of extractor samples",
                            count_reweight=False)
NO_MERGE = AGENT.variant("comp_rl_no_merge", label="Comp. RL, no periodic merge",
                         description="ablation: no periodic merge", merge=False)
NO_ASK = AGENT.variant("comp_rl_no_ask", label="Comp. RL, no Search-and-Ask",
                       description="ablation: no Search-and-Ask", search_ask=False)
SHARED_PARAMS = AGENT.variant("comp_rl_shared_params", label="Comp. RL, shared actor/extractor parameters",
                              description="ablation: actor and extractor share parameters",
                              shared_params=True)
