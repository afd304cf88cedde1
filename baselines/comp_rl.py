"""Complementary RL: actor and extractor co-evolve around one bank.

Per step: G task groups x K rollouts, K/2 with retrieved experience and K/2 without
-> advantages inside each half (split GRPO) -> actor update. In the background the extractor
reads finished trajectories, writes add/update operations to the bank, is credited by how the
trajectories that used its entries ended, and is trained with CISPO (count-aware weights).
Every M steps the bank is merged; the actor can Search-and-Ask mid-episode.

The ablations switch off one mechanism each.
"""

from crl_bench.agent_spec import AgentSpec

AGENT = AgentSpec(
    name="comp_rl",
    description="Complementary RL: split-GRPO actor + CISPO extractor, co-evolving",
    train_actor=True,
    use_bank=True,
    train_extractor=True,
    split_advantages=True,
    with_experience_fraction=0.5,
    diversify=True,
    count_reweight=True,
    merge=True,
    search_ask=True,
    shared_params=False,
)

NO_SPLIT = AGENT.ablate("comp_rl_no_split", "ablation: advantages over the whole group", split_advantages=False)
NO_DIVERSIFY = AGENT.ablate("comp_rl_no_diversify", "ablation: plain top-k retrieval", diversify=False)
NO_REWEIGHT = AGENT.ablate("comp_rl_no_reweight", "ablation: no count-aware reweighting", count_reweight=False)
NO_MERGE = AGENT.ablate("comp_rl_no_merge", "ablation: no periodic merge", merge=False)
NO_ASK = AGENT.ablate("comp_rl_no_ask", "ablation: no Search-and-Ask", search_ask=False)
SHARED_PARAMS = AGENT.ablate("comp_rl_shared_params", "ablation: one shared adapter", shared_params=True)
