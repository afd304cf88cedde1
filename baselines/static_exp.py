"""Static Online Experience: the actor trains with split GRPO on a bank that a *frozen* extractor
keeps writing to online. The bank drifts out of date as the actor improves (the paper's finding)."""

from crl_bench.agent_spec import AgentSpec

AGENT = AgentSpec(
    name="static_exp",
    description="Static Online Exp.: GRPO actor + frozen extractor writing online",
    train_actor=True,
    use_bank=True,
    train_extractor=False,   # the extractor writes, but never learns from the credit
    split_advantages=True,
    with_experience_fraction=0.5,
)
