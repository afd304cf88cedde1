"""The agents, as code (installed as ``crl_bench.baselines``).

Read ``grpo.py`` first (plan -> play -> advantages -> update), then ``comp_rl.py`` (the method:
split GRPO + the co-evolving extractor). ``static_exp.py`` and ``exp_only.py`` are Complementary
RL with one role frozen; the ablations are ``comp_rl.py`` variants with one option off.
"""

from __future__ import annotations

# The built-in agents: name -> (import string, label, description). One table, used by
# ``crl-bench list agents``, the runner and the report.
BUILTIN_AGENTS: dict[str, tuple[str, str, str]] = {
    "grpo": ("crl_bench.baselines.grpo:AGENT", "Baseline",
             "Baseline: plain GRPO actor, no experience"),
    "static_exp": ("crl_bench.baselines.static_exp:AGENT", "Static Online Exp.",
                   "Static Online Exp.: GRPO actor + frozen extractor writing online"),
    "exp_only": ("crl_bench.baselines.exp_only:AGENT", "Exp. Only",
                 "Exp. Only: frozen actor + trained extractor"),
    "comp_rl": ("crl_bench.baselines.comp_rl:AGENT", "Comp. RL",
                "Complementary RL: split-GRPO actor + CISPO extractor, co-evolving"),
    "comp_rl_no_split": ("crl_bench.baselines.comp_rl:NO_SPLIT", "Comp. RL, no split advantages",
                         "ablation: advantages over the whole group (no with/without split)"),
    "comp_rl_no_diversify": ("crl_bench.baselines.comp_rl:NO_DIVERSIFY",
                             "Comp. RL, no retrieval diversification", "ablation: plain top-k retrieval"),
    "comp_rl_no_reweight": ("crl_bench.baselines.comp_rl:NO_REWEIGHT",
                            "Comp. RL, no count-aware reweighting",
                            "ablation: no count-aware reweighting of extractor samples"),
    "comp_rl_no_merge": ("crl_bench.baselines.comp_rl:NO_MERGE", "Comp. RL, no periodic merge",
                         "ablation: no periodic merge"),
    "comp_rl_no_ask": ("crl_bench.baselines.comp_rl:NO_ASK", "Comp. RL, no Search-and-Ask",
                       "ablation: no Search-and-Ask"),
    "comp_rl_shared_params": ("crl_bench.baselines.comp_rl:SHARED_PARAMS",
                              "Comp. RL, shared actor/extractor parameters",
                              "ablation: actor and extractor share parameters"),
}

PAPER_AGENTS: tuple[str, ...] = ("grpo", "static_exp", "exp_only", "comp_rl")
ABLATIONS: tuple[str, ...] = tuple(n for n in BUILTIN_AGENTS if n.startswith("comp_rl_"))


def register_builtin_agents() -> None:
    from crl_bench.registry import AGENTS

    for name, (target, label, description) in BUILTIN_AGENTS.items():
        if not AGENTS.has_builtin(name):
            AGENTS.register(name, target, label=label, description=description)
