"""``crl-bench eval`` on CPU: the embedded test model (tiny-sft), a run's checkpoint and a given
bank. The evaluation is the runner's own, so an evaluation of the model a run evaluated, with the
run's settings, must give that run's evaluation records episode for episode: the base model =
the run's step-0 evaluation (LoRA starts at B = 0), the run's checkpoint = its last evaluation.

The endpoint client against a real vLLM server: tests/test_eval_endpoint.py (scripts/test_vllm.sh).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from crl_bench.cli import main
from crl_bench.records.files import read_jsonl

pytest.importorskip("torch")
pytest.importorskip("nle")

SAME = ("task", "seed", "with_experience", "success", "score", "n_actions", "n_turns", "actions")


def evals_of(run: Path, step: int) -> list[dict]:
    return [{k: e[k] for k in SAME} for e in read_jsonl(run / "episodes.jsonl")
            if e["phase"] == "eval" and e["step"] == step]


def trajectories(run: Path, step: int) -> list[dict]:
    with gzip.open(run / "trajectories" / f"eval_step_{step:05d}.jsonl.gz", "rt") as fh:
        return [json.loads(line) for line in fh]


def test_eval_of_the_embedded_model_is_the_runs_step0_evaluation(tiny_run, tmp_path, capsys):
    run = tiny_run("grpo").path
    out = tmp_path / "ev"
    assert main(["eval", "tiny-sft", "--tasks", "minihack", "--preset", "tiny", "--seed", "0", "1",
                 "--out", str(out), "--no-progress", "--set", "threads=1"]) == 0
    printed = capsys.readouterr().out
    assert f"crl-bench show {out / 'seed_0'} --episode 0" in printed
    seed0 = out / "seed_0"
    config = json.loads((seed0 / "config.json").read_text())
    assert config["agent"] == "tiny-sft" and config["evaluated"]["source"] == "model"
    assert config["eval"]["episodes_per_task"] == 2  # the configuration's own eval section kept
    assert config["steps"] == 0 and json.loads((seed0 / "status.json").read_text())["state"] == "done"
    # the same episodes, actions and outcomes as the run's evaluation at step 0
    assert evals_of(seed0, 0) == evals_of(run, 0) and len(evals_of(run, 0)) == 2
    assert read_jsonl(seed0 / "eval.jsonl") == [r for r in read_jsonl(run / "eval.jsonl")
                                                 if r["step"] == 0]
    assert [t["turns"][0]["completion_ids"] for t in trajectories(seed0, 0)] == \
        [t["turns"][0]["completion_ids"] for t in trajectories(run, 0)]
    # seed 1 is another evaluation (other sampling), both in the report, with an interval
    assert [e["seed"] for e in evals_of(out / "seed_1", 0)] == [e["seed"] for e in evals_of(seed0, 0)]
    report = (out / "report" / "report.md").read_text()
    assert "| tiny-sft | 0 |" in report and "| tiny-sft | 1 |" in report
    assert "(2 seeds)" in report


def test_eval_of_a_runs_checkpoint_is_its_last_evaluation(tiny_run, tmp_path):
    run = tiny_run("grpo").path
    last = max(r["step"] for r in read_jsonl(run / "eval.jsonl"))
    out = tmp_path / "ckpt"
    assert main(["eval", str(run), "--out", str(out), "--no-progress"]) == 0
    got = out / "seed_0"
    config = json.loads((got / "config.json").read_text())
    assert config["evaluated"]["source"] == "checkpoint" and config["evaluated"]["checkpoint_step"] == last
    assert config["agent"] == f"{run.name}@step{last}" and config["steps"] == last
    assert evals_of(got, last) == evals_of(run, last)
    # the trained adapters are loaded: the recorded log-probs are the run's at its last step,
    # not the base model's (step 0)
    mine, theirs = trajectories(got, last), trajectories(run, last)
    lp = lambda ts: [x for t in ts for turn in t["turns"] for x in turn["logprobs"]]  # noqa: E731
    assert lp(mine) == pytest.approx(lp(theirs), abs=1e-4)
    base = trajectories(run, 0)
    same_tokens = [(a, b) for a, b in zip(theirs, base)
                   if a["turns"][0]["completion_ids"] == b["turns"][0]["completion_ids"]]
    for a, b in same_tokens:  # same prompt and tokens, other weights: other log-probs
        assert a["turns"][0]["logprobs"] != pytest.approx(b["turns"][0]["logprobs"], abs=1e-6)
    assert (out / "report" / "report.md").is_file()


def test_eval_with_a_given_bank_plays_without_and_with_experience(tiny_run, tmp_path):
    run = tiny_run("comp_rl").path
    bank = run / "bank.sqlite"
    before = bank.read_bytes()
    out = tmp_path / "bank"
    assert main(["eval", "tiny-sft", "--tasks", "minihack", "--preset", "tiny", "--bank", str(bank),
                 "--out", str(out), "--no-progress", "--no-report", "--set", "threads=1"]) == 0
    got = out / "seed_0"
    modes = sorted({(r["with_experience"], r["n"]) for r in read_jsonl(got / "eval.jsonl")})
    assert modes == [(False, 2), (True, 2)]
    given = [t for t in trajectories(got, 0) if t["with_experience"]]
    from crl_bench.experience.bank import ExperienceBank

    with ExperienceBank.open(bank, read_only=True, build_index=False) as b:
        ids = {e.id for e in b.list_entries(limit=10_000)}
    assert ids and all(t["experience_ids"] and set(t["experience_ids"]) <= ids for t in given)
    assert bank.read_bytes() == before  # the given bank was copied, never written
    assert json.loads((got / "config.json").read_text())["evaluated"]["bank"] == str(bank)


@pytest.mark.parametrize("argv, message", [
    (["--endpoint", "http://127.0.0.1:9/v1"], "--endpoint needs --model-id NAME"),
    (["--model-id", "x"], "--model-id names a model served at --endpoint URL"),
    (["tiny-sft", "--endpoint", "http://x/v1", "--model-id", "m"], "give either MODEL"),
    (["tiny-sft", "--bank", "nowhere/bank.sqlite"], "--bank nowhere/bank.sqlite: no such file"),
    (["tiny-sft", "--seed", "1", "1"], "give distinct seeds"),
    (["tiny-sft", "--episodes", "0"], "--episodes 0: give 1 or more"),
])
def test_bad_eval_arguments_are_refused_naming_the_fix(argv, message, tmp_path, capsys):
    assert main(["eval", *argv, "--preset", "tiny", "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_run_without_checkpoint_and_a_dead_endpoint_are_named(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / "status.json").write_text('{"state": "running", "step": 0}')
    assert main(["eval", str(run), "--out", str(tmp_path / "o")]) == 2
    assert "is a run without a checkpoint yet" in capsys.readouterr().err
    (run / "config.json").write_text('{"evaluated": {"model": "tiny-sft"}}')  # an evaluation's folder
    assert main(["eval", str(run), "--out", str(tmp_path / "o")]) == 2
    assert "is an evaluation's folder, not a run: evaluate what it evaluated (tiny-sft)" in \
        capsys.readouterr().err
    assert main(["eval", "--endpoint", "http://127.0.0.1:9/v1", "--model-id", "m", "--tasks",
                 "minihack", "--preset", "tiny", "--out", str(tmp_path / "o2"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "http://127.0.0.1:9/v1/models failed" in err and "Is the server running" in err
    assert not (tmp_path / "o2").exists()
