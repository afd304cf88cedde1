"""Experience Only: the actor is frozen; only the extractor learns (CISPO on the credit of its
entries). Every training episode uses experience, since nothing else can improve. Complementary
RL's step with the actor frozen."""

from crl_bench.baselines.comp_rl import AGENT as COMP_RL

AGENT = COMP_RL.variant("exp_only", label="Exp. Only",
                        description="Exp. Only: frozen actor + trained extractor",
                        train_actor=False, with_experience_fraction=1.0, split_advantages=False)
