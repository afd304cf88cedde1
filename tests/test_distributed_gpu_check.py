"""benchmarks/gpu_check.py at its smoke size on CPU: every section but the tiny run (which is
an ordinary `crl-bench run --preset tiny`, ~5 min on 2 shared cores) runs, reports numbers and
prints one table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_smoke_on_cpu(tmp_path):
    out = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--smoke",
                           "--device", "cpu", "--skip", "tiny_run", "--json", str(out)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "gpu_check summary" in proc.stdout
    for name in ("logprob_agreement", "master_update", "fsdp2", "update", "generation"):
        assert any(line.startswith(name) for line in proc.stdout.splitlines()), name  # a table row
    s = json.loads(out.read_text())
    assert s["ok"] and s["small"] and "tiny_run" not in s
    agree = s["logprob_agreement"]
    assert agree["tokens"] > 0
    # recorded sampling log-probs and the training recompute agree at bf16 precision
    assert agree["gen_bf16_vs_train_bf16"]["mean_abs"] < 0.05
    # the mixed-precision check measured the update; with fp32 masters it must pass, and a
    # trainer stepping the bf16 weights (no masters) fails it
    m = s["master_update"]
    assert 0 <= m["changed_where_ref_changed"] <= 1 and m["delta_rel_err"] >= 0
    assert m["pass"] == m["fp32_masters"], m
    # FSDP2 at world size 1 (gloo): sharded fp32 parameters, the hand-made mixed-precision update
    f = s["fsdp2"]
    assert f["pass"] and f["sharded_params"] and f["param_dtype"] == "float32", f
    assert f["entries_moved"] > 0.5
    assert s["update"]["tokens_per_s"] > 0 and s["update"]["params_b"] > 0
    assert s["generation"]["tokens_per_s"] > 0 and s["generation"]["new_tokens"] == 8
