"""A run's status.json carries its provenance: the code's commit and the config's hash at each
attempt's start, the wall-clock start of the first attempt and the end of the run, so that the
order of a plan's commit and its runs can be checked from the files."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

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
