"""Run configuration: presets, overrides and the errors that name the fix."""

from __future__ import annotations

import pytest

from crl_bench.registry import RegistryError
from crl_bench.config.schema import ConfigError, apply_overrides, build_config


def test_odd_group_size_with_split_names_the_fix():
    # the split is the agent's (comp_rl splits, grpo and comp_rl without split advantages do not);
    # validation asks the agent, with its method.* options
    with pytest.raises(ConfigError, match=r"group_size=5 is odd .* rollout.group_size=6"):
        build_config(agent="comp_rl", tasks="minihack", preset="tiny",
                     overrides={"rollout.group_size": 5})
    build_config(agent="grpo", tasks="minihack", preset="tiny",
                 overrides={"rollout.group_size": 5})  # no split: odd K is fine
    build_config(agent="comp_rl", tasks="minihack", preset="tiny",
                 overrides={"rollout.group_size": 5, "method.split_advantages": False})


def test_unknown_agent_lists_known_ones():
    from crl_bench.agent import load_agent

    with pytest.raises(RegistryError, match="Unknown agent 'nope'. Available: .*comp_rl.*grpo"):
        load_agent("nope")


def test_unknown_task_set_lists_known_ones():
    from crl_bench.mixes import resolve_tasks

    with pytest.raises(RegistryError, match="Unknown task mix '4mix'. Available: 3mix, 6mix"):
        resolve_tasks("4mix")


def test_paper_preset_without_gpu_fails_early_with_the_fix():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ConfigError, match="needs a CUDA GPU .* --preset cpu"):
        build_config(agent="comp_rl", tasks="3mix", preset="paper")


def test_paper_preset_is_the_papers_configuration():
    from crl_bench.config.schema import PRESETS

    cfg = PRESETS["paper"]()
    assert (cfg.rollout.groups, cfg.rollout.group_size, cfg.steps) == (16, 8, 512)
    assert cfg.actor.lr == 1e-6 and cfg.actor.advantage == "mean"
    assert cfg.actor.loss == "ppo_clip" and cfg.actor.loss_kwargs()["clip_eps"] == 0.2
    assert cfg.extractor.loss == "cispo" and cfg.extractor.buffer_size == 64
    assert (cfg.extractor.loss_kwargs()["eps_low"], cfg.extractor.loss_kwargs()["eps_high"]) == (0.1, 0.1)
    r = cfg.retrieval
    assert (r.k, r.oversample, r.lam, r.recent_s, r.drop_recent_top1_p) == (1, 16, 0.4, 300.0, 0.5)
    x = cfg.experience
    # warm-up 6: the official loop skips the actor update while global_step (from 0) <=
    # memory_warmup_interval 5 (multi_agentic_pipeline.py:1202, 1470); ours count from 1
    assert (x.merge_every, x.merge_chunk, x.max_asks, x.bank_fill_steps, x.capacity) == (5, 5, 2, 6, 20_000)
    assert cfg.rollout.env_max_steps["minihack"] == 30 and cfg.rollout.temperature == 0.99


def test_overrides_are_typed_and_unknown_keys_rejected():
    cfg = build_config(agent="grpo", tasks="minihack", preset="tiny",
                       overrides={"actor.lr": "2e-5", "steps": 7, "rollout.think": "true"})
    assert cfg.actor.lr == 2e-5 and cfg.steps == 7 and cfg.rollout.think is True
    with pytest.raises(ConfigError, match="unknown field 'lrr'"):
        apply_overrides(cfg, {"actor.lrr": 1})
    with pytest.raises(ConfigError, match="expected int"):
        apply_overrides(cfg, {"steps": "many"})
    with pytest.raises(ConfigError, match="Unknown preset 'huge'"):
        build_config(agent="grpo", tasks="minihack", preset="huge")


def test_resume_accepts_only_speed_overrides():
    from crl_bench.config.schema import apply_resume_overrides

    cfg = build_config(agent="grpo", tasks="minihack", preset="tiny")
    assert apply_resume_overrides(cfg, {"threads": 2}).threads == 2
    assert apply_resume_overrides(cfg, None) is cfg
    assert apply_resume_overrides(cfg, {"actor.lr": cfg.actor.lr}).actor.lr == cfg.actor.lr  # unchanged: fine
    with pytest.raises(ConfigError, match="actor.lr cannot change mid-run .* another --out"):
        apply_resume_overrides(cfg, {"actor.lr": 1e-3, "threads": 1})


