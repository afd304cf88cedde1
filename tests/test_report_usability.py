"""What a user reads around runs and reports: `bank show`'s retrieval times, the data hint `run`
prints, the help's file names, "did you mean" for settings, task names and env ids."""

from __future__ import annotations

import numpy as np
import pytest

from crl_bench.cli import main
from crl_bench.experience.bank import ExperienceBank
from crl_bench.experience.manager import RetrievalConfig, step_clock


def test_bank_show_gives_a_runs_logical_clock_as_its_step(tmp_path, capsys):
    path = tmp_path / "bank.sqlite"
    vecs = np.eye(8, dtype=np.float32)
    with ExperienceBank(path, dim=8, embedder_name="test") as bank:
        bank.add([{"title": "t", "content": "c", "family": "minihack"},
                  {"title": "u", "content": "d", "family": "minihack"},
                  {"title": "v", "content": "e", "family": "minihack"}], vecs[:3], step=1)
        origin = float(bank.meta["created_at"])
        # a run's manager stamps retrievals with step_clock: created_at + step x step_s
        clock = step_clock(lambda: 7, RetrievalConfig().step_s, origin=origin)
        bank.record_retrievals([1], clock())
        bank.record_retrievals([2], origin + 1234.5)  # a wall time (a bank used outside a run)
    assert main(["bank", "show", str(path)]) == 0
    out = capsys.readouterr().out
    first, second, third = out.split("\n#")
    assert "(last at step 7)" in first
    assert "(last 2" in second and "step" not in second.split("(last")[1].split(")")[0]
    assert "(last never)" in third


def test_bank_help_names_the_runs_bank_file(capsys):
    with pytest.raises(SystemExit):
        main(["bank", "stats", "--help"])
    out = capsys.readouterr().out
    assert "bank.sqlite" in out and "experience.sqlite" not in out


def test_the_missing_data_hint_gives_what_run_accepts(tmp_path, monkeypatch):
    from crl_bench.data import DataNotFoundError, resolve_data_dir

    for var in ("CRL_BENCH_WEBSHOP_DATA", "CRL_BENCH_DATA"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CRL_BENCH_CACHE", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(DataNotFoundError) as err:
        resolve_data_dir("webshop", required_files=("nothing-here.json",))
    text = str(err.value)
    assert "--set data_dir" not in text  # `run` refuses that setting
    assert "CRL_BENCH_WEBSHOP_DATA=PATH" in text


@pytest.mark.parametrize("args,hint", [
    (["--set", "actor.lrr=1e-6"], "Did you mean 'lr'?"),
    (["--set", "actr.lr=1e-6"], "Did you mean 'actor'?"),
    (["--set", "lr=1e-6"], "Did you mean 'actor.lr' or 'extractor.lr'?"),
    (["--tasks", "3mx"], "Did you mean '3mix'?"),
    (["--tasks", "crl/MiniHack-Rooom-5x5-v0"], "Did you mean 'crl/MiniHack-Room-5x5-v0'?"),
    (["--agent", "comprl"], "Did you mean 'comp_rl'?"),
])
def test_did_you_mean_for_settings_tasks_env_ids_and_agents(args, hint, capsys):
    assert main(["run", *args, "--preset", "tiny", "--steps", "1"]) == 2
    assert hint in capsys.readouterr().err


def test_a_sections_field_set_from_python_gets_a_hint():
    from crl_bench.config.schema import ConfigError, RunConfig

    with pytest.raises(ConfigError, match="Did you mean 'lr'"):
        RunConfig().actor.lrr = 1e-6
