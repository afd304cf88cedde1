"""Golden figures of tiny runs: the safety net for redesigns of the loop (issue 15).

For a fixed seed, each paper agent and ablation on the `tiny` preset (MiniHack, 3 steps, one
torch thread, extractor track inline) must give the same records as when the golden file was
written: the training episodes of every step (with/without experience, success, actions, invalid
turns, asks), per-step update figures (active samples, rounded losses and gradient norms,
advantage size), the bank size and the extractor's counters. A change that is meant to alter
behaviour regenerates the file, and the diff of tests/golden/tiny_records.json is reviewed:

    CRL_BENCH_REGEN_GOLDEN=1 OMP_NUM_THREADS=1 pytest tests/test_runner_golden.py

The model behind the preset (``tiny-sft``) is built once per machine with one thread and fixed
seeds; its weights, hence these figures, differ across CPU vendors / instruction sets and torch
versions (measured: an AMD EPYC AVX2 machine plays other step-1 episodes than the machine the
first records came from). The file therefore holds one *variant* per machine kind, labelled by
:func:`machine`, and a run is compared exactly with its own kind's variant only:

* regenerating (a deliberate change of behaviour) writes this machine's variant and drops the
  variants of every other kind: they recorded the old behaviour and no machine here can redo
  them, so keeping them would let a run elsewhere pass against stale figures;
* on a machine kind without a variant the test skips, naming the command that records one:
  the command above with ``CRL_BENCH_REGEN_GOLDEN=add``, which writes this kind's variant and
  keeps the others (for adding a kind when behaviour has not changed).
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("nle")

from crl_bench.records.files import read_jsonl  # noqa: E402

GOLDEN = Path(__file__).parent / "golden" / "tiny_records.json"
AGENTS = ("grpo", "static_exp", "exp_only", "comp_rl", "comp_rl_no_split", "comp_rl_no_diversify",
          "comp_rl_no_reweight", "comp_rl_no_merge", "comp_rl_no_ask", "comp_rl_shared_params")
REGEN_MODE = os.environ.get("CRL_BENCH_REGEN_GOLDEN", "")
REGEN = REGEN_MODE in ("1", "add")
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


def machine() -> str:
    """The label of this machine's numerics: CPU vendor, torch's CPU capability, torch version."""
    import torch

    vendor = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            vendor = next((line.split(":", 1)[1].strip() for line in fh
                           if line.startswith("vendor_id")), vendor)
    except OSError:
        pass
    return f"{vendor} {torch.backends.cpu.get_cpu_capability()} torch-{torch.__version__}"


def load_variants() -> list[dict]:
    """``[{"machine": label or None, "records": {agent: figures}}]`` from the golden file."""
    return json.loads(GOLDEN.read_text())["variants"] if GOLDEN.exists() else []


@pytest.fixture(scope="module")
def golden() -> dict | None:
    """This machine kind's variant, or None when the file has none for it."""
    return next((v for v in load_variants() if v["machine"] == machine()), None)


def mismatch(got: dict, want: dict) -> str | None:
    """Where ``got`` differs from ``want`` (None when equal within the metric tolerance)."""
    if got["episodes"] != want["episodes"]:
        for phase in want["episodes"]:
            for i, (g, w) in enumerate(zip(got["episodes"].get(phase, []), want["episodes"][phase])):
                if g != w:
                    return f"{phase} episode {i}: got {g}, want {w}"
        return "episode counts differ"
    if got["metrics"].keys() != want["metrics"].keys():
        return f"metric steps {sorted(got['metrics'])} != {sorted(want['metrics'])}"
    for step, values in want["metrics"].items():
        if got["metrics"][step].keys() != values.keys():
            return f"step {step}: metric names differ"
        for key, value in values.items():
            if got["metrics"][step][key] != pytest.approx(value, abs=2e-4):
                return f"step {step} {key}: got {got['metrics'][step][key]}, want {value}"
    return None


@pytest.mark.parametrize("agent", AGENTS)
def test_tiny_run_matches_golden_records(tiny_run, golden, agent):
    got = figures(tiny_run(agent, 0).path)
    regen = __doc__.split("reviewed:")[1].strip().splitlines()[0]
    if REGEN:
        # a behaviour change: the other kinds' variants are stale (module docstring)
        variants = [v for v in load_variants() if REGEN_MODE == "add" or v["machine"] == machine()]
        mine = next((v for v in variants if v["machine"] == machine()), None)
        if mine is None:
            mine = {"machine": machine(), "records": {}}
            variants.append(mine)
        mine["records"][agent] = got
        mine["records"] = dict(sorted(mine["records"].items()))
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps({"variants": variants}, indent=1) + "\n")
        pytest.skip(f"regenerated {GOLDEN.name}[{machine()}][{agent}]")
    if golden is None:
        pytest.skip(f"no golden variant for this machine kind ({machine()!r}); to record one "
                    f"(keeping the other kinds'): {regen.replace('GOLDEN=1', 'GOLDEN=add')}")
    assert agent in golden["records"], f"no golden figures for {agent}: regenerate ({regen})"
    diff = mismatch(got, golden["records"][agent])
    assert diff is None, (f"{agent} on {machine()!r} differs from its golden variant: {diff}. "
                          f"A deliberate change regenerates: {regen}")
