"""crl_bench.report"""
