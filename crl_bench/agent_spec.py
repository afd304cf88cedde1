"""What an agent is: which learner is trained, whether the bank is used, and which mechanisms are on.

The rows of the paper's tables (DESIGN §1) differ only in these switches; the co-training loop
(:mod:`crl_bench.runner.loop`) reads them. Each agent in ``baselines/`` is one short file that
builds an :class:`AgentSpec`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class AgentSpec:
    name: str
    description: str
    train_actor: bool = True
    """Update the actor with GRPO (False: the actor stays frozen)."""
    use_bank: bool = True
    """Keep an experience bank, retrieve from it and let the extractor write to it."""
    train_extractor: bool = True
    """Train the extractor with CISPO on the credit its entries earn (False: frozen extractor)."""
    split_advantages: bool = True
    """Compute advantages inside (task group, with/without experience) subgroups."""
    with_experience_fraction: float = 0.5
    """Share of each group's K rollouts that get retrieved experience (0.5 = the paper's split)."""
    diversify: bool = True
    """Retrieval diversification (oversample, penalise popular/recent entries)."""
    count_reweight: bool = True
    """Count-aware reweighting of extractor samples."""
    merge: bool = True
    """Periodic merge of the bank."""
    search_ask: bool = True
    """Let the actor query the bank mid-episode (<ask>...</ask>)."""
    shared_params: bool = False
    """Actor and extractor share one adapter (ablation of separate parameters)."""

    def ablate(self, name: str, description: str, **switches: bool) -> "AgentSpec":
        return replace(self, name=name, description=description, **switches)

    @property
    def needs_split(self) -> bool:
        return self.use_bank and self.split_advantages and 0.0 < self.with_experience_fraction < 1.0


BUILTIN_AGENTS: dict[str, str] = {
    "grpo": "crl_bench.baselines.grpo:AGENT",
    "static_exp": "crl_bench.baselines.static_exp:AGENT",
    "exp_only": "crl_bench.baselines.exp_only:AGENT",
    "comp_rl": "crl_bench.baselines.comp_rl:AGENT",
    "comp_rl_no_split": "crl_bench.baselines.comp_rl:NO_SPLIT",
    "comp_rl_no_diversify": "crl_bench.baselines.comp_rl:NO_DIVERSIFY",
    "comp_rl_no_reweight": "crl_bench.baselines.comp_rl:NO_REWEIGHT",
    "comp_rl_no_merge": "crl_bench.baselines.comp_rl:NO_MERGE",
    "comp_rl_no_ask": "crl_bench.baselines.comp_rl:NO_ASK",
    "comp_rl_shared_params": "crl_bench.baselines.comp_rl:SHARED_PARAMS",
}

DESCRIPTIONS: dict[str, str] = {
    "grpo": "Baseline: plain GRPO actor, no experience",
    "static_exp": "Static Online Exp.: GRPO actor + frozen extractor writing online",
    "exp_only": "Exp. Only: frozen actor + trained extractor",
    "comp_rl": "Complementary RL: split-GRPO actor + CISPO extractor, co-evolving",
    "comp_rl_no_split": "ablation: advantages over the whole group (no with/without split)",
    "comp_rl_no_diversify": "ablation: plain top-k retrieval",
    "comp_rl_no_reweight": "ablation: no count-aware reweighting of extractor samples",
    "comp_rl_no_merge": "ablation: no periodic merge",
    "comp_rl_no_ask": "ablation: no Search-and-Ask",
    "comp_rl_shared_params": "ablation: actor and extractor share parameters",
}


def register_builtin_agents() -> None:
    from crl_bench.registry import AGENTS

    for name, target in BUILTIN_AGENTS.items():
        if name not in AGENTS._entries:
            AGENTS.register(name, target, description=DESCRIPTIONS[name])


def load_agent(name: str) -> AgentSpec:
    from crl_bench.registry import AGENTS

    agent = AGENTS.get(name)
    if not isinstance(agent, AgentSpec):
        raise TypeError(f"agent {name!r} must be an AgentSpec (crl_bench.agent_spec.AgentSpec), got "
                        f"{type(agent).__name__}; plugin agents build one with AgentSpec(...).")
    return agent
