"""The end of ``crl-bench run``: what the run was, a sample of the bank, what to run next."""

from __future__ import annotations

import json

import numpy as np

from crl_bench.experience.bank import ExperienceBank
from crl_bench.runner.cli import closing_lines


def _run_dir(tmp_path, preset: str, entries: int):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"preset": preset, "agent": "comp_rl", "tasks": "3mix",
                                                 "steps": 2, "eval": {"episodes_per_task": 2}}))
    if entries:
        vecs = np.eye(8, dtype=np.float32)[:entries]
        with ExperienceBank(run / "bank.sqlite", dim=8, embedder_name="test") as bank:
            bank.add([{"title": f"title {i}", "content": f"look  for\nthe stairs {i}", "family": "minihack"}
                      for i in range(entries)], vecs, step=1)
    return run


def test_quick_run_ends_with_a_bank_sample_and_the_next_commands(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.argv", ["venv-x/bin/crl-bench", "run"])  # as the user ran it
    text = "\n".join(closing_lines(_run_dir(tmp_path, "quick", entries=5)))
    assert "`quick` preset: 2 step(s) of comp_rl on 3mix, 2 held-out episodes per cell" in text
    assert "not a result" in text
    assert "What the extractor wrote (3 of 5 bank entries" in text
    assert "[minihack] title 4: look for the stairs 4" in text       # the newest first, one line
    assert "  venv-x/bin/crl-bench run --agent comp_rl --tasks minihack --preset cpu --seed 0 1 2" in text
    assert "venv-x/bin/crl-bench bank show" in text
    assert "expect them to read poorly" in text  # a small model's entries, said so


def test_a_cpu_run_gets_the_bank_sample_without_the_quick_advice(tmp_path):
    text = "\n".join(closing_lines(_run_dir(tmp_path, "cpu", entries=1)))
    assert "What the extractor wrote (1 of 1" in text
    assert "not a result" not in text and "Next, for a result" not in text


def test_no_config_no_lines(tmp_path):
    assert closing_lines(tmp_path) == []


def test_summary_of_a_single_evaluation_has_no_arrow():
    from crl_bench.runner.cli import summary_lines

    evals = [{"step": 2, "task": "WebShop", "with_experience": m, "n": 2, "success_rate": 0.5}
             for m in (False, True)]
    lines = summary_lines(evals)
    assert lines[0] == "success rate over held-out episodes, evaluation at step 2:"
    assert "->" not in lines[2] and lines[2].split() == ["WebShop", "0.50", "(2", "episodes)",
                                                         "0.50", "(2", "episodes)"]
    both = summary_lines(evals + [dict(e, step=0, success_rate=0.0) for e in evals])
    assert both[0] == "success rate over held-out episodes, evaluation at step 0 -> step 2:"
    assert "0.00 -> 0.50 (2 episodes)" in both[2]


def test_the_sample_covers_each_family_and_the_program_is_the_one_run(tmp_path, monkeypatch):
    import os

    from crl_bench.runner.cli import invoked_program

    run = _run_dir(tmp_path, "quick", entries=0)
    vecs = np.eye(8, dtype=np.float32)
    with ExperienceBank(run / "bank.sqlite", dim=8, embedder_name="test") as bank:
        bank.add([{"title": "w", "content": "buy", "family": "webshop"}], vecs[:1], step=1)
        bank.add([{"title": f"m{i}", "content": "go", "family": "minihack"} for i in range(5)],
                 vecs[1:6], step=2)
    text = "\n".join(closing_lines(run))
    assert "[webshop] w: buy" in text and "latest of minihack, webshop" in text
    far = str(tmp_path / "elsewhere" / "bin" / "crl-bench")
    monkeypatch.setattr("sys.argv", [far])
    expected = os.path.relpath(far)
    assert invoked_program() == (far if expected.startswith("..") else expected)
    monkeypatch.setattr("sys.argv", ["/usr/lib/python3/x/pytest"])
    assert invoked_program().endswith(" -m crl_bench.cli")
