"""A resumed run keeps the configuration it started with: ``config.json`` edited by hand (agent,
seed, learning rate, ...) is refused at ``--resume`` with the field named, instead of mixing two
configurations' records in one run. The fingerprint lives in ``fingerprint.json`` with a
SHA-256 sidecar, written when the run starts."""

from __future__ import annotations

import json

import pytest

from crl_bench.runner.api import FINGERPRINT_FILE, record_fingerprint, run_experiment
from crl_bench.config.schema import ConfigError, build_config
from crl_bench.records.files import RunDir

STEPS = 2


def _finished_run(tmp_path):
    """The files a finished run leaves that a resume reads first: config.json (as the loop writes
    it: the configuration plus descriptive keys), the fingerprint, status ``done``."""
    cfg = build_config(agent="comp_rl", tasks="minihack", preset="tiny", seed=0, steps=STEPS)
    run = RunDir(tmp_path / "run")
    run.path.mkdir(parents=True, exist_ok=True)
    record_fingerprint(run, cfg)
    data = cfg.to_dict()
    data.update(agent_options={}, task_names=["minihack"], env_ids=["x"], host={})
    run.config_path.write_text(json.dumps(data))
    run.set_status("done", STEPS)
    return run, data


def _resume(run):
    return run_experiment(None, None, None, None, run.path, resume=True, progress=False)


def test_an_unchanged_run_resumes(tmp_path):
    run, _data = _finished_run(tmp_path)
    assert _resume(run) == run.path  # finished: left as it is


@pytest.mark.parametrize("edit, named", [
    (lambda d: d.update(agent="grpo"), 'agent: "comp_rl" -> "grpo"'),
    (lambda d: d.update(seed=7), "seed: 0 -> 7"),
    (lambda d: d["actor"].update(lr=d["actor"]["lr"] * 10), "actor.lr: "),
])
def test_a_hand_edited_config_is_refused_with_the_field_named(tmp_path, edit, named):
    run, data = _finished_run(tmp_path)
    edit(data)
    run.config_path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="was changed since the run started") as err:
        _resume(run)
    assert named in str(err.value) and FINGERPRINT_FILE in str(err.value), str(err.value)


def test_more_steps_and_speed_settings_are_not_part_of_the_fingerprint(tmp_path):
    run, data = _finished_run(tmp_path)
    data.update(steps=STEPS, threads=3)
    run.config_path.write_text(json.dumps(data))
    assert _resume(run) == run.path


def test_an_edited_fingerprint_is_refused_too(tmp_path):
    run, data = _finished_run(tmp_path)
    path = run.path / FINGERPRINT_FILE
    stored = json.loads(path.read_text())
    stored["fields"]["agent"] = "grpo"
    data["agent"] = "grpo"
    path.write_text(json.dumps(stored))
    run.config_path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="fingerprint cannot be trusted"):
        _resume(run)


def test_a_run_from_before_fingerprints_gets_one_with_a_warning(tmp_path, capsys):
    run, data = _finished_run(tmp_path)
    (run.path / FINGERPRINT_FILE).unlink()
    assert _resume(run) == run.path
    assert f"has no {FINGERPRINT_FILE}" in capsys.readouterr().err
    data["seed"] = 5  # from now on an edit is caught
    run.config_path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="seed: 0 -> 5"):
        _resume(run)


# -- checkpoint manifests, error lines, task lists ---------------------------------------------

def test_a_checkpoint_without_its_manifest_is_refused_unless_allowed(tmp_path, monkeypatch):
    """A deleted checksums.json turned every check off (the checkpoint loaded with a warning):
    refused now, naming the switch that loads it anyway."""
    from crl_bench.records.checksums import ChecksumError, verify_manifest, write_manifest

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "state.pt").write_bytes(b"weights")
    write_manifest(folder)
    assert verify_manifest(folder) is True
    (folder / "checksums.json").unlink()
    monkeypatch.delenv("CRL_ALLOW_UNCHECKED_CHECKPOINT", raising=False)
    with pytest.raises(ChecksumError, match="set CRL_ALLOW_UNCHECKED_CHECKPOINT=1"):
        verify_manifest(folder)
    monkeypatch.setenv("CRL_ALLOW_UNCHECKED_CHECKPOINT", "1")
    assert verify_manifest(folder) is False


def test_an_error_line_does_not_echo_a_120_kb_value(tmp_path, capsys):
    from crl_bench.cli import main

    for value in ("actor.lr=" + "z" * 120_000, "model.actor=" + "x" * 120_000):
        code = main(["run", "--preset", "cpu", "--set", value, "--out", str(tmp_path / "r"),
                     "--no-progress"])
        err = capsys.readouterr().err
        assert code == 2 and "error:" in err and len(err) < 2500, (code, len(err), err[:300])
        assert not (tmp_path / "r").exists()


def test_a_task_listed_more_than_once_is_refused():
    with pytest.raises(ConfigError, match="listed more than once") as err:
        build_config(tasks=",".join(["crl/SWE-v0"] * 12_500), preset="cpu")
    assert len(str(err.value)) <= 2000
    with pytest.raises(ConfigError, match="WebShop listed more than once"):
        build_config(tasks="3mix,webshop", preset="cpu")


