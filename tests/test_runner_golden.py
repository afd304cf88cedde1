"""Golden figures of tiny runs: the safety net for redesigns of the loop (issue 15).

For a fixed seed, each paper agent and ablation on the `tiny` preset (MiniHack, 3 steps, one
torch thread, extractor track inline) must give the same records as when the golden file was
written: the training episodes of every step (with/without experience, success, actions, invalid
turns, asks), per-step update figures (active samples, rounded losses and gradient norms,
advantage size), the bank size and the extractor's counters. A change that is meant to alter
behaviour regenerates the file, and the diff of tests/golden/tiny_records.json is reviewed:

    CRL_BENCH_REGEN_GOLDEN=1 OMP_NUM_THREADS=1 pytest tests/test_runner_golden.py

The model behind the preset (``tiny-sft``) is built once per machine with one thread and fixed
seeds; its weights, hence these figures, can still differ across CPU instruction sets or torch
versions (then regenerate on the reference machine and say so in the commit).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("nle")

from crl_bench.runner.records import read_jsonl  # noqa: E402

GOLDEN = Path(__file__).parent / "golden" / "tiny_records.json"
AGENTS = ("grpo", "static_exp", "exp_only", "comp_rl", "comp_rl_no_split", "comp_rl_no_diversify",
          "comp_rl_no_reweight", "comp_rl_no_merge", "comp_rl_no_ask", "comp_rl_shared_params")
REGEN = os.environ.get("CRL_BENCH_REGEN_GOLDEN") == "1"
METRICS = ("losses/actor_active_samples", "losses/actor_loss", "losses/actor_grad_norm",
           "losses/extractor_active_samples", "losses/extractor_loss", "losses/extractor_grad_norm",
           "charts/adv_abs_mean", "charts/success_rate", "bank/size", "extractor/extractions",
           "extractor/malformed", "extractor/ops_applied", "extractor/merges", "extractor/updates",
           "eval/success_rate_without_exp", "eval/success_rate_with_exp")
pytestmark = pytest.mark.slow


def figures(path: Path) -> dict:
    """The pinned figures of one run directory (floats rounded to 4 decimals)."""
    episodes = read_jsonl(path / "episodes.jsonl")
    metrics = read_jsonl(path / "metrics.jsonl")
    out: dict = {"episodes": {}, "metrics": {}}
    for phase in ("train", "eval"):
        out["episodes"][phase] = [
            [e["step"], e["group"], int(e["with_experience"]), int(e["success"]), e["n_actions"],
             e["n_invalid_format"], e["n_tool_calls"], e["tokens"]]
            for e in episodes if e["phase"] == phase]
    for m in metrics:
        out["metrics"][str(m["step"])] = {k: round(float(m[k]), 4) for k in METRICS if k in m}
    return out


@pytest.fixture(scope="module")
def golden() -> dict:
    if REGEN or not GOLDEN.exists():
        return {}
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("agent", AGENTS)
def test_tiny_run_matches_golden_records(tiny_run, golden, agent):
    got = figures(tiny_run(agent, 0).path)
    if REGEN:
        data = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        data[agent] = got
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(dict(sorted(data.items())), indent=1) + "\n")
        pytest.skip(f"regenerated {GOLDEN.name}[{agent}]")
    assert agent in golden, f"no golden figures for {agent}: regenerate ({__doc__.split('reviewed:')[1].strip().splitlines()[0]})"
    want = golden[agent]
    assert got["episodes"] == want["episodes"]
    assert got["metrics"].keys() == want["metrics"].keys()
    for step, values in want["metrics"].items():
        assert got["metrics"][step].keys() == values.keys(), step
        for key, value in values.items():
            assert got["metrics"][step][key] == pytest.approx(value, abs=2e-4), (step, key)
