"""Run configuration: presets, overrides and the errors that name the fix."""

from __future__ import annotations

import pytest

from crl_bench.registry import RegistryError
from crl_bench.runner.config import ConfigError, apply_overrides, build_config


def test_odd_group_size_with_split_names_the_fix():
    from crl_bench.agent import load_agent

    cfg = build_config(agent="comp_rl", tasks="minihack", preset="tiny",
                       overrides={"rollout.group_size": 5})
    with pytest.raises(ConfigError, match=r"group_size=5 is odd .* rollout.group_size=6"):
        cfg.validate(split=load_agent("comp_rl").split_groups)
    cfg.validate(split=load_agent("grpo").split_groups)  # no split: odd K is fine
    cfg.validate(split=load_agent("comp_rl", {"split_advantages": False}).split_groups)


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
    from crl_bench.runner.config import PRESETS

    cfg = PRESETS["paper"]()
    assert (cfg.rollout.groups, cfg.rollout.group_size, cfg.steps) == (16, 8, 512)
    assert cfg.actor.lr == 1e-6 and cfg.actor.advantage == "mean"
    assert cfg.actor.loss == "ppo_clip" and cfg.actor.loss_kwargs()["clip_eps"] == 0.2
    assert cfg.extractor.loss == "cispo" and cfg.extractor.buffer_size == 64
    assert (cfg.extractor.loss_kwargs()["eps_low"], cfg.extractor.loss_kwargs()["eps_high"]) == (0.1, 0.1)
    x = cfg.experience
    assert (x.k, x.oversample, x.lam, x.recent_s, x.drop_recent_top1_p) == (1, 16, 0.4, 300.0, 0.5)
    assert (x.merge_every, x.merge_chunk, x.max_asks, x.warmup_steps, x.capacity) == (5, 5, 2, 5, 20_000)
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
    from crl_bench.runner.config import apply_resume_overrides

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
