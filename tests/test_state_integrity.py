"""State that is what it claims, driven through ``crl-bench run`` as a user (or a disk) would
damage it: checkpoint files carry checksums verified before a resume loads or copies anything;
a damaged checkpoint bank is named under its own path before it can replace the run's bank;
``--resume`` of a folder without a stored run is refused; and the history window stays bounded
whatever length of action a policy writes.

The runs are the ``tiny`` preset on MiniHack (one step, one torch thread, the extractor inline):
one comp_rl run is made per module and each test damages its own copy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("nle")

from crl_bench.records.files import RunDir  # noqa: E402

RUN_ARGS = ["--agent", "comp_rl", "--tasks", "minihack", "--preset", "tiny", "--seed", "0",
            "--no-progress", "--no-report", "--set", "threads=1", "--set", "eval.at_start=false",
            "--set", "eval.episodes_per_task=1", "--set", "extractor.runs=inline"]


def crl(*args: str, timeout: float = 900, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CRL_BENCH_KILL_AT"}
    env.update(extra_env)
    env.update(TQDM_DISABLE="1", OMP_NUM_THREADS="1", CRL_WANDB="0")
    return subprocess.run([sys.executable, "-m", "crl_bench.cli", "run", *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def error_line(res: subprocess.CompletedProcess[str]) -> str:
    """The one `error:` line a refused command ends with (exit 2, no traceback)."""
    assert res.returncode == 2, (res.returncode, res.stderr[-3000:])
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    errors = [line for line in res.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("crl-bench run: error: "), res.stderr[-3000:]
    return errors[0]


@pytest.fixture(scope="module")
def one_step_run(tmp_path_factory) -> Path:
    """A finished comp_rl run of one step: its checkpoint holds adapters and a bank."""
    out = tmp_path_factory.mktemp("state") / "run"
    res = crl(*RUN_ARGS, "--steps", "1", "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    assert (out / "checkpoints/last/bank.sqlite").is_file()
    return out


def copy_of(run: Path, dst: Path) -> Path:
    shutil.copytree(run, dst)
    return dst


def flip(path: Path, offset: int, length: int = 1) -> None:
    """Invert ``length`` bytes of ``path`` at ``offset`` (negative: from the end), in place."""
    data = bytearray(path.read_bytes())
    start = offset % len(data)
    data[start:start + length] = bytes(b ^ 0xFF for b in data[start:start + length])
    path.write_bytes(bytes(data))


def records(run: Path) -> dict[str, str]:
    return {name: (run / name).read_text() for name in ("metrics.jsonl", "episodes.jsonl")}


# -- checksums ---------------------------------------------------------------------------------

def test_flipped_adapter_bytes_are_refused_before_anything_loads(one_step_run, tmp_path):
    """Flipped bytes in the data of an adapter's safetensors once loaded silently (exit 0, the
    run went on from weights it never had): the checkpoint's checksums name the file now."""
    run = copy_of(one_step_run, tmp_path / "run")
    adapter = run / "checkpoints/last/adapters/actor/adapter_model.safetensors"
    flip(adapter, -64, 8)  # inside the last tensor's data: the file still parses
    before = records(run)
    res = crl("--resume", "--out", str(run), "--steps", "2", "--no-progress", "--no-report")
    line = error_line(res)
    assert f"{adapter} does not match the SHA-256 written with the checkpoint" in line
    assert f"mv {run / 'checkpoints/last'}" in line       # the way out
    assert records(run) == before                          # nothing ran


@pytest.mark.parametrize("legacy", [False, True], ids=["with_checksums", "without_checksums"])
def test_a_garbage_checkpoint_bank_is_named_before_it_replaces_the_runs_bank(
        one_step_run, tmp_path, legacy):
    """The checkpoint's bank.sqlite overwritten with garbage was copied over the run's bank and
    then reported under the run's bank path; now it is named under its checkpoint path, and the
    run's bank is left as it was. Without checksums (an older checkpoint) the bank is still
    checked as a database."""
    run = copy_of(one_step_run, tmp_path / "run")
    ckpt_bank = run / "checkpoints/last/bank.sqlite"
    ckpt_bank.write_bytes(b"not a database\x00" * 3000)
    if legacy:
        (run / "checkpoints/last/checksums.json").unlink(missing_ok=True)
    live = (run / "bank.sqlite").read_bytes()
    res = crl("--resume", "--out", str(run), "--steps", "2", "--no-progress", "--no-report",
              CRL_ALLOW_UNCHECKED_CHECKPOINT="1" if legacy else "0")
    line = error_line(res)
    assert str(ckpt_bank) in line and str(run / "bank.sqlite") not in line
    if legacy:
        assert "is not an intact SQLite database (file is not a database)" in line
        assert "has no checksums.json" in res.stderr     # accepted with a warning, then checked
    else:
        assert "written with the checkpoint" in line
    assert (run / "bank.sqlite").read_bytes() == live      # not copied over the run's bank


