#!/usr/bin/env bash
# Regenerates results/cpu: the CPU-scale single-task reproduction with the embedded model
# (SmolLM2-135M-Instruct actor and extractor, MiniLM embedder), one seed, on 2 cores.
#
#   bash scripts/reproduce_cpu.sh            # ~3.5 h on 2 cores; resumable: rerun to continue
#
# MiniHack runs the full `cpu` preset (10 steps); WebShop, ALFWorld and SWE (`mini`) run 3 steps
# each, so that the whole folder fits an afternoon. Data: see README "Data" (WebShop, ALFWorld and
# SWE read theirs from CRL_BENCH_<FAMILY>_DATA or ~/.cache/crl-bench/data/<family>).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${CRL_BENCH_BIN:-.venv/bin}
# two runs at a time, one torch thread each (more threads than cores makes both slower)
common=(--suite single --preset cpu --seeds 1 --jobs 2 --set threads=1 --no-plots)
"$BIN/crl-bench" reproduce "${common[@]}" --tasks minihack --out runs/cpu-minihack
"$BIN/crl-bench" reproduce "${common[@]}" --tasks webshop,alfworld,swe --steps 3 --out runs/cpu-more
"$BIN/crl-bench" report runs/cpu-minihack/runs runs/cpu-more/runs --out results/cpu \
    --suite single --tasks minihack,webshop,alfworld,swe --seeds 1
