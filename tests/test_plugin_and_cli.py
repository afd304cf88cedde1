"""The CLI, and an out-of-tree plugin (tests/plugin_example) installed for real through pip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run_cli(*args: str, env: dict[str, str] | None = None, input: str | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "crl-bench"), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, input=input, timeout=timeout)


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> str:
    """Build and install the example plugin into a private folder (not into the venv)."""
    target = tmp_path_factory.mktemp("plugin_site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "--target", str(target),
                    str(ROOT / "tests" / "plugin_example")], check=True, timeout=300)
    return str(target)


def test_help_answers_without_heavy_imports():
    code = ("import sys; from crl_bench.cli import main; "
            "import contextlib, io\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['list', 'envs'])\n"
            "heavy = [m for m in ('torch', 'nle', 'minihack', 'textworld', 'transformers', 'spacy', 'pandas', 'matplotlib') if m in sys.modules]\n"
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_cli_help_and_list_mixes():
    assert "crl-bench run --agent comp_rl --tasks 3mix" in run_cli("--help").stdout
    out = run_cli("list", "mixes")
    assert out.returncode == 0
    assert "3mix" in out.stdout and "6mix" in out.stdout


def test_plugin_env_listed_checked_and_played(plugin_path):
    env = {"PYTHONPATH": plugin_path}
    listed = run_cli("list", "envs", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "crl/Echo-v0" in listed.stdout and "entry-point:crl-echo-plugin" in listed.stdout
    agents = run_cli("list", "agents", env=env)
    assert "grpo_loo" in agents.stdout and "entry-point:crl-echo-plugin" in agents.stdout
    checked = run_cli("check-env", "crl/Echo-v0", env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "PASS crl/Echo-v0" in checked.stdout
    played = run_cli("play", "crl/Echo-v0", "--task-id", "river", env=env, input="say apple\nsay river\n")
    assert played.returncode == 0, played.stderr
    assert "Wrong word." in played.stdout and "solved: success=True" in played.stdout


def test_plugin_agent_trains_end_to_end_with_its_options(plugin_path, tmp_path):
    """An algorithm the core does not have (GRPO with a leave-one-out baseline, registered as a new
    advantage estimator), installed by pip, selected with --agent, its options set with --set
    method.*, trained on the tiny preset: no change to crl-bench."""
    env = {"PYTHONPATH": plugin_path, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "loo"
    run = run_cli("run", "--agent", "grpo_loo", "--tasks", "minihack", "--preset", "tiny", "--steps", "2",
                  "--out", str(out), "--no-progress", "--set", "threads=1", "--set", "method.scale=0.5",
                  "--set", "actor.advantage=loo", env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    config = json.loads((out / "config.json").read_text())
    assert config["agent"] == "grpo_loo" and config["agent_options"] == {"estimator": "loo", "loss": "reinforce",
                                                                 "scale": 0.5}
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in metrics if m["step"] >= 1]
    assert len(trained) == 2 and all("losses/actor_samples" in m for m in trained)
    assert any(m["losses/actor_active_samples"] > 0 and m["losses/actor_grad_norm"] > 0 for m in trained)
    assert json.loads((out / "status.json").read_text())["state"] == "done"

    bad = run_cli("run", "--agent", "grpo_loo", "--tasks", "minihack", "--preset", "tiny", "--steps", "1",
                  "--out", str(tmp_path / "bad"), "--set", "method.nope=1", env=env)
    assert bad.returncode == 2
    assert "method.nope" in bad.stderr and "estimator, loss, scale" in bad.stderr


def test_unknown_env_names_the_known_ones():
    out = run_cli("check-env", "crl/Nope-v0")
    assert out.returncode == 2
    assert "Unknown env 'crl/Nope-v0'. Available:" in out.stderr