@pytest.mark.parametrize("legacy", [False, True], ids=["with_checksums", "without_checksums"])
def test_flipped_bank_pages_give_a_clear_error_not_a_bare_database_error(
        one_step_run, tmp_path, legacy):
    run = copy_of(one_step_run, tmp_path / "run")
    ckpt_bank = run / "checkpoints/last/bank.sqlite"
    size = ckpt_bank.stat().st_size
    assert size >= 3 * 4096
    flip(ckpt_bank, 4096, size - 4096)  # every page after the header page
    if legacy:
        (run / "checkpoints/last/checksums.json").unlink(missing_ok=True)
    res = crl("--resume", "--out", str(run), "--steps", "2", "--no-progress", "--no-report",
              CRL_ALLOW_UNCHECKED_CHECKPOINT="1" if legacy else "0")
    line = error_line(res)
    assert str(ckpt_bank) in line and "DatabaseError" not in line
    assert ("damaged SQLite database" in line or "not an intact SQLite database" in line
            if legacy else "does not match the SHA-256" in line)
    assert "Move the checkpoint aside" in line


def test_a_checkpoint_without_checksums_is_refused_unless_allowed(one_step_run, tmp_path, capsys,
                                                                  monkeypatch):
    """A deleted checksums.json would turn every check off: refused, naming the switch; with
    CRL_ALLOW_UNCHECKED_CHECKPOINT=1 (an older checkpoint, on the user's word) its files are
    checked for format only, and the user is told so."""
    from crl_bench.records.files import CheckpointError

    run = RunDir(copy_of(one_step_run, tmp_path / "run"))
    ckpt = run.last_checkpoint()
    assert run.verify_checkpoint(ckpt) == 1
    assert "warning" not in capsys.readouterr().err
    (ckpt / "checksums.json").unlink(missing_ok=True)
    monkeypatch.delenv("CRL_ALLOW_UNCHECKED_CHECKPOINT", raising=False)
    with pytest.raises(CheckpointError, match="set CRL_ALLOW_UNCHECKED_CHECKPOINT=1"):
        run.verify_checkpoint(ckpt)
    monkeypatch.setenv("CRL_ALLOW_UNCHECKED_CHECKPOINT", "1")
    assert run.verify_checkpoint(ckpt) == 1
    assert f"[resume] warning: {ckpt} has no checksums.json" in capsys.readouterr().err


def test_a_file_added_to_a_checkpoint_is_refused(one_step_run, tmp_path):
    run = RunDir(copy_of(one_step_run, tmp_path / "run"))
    ckpt = run.last_checkpoint()
    extra = ckpt / "adapters/actor/extra.safetensors"
    shutil.copyfile(ckpt / "adapters/actor/adapter_model.safetensors", extra)
    from crl_bench.records.files import CheckpointError

    with pytest.raises(CheckpointError, match=f"{extra} was not part of the checkpoint"):
        run.verify_checkpoint(ckpt)


# -- --resume needs a stored run ---------------------------------------------------------------

def stopped_before_config(out: Path) -> Path:
    """What a new run leaves when it is killed before it writes config.json: the folder, its
    lock file and trajectories/, the record of the bank at start."""
    run = RunDir(out)
    run.acquire()
    run.start_bank_path.parent.mkdir(parents=True, exist_ok=True)
    run.no_start_bank_path.write_text("the run started without an experience bank\n")
    run.release()
    assert not run.config_path.exists()
    return out


def test_resume_of_a_folder_without_config_is_refused_with_the_fix(tmp_path):
    """`--resume` of a run killed before config.json was written once ran another experiment
    (comp_rl / 3mix / the default preset); it is refused now, with the command that starts it."""
    out = stopped_before_config(tmp_path / "run")
    res = crl("--resume", "--out", str(out), "--no-progress", "--no-report", timeout=300)
    line = error_line(res)
    assert (f"--resume: {out} holds no config.json (the run was stopped before it wrote its "
            "configuration") in line
    assert f"crl-bench run --agent AGENT --tasks TASKS --preset PRESET --out {out}" in line
    assert not (out / "config.json").exists() and not (out / "metrics.jsonl").exists()


