"""crl_bench.llm"""
