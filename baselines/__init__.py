"""The agents: thin compositions of core parts (installed as ``crl_bench.baselines``)."""
