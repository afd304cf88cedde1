"""The agents, as code (installed as ``crl_bench.baselines``).

Read ``grpo.py`` first (plan -> play -> advantages -> update), then ``comp_rl.py`` (the method:
split GRPO + the co-evolving extractor). ``static_exp.py`` and ``exp_only.py`` are Complementary
RL with one role frozen; the ablations are ``comp_rl.py`` variants with one option off.
"""
