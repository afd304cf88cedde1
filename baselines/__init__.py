"""The agents, as code (installed as ``crl_bench.baselines``).

Read ``grpo.py`` first (plan -> play -> advantages -> update), then ``comp_rl.py`` (the method:
split GRPO + the co-evolving extractor). ``static_exp.py`` and ``exp_only.py`` are Complementary
RL with one role frozen; the ablations are ``comp_rl.py`` variants with one option off.
"""

from __future__ import annotations

# The built-in agents: name -> the agent object's import string. Their labels and descriptions
# are the objects' own (``AGENT = CompRL("comp_rl", label=..., description=...)``); the registry
# reads them from there (``crl-bench list agents``, the report's row names).
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

PAPER_AGENTS: tuple[str, ...] = ("grpo", "static_exp", "exp_only", "comp_rl")
ABLATIONS: tuple[str, ...] = tuple(n for n in BUILTIN_AGENTS if n.startswith("comp_rl_"))


def register_builtin_agents() -> None:
    from crl_bench.registry import AGENTS

    for name, target in BUILTIN_AGENTS.items():
        if not AGENTS.has_builtin(name):
            AGENTS.register(name, target)
