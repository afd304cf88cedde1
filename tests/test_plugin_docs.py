"""The plugin of docs/usage.md, rebuilt from the page alone: every ``# file: PATH`` block is
written to a fresh folder, installed with pip, and used as a user would — its agent listed with
its options, its env checked, a run of its agent (its own estimator, its own loss, its own state
through a checkpoint and a resume) and another agent using its advantage estimator."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FILES = {"pyproject.toml", "crl_echo_plugin/__init__.py", "crl_echo_plugin/agent.py"}


def doc_files() -> dict[str, str]:
    """``# file: PATH`` fenced blocks of docs/usage.md: path -> text (the marker line removed)."""
    text = (ROOT / "docs" / "usage.md").read_text()
    blocks = re.findall(r"^```[a-z]*\n# file: (\S+)\n(.*?)^```$", text, flags=re.M | re.S)
    return {path: body for path, body in blocks}


def run_cli(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "crl-bench"), *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=timeout)


def test_the_page_holds_the_whole_plugin_and_it_is_the_example():
    files = doc_files()
    assert set(files) == FILES
    for path, body in files.items():  # the page and tests/plugin_example cannot drift apart
        assert body == (ROOT / "tests" / "plugin_example" / path).read_text(), path


@pytest.fixture(scope="module")
def docs_plugin(tmp_path_factory) -> dict[str, str]:
    src = tmp_path_factory.mktemp("from_docs")
    for path, body in doc_files().items():
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        (src / path).write_text(body)
    site = tmp_path_factory.mktemp("docs_plugin_site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--disable-pip-version-check", "--target", str(site),
                    str(src)], check=True, timeout=300)
    return {"PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}


def test_list_agents_verbose_shows_the_plugins_options(docs_plugin):
    out = run_cli("list", "agents", "-v", env=docs_plugin)
    assert out.returncode == 0, out.stderr
    assert "grpo_loo" in out.stdout and "[entry-point:crl-echo-plugin]" in out.stdout
    assert ('method.loss="reinforce"  The policy loss of the actor\'s updates: a name in '
            "``crl_bench.algorithms.LOSSES``.") in out.stdout


def test_check_env_passes_on_the_docs_env(docs_plugin):
    out = run_cli("check-env", "crl/Echo-v0", env=docs_plugin)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PASS crl/Echo-v0" in out.stdout


@pytest.mark.slow
def test_a_run_of_the_docs_agent_with_its_loss_state_and_a_resume(docs_plugin, tmp_path):
    out = tmp_path / "loo"
    common = ["--agent", "grpo_loo", "--tasks", "crl/Echo-v0", "--preset", "tiny", "--out",
              str(out), "--no-progress", "--no-report", "--set", "threads=1"]
    run = run_cli("run", *common, "--steps", "1", "--set", "method.scale=0.5", env=docs_plugin)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    config = json.loads((out / "config.json").read_text())
    assert config["agent_options"] == {"estimator": "loo", "loss": "reinforce", "scale": 0.5}
    step1 = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()][-1]
    # the agent's own loss ran (only it reports ratio_mean without clip fractions)
    assert "losses/actor_ratio_mean" in step1 and "losses/actor_clip_frac" not in step1
    assert step1["charts/agent_updates"] == 1.0
    import torch

    state = torch.load(out / "checkpoints" / "last" / "state.pt", weights_only=False)
    assert state["__agent__"] == {"updates": 1}
    # the resumed run restores the agent's state: its count goes on from 1
    resumed = run_cli("run", "--resume", "--out", str(out), "--steps", "2", "--no-progress",
                      "--no-report", env=docs_plugin)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-4000:]
    last = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["step"] == 2 and last["charts/agent_updates"] == 2.0


@pytest.mark.slow
def test_another_agent_uses_the_plugins_advantage_estimator(docs_plugin, tmp_path):
    out = tmp_path / "grpo"
    run = run_cli("run", "--agent", "grpo", "--tasks", "crl/Echo-v0", "--preset", "tiny",
                  "--steps", "1", "--out", str(out), "--no-progress", "--no-report",
                  "--set", "threads=1", "--set", "actor.advantage=loo", env=docs_plugin)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert json.loads((out / "config.json").read_text())["actor"]["advantage"] == "loo"
    assert json.loads((out / "status.json").read_text())["state"] == "done"
