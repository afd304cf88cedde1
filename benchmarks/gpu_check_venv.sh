#!/usr/bin/env bash
# benchmarks/gpu_check.py in a clean venv holding only what the GPU device's image has (torch,
# transformers, peft and their own dependencies; no gymnasium, Ray or vLLM, crl-bench not
# installed): its smoke mode must pass, and with a planted FAIL it must exit 1.
#
# Usage:  bash benchmarks/gpu_check_venv.sh [VENV_DIR]    (default: a temporary folder)
# Building the venv takes minutes (torch's CPU wheel), so this is not in the default test run;
# tests/test_gpu_check_closure.py checks the same import closure statically in a second.
set -euo pipefail

cd "$(dirname "$0")/.."
VENV="${1:-$(mktemp -d)/gpu-check-venv}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"   # a clean venv: no system site-packages
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check torch transformers peft
echo "[gpu_check_venv] venv ready in $(( $(date +%s) - start )) s: $("$VENV/bin/python" -m pip list --format=freeze 2>/dev/null | tr '\n' ' ')"
for forbidden in gymnasium ray vllm; do
  if "$VENV/bin/python" -c "import $forbidden" 2>/dev/null; then
    echo "[gpu_check_venv] $forbidden is importable: the venv is not the device image's" >&2
    exit 2
  fi
done
export OMP_NUM_THREADS=1
"$VENV/bin/python" benchmarks/gpu_check.py --smoke --device cpu
status=0
"$VENV/bin/python" benchmarks/gpu_check.py --smoke --device cpu --skip master_update,weight_push \
  --plant-fail || status=$?
if [ "$status" -ne 1 ]; then
  echo "[gpu_check_venv] a planted FAIL exited $status, not 1" >&2
  exit 1
fi
echo "[gpu_check_venv] smoke passed, planted FAIL exited 1; total $(( $(date +%s) - start )) s"
