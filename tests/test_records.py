"""Run-directory damage is an error that names the file (and line) and the way out, never a silent
drop (issue 20): torn / corrupt record lines, ``--resume --repair``, stale checkpoint
temporaries, damaged checkpoint files and config, and checkpoint steps beyond the run."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from crl_bench.records.files import (CheckpointError, RecordError, RunDir, read_jsonl,
                                      scan_jsonl)

HOLD = """
import sys, time
from crl_bench.records.files import RunDir
run = RunDir(sys.argv[1]); run.acquire(); print("held", flush=True); time.sleep(600)
"""


def write_lines(path: Path, text: str) -> None:
    path.write_text(text)


# -- record lines ------------------------------------------------------------------------------

def test_torn_last_line_is_an_error_naming_file_line_and_repair(tmp_path):
    run = RunDir(tmp_path / "run")
    write_lines(run.path / "metrics.jsonl", '{"step": 0, "a": 1}\n{"step": 1, "a": 2}\n{"step": 2, "a"')
    with pytest.raises(RecordError, match=r"metrics.jsonl, line 3: torn last line .*"
                                          r"crl-bench run --resume --repair --out .*metrics.jsonl.bad"):
        read_jsonl(run.path / "metrics.jsonl")


def test_corrupt_middle_line_stops_truncate_after_without_rewriting(tmp_path):
    run = RunDir(tmp_path / "run")
    text = '{"step": 1}\n{"step": 2, "x": \x00garbage\n{"step": 3}\n'
    write_lines(run.path / "episodes.jsonl", text)
    write_lines(run.path / "metrics.jsonl", '{"step": 1}\n{"step": 3}\n')
    with pytest.raises(RecordError, match=r"episodes.jsonl, line 2: not JSON"):
        run.truncate_after(1)
    # nothing was rewritten: not the damaged file, not the others
    assert (run.path / "episodes.jsonl").read_text() == text
    assert (run.path / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 3}\n'
    # a line that is JSON but not a record object is damage too
    write_lines(run.path / "eval.jsonl", '{"step": 1}\n[1, 2]\n')
    with pytest.raises(RecordError, match=r"eval.jsonl, line 2: not a JSON object \(list\)"):
        read_jsonl(run.path / "eval.jsonl")


def test_repair_moves_bad_lines_aside_and_keeps_the_rest(tmp_path):
    run = RunDir(tmp_path / "run")
    write_lines(run.path / "episodes.jsonl", '{"step": 1}\nBROKEN\n{"step": 2}\n{"step": 3, "torn')
    write_lines(run.path / "metrics.jsonl", '{"step": 1}\n')
    moved = run.repair_records()
    assert moved == {"episodes.jsonl": [2, 4]}
    assert read_jsonl(run.path / "episodes.jsonl") == [{"step": 1}, {"step": 2}]
    bad = (run.path / "episodes.jsonl.bad").read_text().splitlines()
    assert bad == ["# episodes.jsonl line 2: not JSON (Expecting value)", "BROKEN",
                   "# episodes.jsonl line 4: torn last line (no newline: a crash while writing)",
                   '{"step": 3, "torn']
    assert read_jsonl(run.path / "metrics.jsonl") == [{"step": 1}]   # untouched
    assert run.truncate_after(1) == {"metrics.jsonl": 0, "episodes.jsonl": 1, "eval.jsonl": 0,
                                   "extractor.jsonl": 0}


def test_unfinished_last_line_of_a_live_run_is_an_append_in_progress(tmp_path):
    """While another process holds the run, a last line without its newline is being written:
    readers (report, the e2e test's polling) skip it instead of failing."""
    path = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        write_lines(path / "metrics.jsonl", '{"step": 1}\n{"step": 2, "a"')
        assert read_jsonl(path / "metrics.jsonl") == [{"step": 1}]
        write_lines(path / "metrics.jsonl", '{"step": 1}\nBROKEN\n{"step": 2}\n')
        with pytest.raises(RecordError, match="line 2"):   # a complete bad line is still damage
            read_jsonl(path / "metrics.jsonl")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    write_lines(path / "metrics.jsonl", '{"step": 1}\n{"step": 2, "a"')
    assert scan_jsonl(path / "metrics.jsonl")[1][0][0] == 2   # holder gone: torn, not in flight


def test_stale_temporaries_are_removed_and_real_files_kept(tmp_path):
    run = RunDir(tmp_path / "run")
    stale = run.path / "checkpoints" / ".tmp-123-456"
    (stale / "adapters").mkdir(parents=True)
    (stale / "trainers.pt").write_bytes(b"half")
    (run.path / "checkpoints" / "last").mkdir()
    (run.path / "checkpoints" / "last" / "loop_state.json").write_text('{"step": 1}')
    (run.path / "trajectories" / "train_step_00002.tmp").write_text("x")
    (run.path / ".status.json.abc123").write_text("{")
    (run.path / "episodes.tmp").write_text("x")
    (run.path / "episodes.jsonl").write_text('{"step": 1}\n')
    removed = run.remove_stale_temporaries()
    assert len(removed) == 4 and not stale.exists()
    assert sorted(p.name for p in run.path.iterdir()) == ["checkpoints", "episodes.jsonl", "trajectories"]
    assert (run.path / "checkpoints" / "last" / "loop_state.json").exists()


def test_damaged_status_json_is_named(tmp_path):
    run = RunDir(tmp_path / "run")
    (run.path / "status.json").write_text("{garbage")
    with pytest.raises(RecordError, match=r"status.json is damaged .* delete it and continue with "
                                          r"`crl-bench run --resume"):
        run.status()


# -- checkpoint files --------------------------------------------------------------------------

def make_checkpoint(path: Path, step: int = 2) -> Path:
    torch = pytest.importorskip("torch")
    (path / "adapters").mkdir(parents=True)
    torch.save({"rng": {"torch": torch.get_rng_state()}, "actor": {"trainer": {"updates": 3}}},
               path / "state.pt")
    (path / "loop_state.json").write_text(json.dumps({"step": step}))
    return path


@pytest.mark.parametrize("damage,match", [
    (lambda c: (c / "state.pt").write_bytes((c / "state.pt").read_bytes()[:100]),
     r"state.pt is damaged or missing \(BadZipFile"),
    (lambda c: (c / "state.pt").write_bytes(b""), r"state.pt is damaged or missing"),
    (lambda c: (c / "state.pt").unlink(), r"state.pt is damaged or missing \(FileNotFoundError"),
    (lambda c: ((c / "state.pt").rename(c / "trainers.pt"), (c / "rng.pt").write_bytes(b"")),
     r"a checkpoint of an older layout \(trainers.pt and rng.pt"),
    (lambda c: (c / "loop_state.json").write_text("\x00\x01garbage"),
     r"loop_state.json cannot be read \(JSONDecodeError"),
    (lambda c: (c / "loop_state.json").write_text('{"step": "two"}'),
     r"loop_state.json holds no valid step \(got 'two'\)"),
    (lambda c: (c / "loop_state.json").write_text('[2]'), r"loop_state.json holds no valid step"),
    (lambda c: shutil.rmtree(c / "adapters"), r"adapters is missing"),
])
def test_damaged_checkpoint_file_is_named_with_the_way_out(tmp_path, damage, match, monkeypatch):
    # a checkpoint without checksums.json (an older one) is refused unless the user allows it;
    # allowed, its files are checked for format: these are those checks
    monkeypatch.setenv("CRL_ALLOW_UNCHECKED_CHECKPOINT", "1")
    run = RunDir(tmp_path / "run")
    ckpt = make_checkpoint(run.checkpoint_dir)
    assert run.verify_checkpoint(ckpt) == 2
    damage(ckpt)
    with pytest.raises(CheckpointError, match=match + r".*Move the checkpoint aside"):
        run.verify_checkpoint(ckpt)


# -- through the runner, on a real tiny run ----------------------------------------------------

@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A real `tiny` grpo run of 2 steps (evaluation only at the end, 1 episode per task)."""
    pytest.importorskip("torch")
    pytest.importorskip("nle")
    from crl_bench.runner.api import run_experiment

    out = tmp_path_factory.mktemp("records") / "run"
    run_experiment("grpo", "minihack", "tiny", 0, out, steps=2, progress=False,
                   overrides={"threads": 1, "eval.at_start": False, "eval.every": 0,
                              "eval.episodes_per_task": 1})
    assert json.loads((out / "status.json").read_text())["state"] == "done"
    return out


def crashed_copy(src: Path, dst: Path, step: int = 2) -> RunDir:
    """The run as a crash after step ``step``'s checkpoint (before its status) leaves it."""
    shutil.copytree(src, dst)
    run = RunDir(dst)
    run.set_status("running", step - 1)
    return run


def test_resume_refuses_damage_then_repair_continues(finished_run, tmp_path):
    from crl_bench.runner.api import run_experiment

    run = crashed_copy(finished_run, tmp_path / "run")
    stale = run.path / "checkpoints" / ".tmp-1-2"
    stale.mkdir()
    with open(run.path / "episodes.jsonl", "a") as fh:
        fh.write('{"step": 2, "phase": "tra')          # torn by the crash
    before = (run.path / "episodes.jsonl").read_text()
    with pytest.raises(RecordError, match=r"episodes.jsonl, line \d+: torn last line.*--repair"):
        run_experiment(None, None, None, None, run.path, steps=3, progress=False)
    assert (run.path / "episodes.jsonl").read_text() == before   # nothing dropped silently
    assert not stale.exists()                                     # removed at start
    run_experiment(None, None, None, None, run.path, steps=3, progress=False, repair=True,
                   overrides={"threads": 1})
    assert json.loads((run.path / "status.json").read_text())["state"] == "done"
    assert '"phase": "tra' in (run.path / "episodes.jsonl.bad").read_text()
    steps = sorted({e["step"] for e in read_jsonl(run.path / "metrics.jsonl")})
    assert steps == [1, 2, 3]


def test_checkpoint_at_the_last_step_marks_the_run_done(finished_run, tmp_path):
    from crl_bench.runner.api import run_experiment

    run = crashed_copy(finished_run, tmp_path / "run")
    records = (run.path / "metrics.jsonl").read_text()
    run_experiment(None, None, None, None, run.path, progress=False)
    assert run.status()["state"] == "done" and run.status()["step"] == 2
    assert (run.path / "metrics.jsonl").read_text() == records


def test_checkpoint_beyond_the_run_is_refused(finished_run, tmp_path):
    from crl_bench.runner.api import run_experiment
    from crl_bench.config.schema import ConfigError

    run = crashed_copy(finished_run, tmp_path / "run")
    with pytest.raises(ConfigError, match=r"checkpoint .* is at step 2, beyond the run's steps=1.*"
                                          r"--steps 2 or more"):
        run_experiment(None, None, None, None, run.path, steps=1, progress=False)
    state = run.checkpoint_dir / "loop_state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), "step": 99}))
    from crl_bench.records.checksums import write_manifest

    with pytest.raises(CheckpointError, match=r"loop_state.json has \d+ bytes, not the \d+ written"):
        run_experiment(None, None, None, None, run.path, progress=False)  # edited after the fact
    write_manifest(run.checkpoint_dir)  # as a checkpoint written at step 99 would have it
    with pytest.raises(ConfigError, match=r"at step 99, beyond the run's steps=2"):
        run_experiment(None, None, None, None, run.path, progress=False)
    assert run.status()["state"] == "running"        # refused before anything ran


@pytest.mark.parametrize("what,damage,error,match", [
    ("state", lambda p: (p / "checkpoints/last/state.pt").write_bytes(b"PK\x03\x04trunc"),
     CheckpointError, r"checkpoints/last/state.pt is damaged"),
    ("state-empty", lambda p: (p / "checkpoints/last/state.pt").write_bytes(b""),
     CheckpointError, r"checkpoints/last/state.pt is damaged"),
    ("config", lambda p: (p / "config.json").write_text("{not json"),
     "ConfigError", r"config.json is not a valid run configuration \(Expecting"),
    ("config-field", lambda p: (p / "config.json").write_text(
        (p / "config.json").read_text().replace('"checkpoint_every": 1', '"checkpoint_every": 0')),
     # an edited field is named by the resume fingerprint check, before validation
     "ConfigError", r"config.json was changed since the run started: checkpoint_every: 1 -> 0"),
])
def test_damaged_run_files_are_named_on_resume(finished_run, tmp_path, what, damage, error, match):
    from crl_bench.runner.api import run_experiment
    from crl_bench.config.schema import ConfigError

    error = ConfigError if error == "ConfigError" else error
    run = crashed_copy(finished_run, tmp_path / "run")
    damage(run.path)
    with pytest.raises(error, match=match):
        run_experiment(None, None, None, None, run.path, steps=3, progress=False)


def test_resume_with_other_agent_or_tasks_is_refused(finished_run, tmp_path):
    from crl_bench.runner.api import run_experiment
    from crl_bench.config.schema import ConfigError

    run = crashed_copy(finished_run, tmp_path / "run")
    with pytest.raises(ConfigError, match=r"--agent comp_rl \(stored: grpo\); --tasks webshop "
                                          r"\(stored: minihack\).*Leave these options out"):
        run_experiment("comp_rl", "webshop", None, None, run.path, progress=False)
    with pytest.raises(ConfigError, match=r"--seed 5 \(stored: 0\)"):
        run_experiment("grpo", "minihack", "tiny", 5, run.path, progress=False)


def test_resume_of_a_finished_run_checks_identity_then_leaves_it(finished_run, tmp_path):
    from crl_bench.runner.api import run_experiment
    from crl_bench.config.schema import ConfigError

    run = RunDir(tmp_path / "run")
    shutil.copytree(finished_run, run.path, dirs_exist_ok=True)
    before = (run.path / "metrics.jsonl").read_text()
    assert run_experiment("grpo", None, None, None, run.path, progress=False) == run.path
    assert (run.path / "metrics.jsonl").read_text() == before
    with pytest.raises(ConfigError, match=r"--agent comp_rl \(stored: grpo\)"):
        run_experiment("comp_rl", None, None, None, run.path, progress=False)


def test_a_finished_run_is_extended_by_a_larger_steps(finished_run, tmp_path):
    """--steps beyond a finished run's own continues it from its last checkpoint: the records of
    steps 1-2 stay as they were (their end evaluation included), step 3 is trained and evaluated,
    the stored configuration says 3 steps; --steps at or below its own leaves it as it is."""
    from crl_bench.runner.api import run_experiment
    from crl_bench.records.files import read_jsonl

    run = RunDir(tmp_path / "run")
    shutil.copytree(finished_run, run.path, dirs_exist_ok=True)
    before = (run.path / "metrics.jsonl").read_text()
    assert run_experiment(None, None, None, None, run.path, steps=2, progress=False) == run.path
    assert (run.path / "metrics.jsonl").read_text() == before
    lora_before = (run.path / "checkpoints/last/adapters").stat().st_mtime_ns
    run_experiment(None, None, None, None, run.path, steps=3, progress=False)
    assert (run.path / "metrics.jsonl").read_text().startswith(before)
    assert [m["step"] for m in read_jsonl(run.path / "metrics.jsonl")] == [1, 2, 3]
    assert sorted({e["step"] for e in read_jsonl(run.path / "eval.jsonl")}) == [2, 3]
    assert run.status()["state"] == "done" and run.status()["step"] == 3
    assert json.loads((run.path / "config.json").read_text())["steps"] == 3
    state = json.loads((run.path / "checkpoints/last/loop_state.json").read_text())
    assert state["step"] == 3 and (run.path / "checkpoints/last/adapters").stat().st_mtime_ns != lora_before
