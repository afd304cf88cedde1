"""benchmarks/gpu_check.py at its small shape on CPU: every section but the tiny run (which is
an ordinary `crl-bench run --preset tiny`, ~5 min on 2 shared cores) runs and reports numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_small_on_cpu(tmp_path):
    out = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--small",
                           "--device", "cpu", "--skip", "tiny_run", "--json", str(out)],
                          capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "gpu_check summary" in proc.stdout
    s = json.loads(out.read_text())
    assert s["ok"] and s["small"] and "tiny_run" not in s
    agree = s["logprob_agreement"]
    assert agree["tokens"] > 0
    # recorded sampling log-probs and the training recompute agree at bf16 precision
    assert agree["gen_bf16_vs_train_bf16"]["mean_abs"] < 0.05
    assert s["update"]["tokens_per_s"] > 0 and s["update"]["params_b"] > 0
    assert s["generation"]["tokens_per_s"] > 0 and s["generation"]["new_tokens"] == 8
