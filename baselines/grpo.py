"""Baseline: plain GRPO on outcome reward. No bank, no extractor; every rollout is without
experience and advantages are centred on the whole group."""

from crl_bench.agent_spec import AgentSpec

AGENT = AgentSpec(
    name="grpo",
    description="Baseline: plain GRPO actor, no experience",
    train_actor=True,
    use_bank=False,
    train_extractor=False,
    split_advantages=False,
    with_experience_fraction=0.0,
    search_ask=False,
    merge=False,
)
