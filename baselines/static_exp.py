"""Static Online Experience: the actor trains with split GRPO on a bank that a *frozen* extractor
keeps writing to online. The bank drifts out of date as the actor improves (the paper's finding:
worse than no bank at all on the 3-task mix). Complementary RL's step with the extractor frozen."""

from crl_bench.baselines.comp_rl import AGENT as COMP_RL

AGENT = COMP_RL.variant("static_exp", label="Static Online Exp.",
                        description="Static Online Exp.: GRPO actor + frozen extractor writing online",
                        train_extractor=False)
