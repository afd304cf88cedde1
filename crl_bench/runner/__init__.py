"""crl_bench.runner"""