def test_agent_options_are_checked_by_the_agent():
    from crl_bench.agent import load_agent

    assert load_agent("comp_rl", {"merge": False}).config.merge is False
    with pytest.raises(ValueError, match="method.mrege: agent 'comp_rl' has no option 'mrege'"):
        load_agent("comp_rl", {"mrege": False})
    with pytest.raises(ValueError, match="method.merge must be true or false"):
        load_agent("comp_rl", {"merge": "no"})
    with pytest.raises(ValueError, match="method.with_experience_fraction must be in"):
        load_agent("comp_rl", {"with_experience_fraction": 1.5})
    with pytest.raises(ValueError, match="agent 'grpo' has no option"):
        load_agent("grpo", {"merge": False})


def test_loss_settings_belong_to_the_loss():
    cfg = build_config(agent="grpo", tasks="minihack", preset="tiny",
                       overrides={"actor.loss_args.clip_eps": 0.3})
    assert cfg.actor.loss_kwargs()["clip_eps"] == 0.3
    cfg.validate()
    with pytest.raises(ConfigError, match="actor.loss_args.eps_low: .eps_low. is not a setting of loss .ppo_clip."):
        build_config(agent="grpo", tasks="minihack", preset="tiny", overrides={"actor.loss_args.eps_low": 0.3})
    with pytest.raises(ConfigError, match="extractor.loss_args.eps_high=-1"):
        build_config(agent="grpo", tasks="minihack", preset="tiny", overrides={"extractor.loss_args.eps_high": -1})


# -- the command line: one `error:` line, exit 2, the field and the fix (issue 20) --------------

def cli(capsys, *args: str) -> tuple[int, str]:
    from crl_bench.cli import main

    rc = main(["run", "--preset", "tiny", "--no-progress", *args])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["--set", "actor.lr=NaN"], "actor.lr=nan: must be a finite number > 0 and <= 1"),
    (["--set", "rollout.top_p=5"], "rollout.top_p=5.0: must be a finite number > 0 and <= 1"),
    (["--set", "rollout.max_new_tokens=0"], "rollout.max_new_tokens=0: must be an integer >= 1"),
    (["--set", "model.actor=/etc/passwd"], "model.actor='/etc/passwd': that is a file, not a model"),
    (["--set", "threads=-1"], "threads=-1: must be an integer >= 0"),
    (["--set", "checkpoint_every=0"], "checkpoint_every=0: must be an integer >= 1"),
    (["--set", "actor.loss=bogus"], "actor.loss='bogus': unknown policy loss"),
    (["--set", "actor.schedule=bogus"], "actor.schedule='bogus': must be one of constant, cosine"),
    (["--set", "eval.episodes_per_task=0"], "eval.episodes_per_task=0: must be an integer >= 1"),
    (["--set", "rollout.group_size=1000000"], "rollout.group_size=1000000: must be an integer >= 1 and <= 1024"),
    (["--seed", "-1"], "--seed -1: seeds must be >= 0"),
    (["--seed", "0", "0"], "--seed 0 0: seed 0 is given more than once"),
    (["--agent", "comp_rl", "--set", "agent=grpo"],
     "--set agent='grpo' conflicts with --agent 'comp_rl': give the agent with --agent grpo only"),
    (["--set", "agent=grpo"], "--set agent='grpo' conflicts with --agent 'comp_rl'"),  # the default
    (["--steps", "3", "--set", "steps=2"], "--set steps=2 conflicts with --steps 3"),
    (["--repair"], "--repair only applies with --resume"),
])
def test_cli_config_errors_are_one_line_naming_the_field(capsys, tmp_path, args, message):
    out = tmp_path / "run"
    rc, err = cli(capsys, "--tasks", "minihack", "--out", str(out), *args)
    assert rc == 2
    assert err.startswith("crl-bench run: error: ") and message in err, err
    assert "Traceback" not in err and err.count("\n") == 1
    assert not out.exists()  # refused before anything was built or written: no .lock, no trajectories/


@pytest.mark.parametrize("value,message", [
    ("cuda:99", "model.device='cuda:99': "),
    ("mps", "model.device='mps': no Apple GPU (MPS) is available"),
])
def test_an_unusable_device_is_refused_before_the_model_loads(capsys, tmp_path, value, message):
    """`model.device=cuda:99` passed validation and ended in an AssertionError from torch after
    the model was loaded; it is refused with the fix now, and OUT is left untouched."""
    torch = pytest.importorskip("torch")
    if value == "mps" and torch.backends.mps.is_available():
        pytest.skip("this machine has an Apple GPU")
    out = tmp_path / "run"
    rc, err = cli(capsys, "--agent", "grpo", "--tasks", "minihack", "--steps", "1", "--out", str(out),
                  "--set", f"model.device={value}")
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith("crl-bench run: error: " + message), err
    assert "--set model.device=" in err  # the fix
    if value.startswith("cuda") and torch.cuda.device_count():
        assert f"this machine has {torch.cuda.device_count()} CUDA device(s)" in err
    elif value.startswith("cuda"):
        assert "no CUDA GPU is visible on this machine" in err
    assert not out.exists()


