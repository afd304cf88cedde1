"""benchmarks/gpu_check.py at its smoke size on CPU: the mixed-precision check, the project's
sharded learner on a process group built by ``join_group`` (one rank: one update with
checkpointing, chunked log-probs and the old-log-prob pass), the bf16 gather of its weights; one
table, exit 0. With a planted FAIL (the plan figure divided by 100) it exits 1."""

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


def check(tmp_path, *extra):
    out = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--smoke",
                           "--device", "cpu", "--json", str(out), *extra],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    return proc, json.loads(out.read_text())


def test_gpu_check_smoke_passes_and_a_planted_fail_exits_1(tmp_path):
    proc, s = check(tmp_path, "--skip", "master_update")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "gpu_check summary" in proc.stdout and "gpu_check: PASS" in proc.stdout
    for name in ("learner", "weight_push"):
        assert any(line.startswith(name) for line in proc.stdout.splitlines()), name
    lr = s["learner"]
    assert lr["pass"] and lr["tokens"] == 256 and lr["tokens_per_s"] > 0
    assert lr["max_weight_change"] > 0 and lr["grad_norm"] > 0 and lr["plan_peak_gb"] > 0
    assert lr["backend"] == "gloo"
    assert s["weight_push"]["pass"] and s["weight_push"]["weights_gb"] > 0
    proc, s = check(tmp_path, "--skip", "master_update,weight_push", "--plant-fail")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "gpu_check: FAIL" in proc.stdout and s["learner"]["pass"] is False
    assert "planted" in s["learner"]["verdict"]


def test_attention_flops_count_the_causal_half():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check import attention_flops

    # one layer, q_dim 1, 2 tokens: QK^T and AV, 2 FLOPs per multiply-add, half of 2x2
    assert attention_flops(1, 1, 2) == 2 * 2 * 1 * 4 / 2
    # Qwen2.5-7B at 32k tokens: 28 layers x 3584 x 32768^2 x 2 = 2.15e14 per forward
    assert attention_flops(28, 3584, 32768) == pytest.approx(2.155e14, rel=1e-3)