@pytest.mark.slow
def test_a_real_run_keeps_its_fingerprint_and_refuses_an_edited_config(tmp_path):
    """``crl-bench run`` (tiny preset, MiniHack, one step) writes the fingerprint; ``--resume``
    of the finished run passes, and after ``config.json`` is edited to another agent it is
    refused with the field named and nothing recorded."""
    import os
    import subprocess
    import sys

    pytest.importorskip("torch")
    pytest.importorskip("nle")
    out = tmp_path / "run"
    env = dict(os.environ, TQDM_DISABLE="1", OMP_NUM_THREADS="1", CRL_WANDB="0")

    def crl(*args):
        return subprocess.run([sys.executable, "-m", "crl_bench.cli", "run", *args],
                              capture_output=True, text=True, timeout=900, env=env)

    res = crl("--agent", "comp_rl", "--tasks", "minihack", "--preset", "tiny", "--seed", "0",
              "--steps", "1", "--no-progress", "--no-report", "--set", "threads=1",
              "--set", "eval.at_start=false", "--set", "eval.episodes_per_task=1",
              "--set", "extractor.runs=inline", "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    assert (out / FINGERPRINT_FILE).is_file() and (out / (FINGERPRINT_FILE + ".sha256")).is_file()
    res = crl("--resume", "--out", str(out), "--no-progress", "--no-report")
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads((out / "config.json").read_text())
    data["agent"] = "grpo"
    (out / "config.json").write_text(json.dumps(data))
    episodes = (out / "episodes.jsonl").read_text()
    res = crl("--resume", "--out", str(out), "--steps", "2", "--no-progress", "--no-report")
    assert res.returncode == 2 and 'agent: "comp_rl" -> "grpo"' in res.stderr, res.stderr[-3000:]
    assert (out / "episodes.jsonl").read_text() == episodes
    # the checkpoint recorded the fingerprint too: with both fingerprint files deleted the
    # edited config.json is still refused, the field named
    (out / FINGERPRINT_FILE).unlink()
    (out / (FINGERPRINT_FILE + ".sha256")).unlink()
    res = crl("--resume", "--out", str(out), "--steps", "2", "--no-progress", "--no-report")
    assert res.returncode == 2 and "recorded in the checkpoint" in res.stderr \
        and 'agent: "comp_rl" -> "grpo"' in res.stderr, res.stderr[-3000:]
    assert (out / "episodes.jsonl").read_text() == episodes


# -- the fingerprint recorded in the checkpoint ---------------------------------------------------

def _checkpointed_run(tmp_path, fingerprint: str = "full"):
    """A run stopped after its last step's checkpoint (status running, a checkpoint at STEPS,
    written the way ``RunLoop.save_checkpoint`` writes its ``loop_state.json``): a resume
    verifies the checkpoint and ends the run without building anything."""
    import torch

    from crl_bench.records.checksums import checkpoint_fingerprint

    run, data = _finished_run(tmp_path)
    run.set_status("running", STEPS)
    cfg = build_config(agent="comp_rl", tasks="minihack", preset="tiny", seed=0, steps=STEPS)
    tmp = run.new_checkpoint_tmp()
    torch.save({}, tmp / "state.pt")
    (tmp / "adapters").mkdir()
    state = {"step": STEPS, "bank_counters": [0, 0]}
    if fingerprint == "full":
        state["fingerprint"] = checkpoint_fingerprint(cfg)
    elif fingerprint == "digest":
        state["fingerprint"] = {"sha256": checkpoint_fingerprint(cfg)["sha256"]}
    (tmp / "loop_state.json").write_text(json.dumps(state))
    run.commit_checkpoint(tmp)
    return run, data


def _delete_fingerprint(run):
    (run.path / FINGERPRINT_FILE).unlink()
    (run.path / f"{FINGERPRINT_FILE}.sha256").unlink()


def test_a_checkpoint_records_the_fingerprint_and_a_resume_checks_it_without_the_files(tmp_path):
    """Deleting fingerprint.json and its .sha256 let a hand-edited config.json resume with a
    warning; the checkpoint's own record (under its checksums) refuses it, naming the field."""
    run, data = _checkpointed_run(tmp_path)
    _delete_fingerprint(run)
    data["seed"] = 7
    run.config_path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="recorded in the checkpoint") as err:
        _resume(run)
    assert "seed: 0 -> 7" in str(err.value) and not (run.path / FINGERPRINT_FILE).exists()
    data["seed"] = 0  # restored: resumes, and fingerprint.json is written again
    run.config_path.write_text(json.dumps(data))
    assert _resume(run) == run.path and run.status()["state"] == "done"
    assert (run.path / FINGERPRINT_FILE).is_file()


def test_a_checkpoint_record_without_fields_names_the_fingerprint(tmp_path):
    run, data = _checkpointed_run(tmp_path, fingerprint="digest")
    _delete_fingerprint(run)
    data["actor"]["lr"] *= 10
    run.config_path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"disagrees with the fingerprint \(sha256 "):
        _resume(run)


def test_an_older_checkpoint_without_a_record_keeps_the_warning(tmp_path, capsys):
    run, data = _checkpointed_run(tmp_path, fingerprint="none")
    _delete_fingerprint(run)
    data["seed"] = 7
    run.config_path.write_text(json.dumps(data))
    assert _resume(run) == run.path
    assert f"has no {FINGERPRINT_FILE}" in capsys.readouterr().err


def test_the_checkpoint_record_is_under_its_checksums(tmp_path):
    """An edit of the record itself is a changed checkpoint file (refused by its manifest)."""
    from crl_bench.records.files import CheckpointError

    run, data = _checkpointed_run(tmp_path)
    _delete_fingerprint(run)
    (ckpt,) = [p for p in run.path.rglob("loop_state.json")]
    state = json.loads(ckpt.read_text())
    state["fingerprint"]["fields"]["seed"] = 7
    ckpt.write_text(json.dumps(state))
    data["seed"] = 7
    run.config_path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="loop_state.json"):
        _resume(run)
