"""crl_bench.algorithms"""
