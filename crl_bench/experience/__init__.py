"""crl_bench.experience"""