def test_resume_with_options_of_a_folder_without_config_names_them(tmp_path, capsys):
    from crl_bench.cli import main

    out = stopped_before_config(tmp_path / "run")
    rc = main(["run", "--resume", "--agent", "grpo", "--tasks", "minihack", "--preset", "tiny",
               "--steps", "1", "--no-progress", "--no-report", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"crl-bench run --agent grpo --tasks minihack --preset tiny --out {out}" in err
    assert not (out / "config.json").exists()
    missing = tmp_path / "never_made"
    rc = main(["run", "--resume", "--out", str(missing), "--no-progress"])
    assert rc == 2 and f"--resume: {missing} does not exist" in capsys.readouterr().err
    assert not missing.exists()


# -- the history window ------------------------------------------------------------------------

def test_history_window_stays_bounded_under_huge_actions():
    """MiniHack, ``history=1``, a policy whose every action is 50,000 characters: each action
    was fed back whole, so prompts grew to ~27k tokens. The window now shows a past action cut in
    the middle with a marker, so every prompt after the first has about the same bounded size."""
    import gymnasium

    from _forced_backend import ForcedBackend
    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.llm.prompting import PromptConfig
    from crl_bench.llm.rollout import EpisodeSpec, RolloutEngine
    from crl_bench.llm.types import SamplingParams

    tiny = HFBackend("tiny-random", roles=("actor",), seed=0)
    action = "north " + "=" * 50_000  # ~800 tokens: 64-character tokens keep the model cheap
    backend = ForcedBackend(tiny, lambda prompt: f"<answer>{action}</answer>")
    config = PromptConfig(history=1, max_turns=4, max_episode_tokens=10**6)
    engine = RolloutEngine(backend, SamplingParams(max_new_tokens=10**6), config)
    env = gymnasium.make("crl/MiniHack-Room-5x5-v0")
    [traj] = engine.run([EpisodeSpec(env=env, seed=0)])
    env.close()
    assert len(traj.turns) == 4 and all(len(t.action) > 50_000 for t in traj.turns)
    prompts = [tiny.tokenizer.decode(t.prompt_ids) for t in traj.turns]
    # what the window may hold: the past observation and action and the current observation,
    # each cut to its bound (6000 characters by default), plus the fixed text around them
    cut = 6000
    for text in prompts[1:]:
        assert len(text) < 3 * cut + 4000, len(text)
        assert "characters cut ...]" in text.split("Current observation")[0]
        assert "=" * (cut + 1) not in text
    tokens = [len(t.prompt_ids) for t in traj.turns]
    assert max(tokens[1:]) - min(tokens[1:]) < 200, tokens  # no growth from turn to turn
    assert (config.max_observation_chars, config.max_response_chars) == (cut, cut)


def test_a_changed_start_bank_is_named_before_it_replaces_the_runs_bank(one_step_run, tmp_path):
    """A run that found a bank in OUT keeps a copy of it (checkpoints/bank_at_start.sqlite) to go
    back to when it dies before its first checkpoint; that copy carries a checksum too."""
    out = tmp_path / "run"
    out.mkdir()
    shutil.copyfile(one_step_run / "bank.sqlite", out / "bank.sqlite")
    env = dict(os.environ, TQDM_DISABLE="1", OMP_NUM_THREADS="1", CRL_WANDB="0")
    faults = Path(__file__).with_name("_faults.py")  # the tests' fault injector: SIGKILL at startup
    res = subprocess.run([sys.executable, str(faults), "startup", "run", *RUN_ARGS, "--steps", "1",
                          "--out", str(out)], capture_output=True, text=True, timeout=900, env=env)
    assert res.returncode == -9, res.stderr[-3000:]          # SIGKILLed before any checkpoint
    start = out / "checkpoints/bank_at_start.sqlite"
    assert start.is_file()
    flip(start, -100)                                        # a byte of the last page's data
    live = (out / "bank.sqlite").read_bytes()
    res = crl("--resume", "--out", str(out), "--no-progress", "--no-report")
    line = error_line(res)
    assert f"{start} does not match the SHA-256 in bank_at_start.sqlite.sha256" in line
    assert (out / "bank.sqlite").read_bytes() == live