def test_an_embedder_path_is_checked_before_anything_loads(capsys, tmp_path):
    afile = tmp_path / "notes.txt"
    afile.write_text("not a model")
    empty = tmp_path / "empty_model"
    empty.mkdir()
    out = tmp_path / "run"
    for value, message in [(str(tmp_path / "no" / "such" / "embedder"), "no such folder"),
                           (str(afile), "that is a file, not an embedder"),
                           (str(empty), "the folder holds no sentence-transformers model")]:
        rc, err = cli(capsys, "--agent", "comp_rl", "--tasks", "minihack", "--steps", "1",
                      "--out", str(out), "--set", f"experience.embedder={value}")
        assert rc == 2 and err.count("\n") == 1, err
        assert f"experience.embedder={value!r}: {message}" in err, err
        assert "--set experience.embedder=all-MiniLM-L6-v2" in err
        assert not out.exists()


def test_an_empty_out_is_refused(capsys, tmp_path, monkeypatch):
    """`--out ""` wrote the run under ./runs/... as if no --out were given."""
    monkeypatch.chdir(tmp_path)
    rc, err = cli(capsys, "--agent", "grpo", "--tasks", "minihack", "--steps", "1", "--out", "",
                  "--set", "eval.at_start=false", "--set", "threads=1")
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith('crl-bench run: error: --out "": give the run a folder'), err
    assert list(tmp_path.iterdir()) == []  # no runs/ folder


def test_resume_with_a_different_agent_is_refused_with_the_way_out(capsys, tmp_path):
    from crl_bench.agent import load_agent
    from crl_bench.run.loop import write_config
    from crl_bench.records.files import RunDir

    cfg = build_config(agent="comp_rl", tasks="minihack", preset="tiny")
    run = RunDir(tmp_path / "run")
    write_config(run, cfg, load_agent("comp_rl"), ())
    run.set_status("failed", 0)
    rc, err = cli(capsys, "--resume", "--agent", "grpo", "--tasks", "webshop", "--out", str(run.path))
    assert rc == 2
    assert ("--agent grpo (stored: comp_rl); --tasks webshop (stored: minihack). Leave these "
            "options out to continue it, or start a new run with another --out") in err


def test_cli_rejects_a_huge_group_fast_without_a_traceback(tmp_path):
    """The real command in its own process: `rollout.group_size=1000000` once ate 12 GB; now it
    is refused by validation, before a model or env exists."""
    import subprocess
    import sys
    import time

    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "crl_bench.cli", "run", "--agent", "grpo", "--tasks",
                           "minihack", "--preset", "tiny", "--out", str(tmp_path / "run"),
                           "--set", "rollout.group_size=1000000"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "crl-bench run: error: rollout.group_size=1000000: must be an integer >= 1 and <= 1024; "
        "e.g. --set rollout.group_size=4."]
    assert time.perf_counter() - t0 < 60
    assert not (tmp_path / "run" / "config.json").exists()


def test_setup_failure_reports_its_real_cause(tmp_path):
    """A model folder that passes the name check but cannot be loaded: the error is the loader's,
    not an AttributeError from cleaning up the half-built trainer."""
    import json

    pytest.importorskip("torch")
    from crl_bench.runner.api import run_experiment

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "no-such-architecture"}')
    out = tmp_path / "run"
    with pytest.raises(Exception) as info:
        run_experiment("grpo", "minihack", "tiny", 0, out, steps=1, progress=False,
                       overrides={"model.actor": str(model), "threads": 1})
    assert not isinstance(info.value, AttributeError), info.value
    assert "has no attribute 'track'" not in str(info.value)
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "failed"
    assert status["error"].startswith(type(info.value).__name__ + ": ")


def test_vllm_with_truncated_sampling_needs_recomputed_logprobs():
    """vLLM renormalises its log-probs over the top-k / top-p survivors (docs/vllm.md); a ratio
    against them is biased unless the trainer recomputes the old log-probs."""
    cfg = build_config(agent="grpo", tasks="minihack", preset="tiny")
    cfg.model.backend = "vllm"
    cfg.rollout.top_p = 0.99
    with pytest.raises(ConfigError, match=r"actor sampling truncated .* actor.recompute_old_logprobs=true"):
        cfg.validate()
    cfg.actor.recompute_old_logprobs = True
    cfg.extractor.top_p = 0.9
    with pytest.raises(ConfigError, match=r"extractor.recompute_old_logprobs=true"):
        cfg.validate()
    cfg.extractor.top_p = 1.0
    cfg.validate()
    cfg.model.backend = "hf"  # the hf backend records untruncated log-probs: no constraint
    cfg.actor.recompute_old_logprobs = False
    cfg.extractor.top_p = 0.9
    cfg.validate()


