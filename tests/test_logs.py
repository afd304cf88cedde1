"""Logs people read: per evaluation a table of sampled episodes and bank entries in TensorBoard
(read back with TensorBoard's own event reader) and W&B (offline), and ``crl-bench show RUN_DIR
--episode N`` printing one episode as the model saw it (decoded from its stored token ids)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from crl_bench.cli import main
from crl_bench.run.eval_logs import BANK_COLUMNS, EPISODE_COLUMNS
from crl_bench.records.files import read_jsonl

pytest.importorskip("torch")
pytest.importorskip("nle")


def table_rows(markdown: str) -> list[list[str]]:
    lines = markdown.splitlines()
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in lines[2:]], lines[0]


def test_tensorboard_event_file_holds_the_episode_and_bank_tables(tiny_run):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    run = tiny_run("comp_rl").path
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    tags = acc.Tags()["tensors"]
    assert "eval/episodes/text_summary" in tags and "eval/bank/text_summary" in tags
    events = acc.Tensors("eval/episodes/text_summary")
    evals = [e for e in read_jsonl(run / "episodes.jsonl") if e["phase"] == "eval"]
    assert [e.step for e in events] == sorted({e["step"] for e in evals})
    for event in events:
        text = tensor_util.make_ndarray(event.tensor_proto).item().decode()
        rows, head = table_rows(text)
        assert head == "| " + " | ".join(EPISODE_COLUMNS) + " |"
        mine = [e for e in evals if e["step"] == event.step]
        assert len(rows) == min(8, len(mine)) == 4  # 2 episodes x without / with experience
        # the first of each (task, mode) cell first: one without, one with experience
        assert [r[1] for r in rows[:2]] == ["False", "True"]
        for row in rows:
            rec = next(e for e in mine if str(e["seed"]) == row[2]
                       and str(e["with_experience"]) == row[1])
            assert (row[0], row[3], int(row[5]), int(row[6])) == (
                rec["task"], str(rec["success"]), rec["n_actions"], rec["n_turns"])
    bank_text = tensor_util.make_ndarray(acc.Tensors("eval/bank/text_summary")[-1].tensor_proto)
    rows, head = table_rows(bank_text.item().decode())
    assert head == "| " + " | ".join(BANK_COLUMNS) + " |" and rows
    from crl_bench.experience.bank import ExperienceBank

    with ExperienceBank.open(run / "checkpoints" / "last" / "bank.sqlite", read_only=True,
                             build_index=False) as bank:
        titles = {e.id: e.title for e in bank.list_entries(limit=10_000)}
    assert all(int(r[0]) in titles for r in rows)


def test_wandb_offline_gets_the_tables(tiny_run, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from crl_bench.experience.bank import ExperienceBank
    from crl_bench.llm.rollout import Trajectory
    from crl_bench.run.eval_logs import log_eval_tables

    run = tiny_run("comp_rl").path
    step = max(r["step"] for r in read_jsonl(run / "eval.jsonl"))
    with gzip.open(run / "trajectories" / f"eval_step_{step:05d}.jsonl.gz", "rt") as fh:
        trajs = [Trajectory.from_json(json.loads(line)) for line in fh]
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = wandb.init(project="crl-bench-test", dir=str(tmp_path), mode="offline")
    try:
        with ExperienceBank.open(run / "bank.sqlite", read_only=True, build_index=False) as bank:
            trainer = SimpleNamespace(tb=None, wandb=logger,
                                      ctx=SimpleNamespace(manager=SimpleNamespace(bank=bank)))
            log_eval_tables(trainer, step, trajs)
    finally:
        logger.finish()
    tables = {p.name.split("_")[0]: json.loads(p.read_text())
              for p in (tmp_path / "wandb").glob("offline-run-*/files/media/table/eval/*.table.json")}
    assert set(tables) == {"episodes", "bank"}
    assert tables["episodes"]["columns"] == EPISODE_COLUMNS
    from crl_bench.run.eval_logs import sample_episodes

    assert [(r[0], r[1], r[2], r[3]) for r in tables["episodes"]["data"]] == \
        [(t.task_name, t.with_experience, t.seed, t.success) for t in sample_episodes(trajs)]
    assert len(tables["episodes"]["data"]) == len(trajs) == 4
    assert tables["bank"]["columns"] == BANK_COLUMNS and tables["bank"]["data"]


def test_show_prints_an_episode_as_the_model_saw_it(tiny_run, capsys):
    run = tiny_run("grpo").path
    records = read_jsonl(run / "episodes.jsonl")
    assert main(["show", str(run)]) == 0
    listing = capsys.readouterr().out
    assert f"{len(records)} episode(s) in {run / 'episodes.jsonl'}" in listing
    from crl_bench.llm.models import load_tokenizer

    tok = load_tokenizer("tiny-sft")
    for phase in ("train", "eval"):
        n = max(i for i, r in enumerate(records) if r["phase"] == phase)  # the last of its kind
        rec = records[n]
        assert main(["show", str(run), "--episode", str(n)]) == 0
        out = capsys.readouterr().out
        path = run / "trajectories" / f"{phase}_step_{rec['step']:05d}.jsonl.gz"
        with gzip.open(path, "rt") as fh:
            same = [json.loads(line) for line in fh]
        position = sum(1 for r in records[:n] if (r["phase"], r["step"]) == (phase, rec["step"]))
        traj = same[position]
        assert (traj["task_name"], traj["seed"]) == (rec["task"], rec["seed"])
        assert out.startswith(f"episode {n}: {phase} step {rec['step']}, {rec['task']}")
        first = traj["turns"][0]
        # the prompt exactly as the model got it: its own ids decoded, chat template included
        prompt = tok.decode(first["prompt_ids"], skip_special_tokens=False)
        assert prompt in out and traj["goal"] in prompt and "<|im_start|>" in prompt
        assert first["completion_text"] in out
        sent = [f"----- action sent: {a!r}" for a in rec["actions"]]
        assert [line.split(";")[0] for line in out.splitlines()
                if line.startswith("----- action sent")] == sent
        assert f"success={traj['success']}" in out.splitlines()[-1]
    assert main(["show", str(run), "--episode", str(len(records))]) == 2
    assert f"has episodes 0..{len(records) - 1}" in capsys.readouterr().err
