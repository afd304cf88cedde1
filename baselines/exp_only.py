"""Experience Only: the actor is frozen; only the extractor learns (CISPO on the credit of its
entries). Every training rollout uses experience, since nothing else can improve."""

from crl_bench.agent_spec import AgentSpec

AGENT = AgentSpec(
    name="exp_only",
    description="Exp. Only: frozen actor + trained extractor",
    train_actor=False,
    use_bank=True,
    train_extractor=True,
    split_advantages=False,
    with_experience_fraction=1.0,
)