def test_eval_sampling_seed_differs_by_run_seed_and_from_training():
    """Evaluations of different run seeds sample independently (seed 0 keeps the value the golden
    records were made with); no evaluation reuses a training step's sampling seed."""
    from crl_bench.run.context import sampling_seed

    def eval_sampling_seed(run_seed: int, step: int) -> int:
        return sampling_seed(run_seed, step, "eval")

    assert eval_sampling_seed(0, 3) == 10_007 + 3
    assert len({eval_sampling_seed(s, 0) for s in range(5)}) == 5
    train = {sampling_seed(s, t) for s in range(5) for t in range(200)}
    assert not train & {eval_sampling_seed(s, t) for s in range(5) for t in range(200)}


def test_env_kwargs_reach_every_env_of_the_family_and_bad_ones_fail_before_models_load(tmp_path):
    pytest.importorskip("nle")
    from crl_bench.mixes import resolve_tasks
    from crl_bench.run.context import RunContext
    from crl_bench.records.files import RunDir

    cfg = build_config(agent="grpo", tasks="minihack", preset="tiny",
                       overrides={"rollout.env_kwargs": {"minihack": {"view": "compact"}}})
    cfg.validate()
    ctx = RunContext(cfg, RunDir(tmp_path / "run"))
    task = resolve_tasks("minihack")[0]
    for phase in ("train", "eval"):
        kwargs = ctx.env_kwargs(task, phase)
        assert kwargs["view"] == "compact" and kwargs["max_steps"] == cfg.rollout.env_max_steps["minihack"]
    env = ctx.envs_for(task, "eval", 1)[0]
    obs, _ = env.reset(seed=3)
    assert "Open directions" not in obs and env.unwrapped.view == "compact"
    bad = build_config(agent="grpo", tasks="minihack", preset="tiny",
                       overrides={"rollout.env_kwargs": {"minihack": {"view": "map"}}})
    with pytest.raises(ConfigError, match=r"cannot start: ValueError: view='map': use one of full, compact"):
        RunContext(bad, RunDir(tmp_path / "bad")).check_tasks()


def test_model_max_batch_size_reaches_the_hf_backend(tmp_path):
    """``--set model.max_batch_size=N``: the backend generates in chunks of N rows (memory)."""
    pytest.importorskip("torch")
    from crl_bench.run.context import RunContext
    from crl_bench.records.files import RunDir

    cfg = build_config(agent="grpo", tasks="minihack", preset="tiny",
                       overrides={"model.max_batch_size": 3})
    cfg.validate()
    ctx = RunContext(cfg, RunDir(tmp_path / "run"))
    ctx.build_models(extractor=True)
    assert ctx.raw_backend.max_batch_size == 3
    assert build_config(agent="grpo", tasks="minihack", preset="tiny").model.max_batch_size == 64
    with pytest.raises(ConfigError, match=r"model.max_batch_size=0: must be an integer >= 1"):
        build_config(agent="grpo", tasks="minihack", preset="tiny",
                     overrides={"model.max_batch_size": 0})


def test_extractor_batches_finished_in_one_step_add_up():
    """The track runs behind the actor loop: two batches that finish between two steps are one
    step record. Their durations add up (before, the later batch's overwrote the earlier's, so a
    run's extraction time read from its records was short); other values are the last batch's;
    the count says how many were combined."""
    from crl_bench.run.loop import combine_extractor_batches

    first = {"step": 3, "extractor/extract_s": 2.0, "losses/extractor_time_forward_s": 0.5,
             "losses/extractor_loss": 0.5, "bank/merge_windows": 4.0}
    second = {"step": 4, "extractor/extract_s": 3.0, "extractor/merge_s": 1.5,
              "losses/extractor_time_forward_s": 0.25, "losses/extractor_loss": 0.25}
    assert combine_extractor_batches([first, second]) == {
        "extractor/extract_s": 5.0, "losses/extractor_time_forward_s": 0.75,
        "extractor/merge_s": 1.5, "losses/extractor_loss": 0.25, "bank/merge_windows": 4.0,
        "extractor/batches_done": 2}
    assert combine_extractor_batches([]) == {"extractor/batches_done": 0}
