"""A run's status.json carries its provenance: the code's commit and the config's hash at each
attempt's start, the wall-clock start of the first attempt and the end of the run, so that the
order of a plan's commit and its runs can be checked from the files."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from crl_bench.records.files import RunDir, code_version

ROOT = Path(__file__).resolve().parents[1]


def test_status_keeps_commit_config_hash_start_and_end(tmp_path):
    run = RunDir(tmp_path / "run")
    run.config_path.write_text('{"agent": "grpo"}')
    run.set_status("running", 0)
    first = json.loads((run.path / "status.json").read_text())["provenance"]
    run.set_status("running", 1)
    run.set_status("failed", 1, error="killed")
    run.config_path.write_text('{"agent": "grpo", "steps": 3}')
    run.set_status("running", 1)  # resumed: a second attempt
    run.set_status("done", 3)
    status = json.loads((run.path / "status.json").read_text())
    prov = status["provenance"]
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    assert prov["commit"] == head == code_version()["commit"]
    assert len(prov["attempts"]) == 2
    assert prov["started_at"] == first["started_at"] == prov["attempts"][0]["at"]
    assert prov["started_at"] <= prov["attempts"][1]["at"] <= prov["ended_at"]
    assert prov["attempts"][0]["config_sha256"] == hashlib.sha256(b'{"agent": "grpo"}').hexdigest()
    assert prov["config_sha256"] == hashlib.sha256(run.config_path.read_bytes()).hexdigest()
    assert prov["ended_utc"].endswith("Z") and status["state"] == "done"


def _git(*args: str) -> str:
    out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def test_the_reader_plan_was_committed_before_every_recorded_run():
    """The reader comparison's order, from git and the committed records alone: PLAN.md's first
    commit is older than every record's start, and every record's code (its status.json commit,
    not dirty, one commit for all runs) contains that plan."""
    plan = "results/experience_helps/reader/PLAN.md"
    records = sorted((ROOT / "results/experience_helps/reader/records").glob("*.jsonl"))
    if not records:
        pytest.skip("no reader record committed yet")
    history = _git("log", "--reverse", "--format=%H %ct", "--", plan).splitlines()
    if not history or _git("rev-parse", "--is-shallow-repository") == "true":
        pytest.skip("needs the repository's full history (git log of PLAN.md)")
    plan_commit, plan_time = history[0].split()
    commits = set()
    for path in records:
        prov = json.loads(path.read_text().splitlines()[0])["run"]["provenance"]
        assert prov["started_at"] > int(plan_time), f"{path.name} started before the plan"
        assert not prov["dirty"], f"{path.name} ran from uncommitted code"
        assert subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor", plan_commit,
                               prov["commit"]]).returncode == 0, \
            f"{path.name}'s code {prov['commit'][:10]} does not contain the plan {plan_commit[:10]}"
        commits.add(prov["commit"])
    assert len(commits) == 1, f"the runs ran from several commits: {sorted(commits)}"
    page = (ROOT / "results/experience_helps/reader/README.md").read_text()
    (code,) = commits
    assert f"committed in {plan_commit[:7]}" in page and f"in {code[:7]}" in page, \
        "the page's Order paragraph does not name the plan's first commit and the runs' code"
