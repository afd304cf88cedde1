"""One source of truth for the run configuration: presets are changes from the base
``RunConfig()``, string choices come from their ``Literal`` types (or a registry), each mechanism
has one switch, a loss's argument ranges are declared once (by the loss) and checked by both the
loss and the configuration, old names are refused naming the new one, and a run validates its
configuration once."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

import pytest

from crl_bench.cli import main
from crl_bench.config.schema import (DEFAULT_AGENT, DEFAULT_TASKS, DEPRECATED, PRESETS, ConfigError,
                                     ExperienceConfig, RunConfig, build_config, default_preset)
from crl_bench.config.validation import field_choices

BASE = dict(agent="grpo", tasks="minihack", preset="tiny")


def sections(cfg: RunConfig) -> list[tuple[str, Any]]:
    return [("", cfg)] + [(f.name + ".", getattr(cfg, f.name)) for f in dataclasses.fields(cfg)
                          if dataclasses.is_dataclass(getattr(cfg, f.name))]


def flat(cfg: RunConfig) -> dict[str, Any]:
    """Every leaf setting by its ``--set`` name (dict-valued fields are one setting)."""
    return {prefix + f.name: getattr(obj, f.name) for prefix, obj in sections(cfg)
            for f in dataclasses.fields(obj) if not dataclasses.is_dataclass(getattr(obj, f.name))}


def is_field(key: str) -> bool:
    return key in flat(RunConfig())


LITERALS = [(prefix + f.name, field_choices(obj, f.name)) for prefix, obj in sections(RunConfig())
            for f in dataclasses.fields(obj) if field_choices(obj, f.name) is not None]
REGISTERED = {"agent", "tasks", "model.backend", "actor.loss", "extractor.loss", "actor.advantage"}
"""String settings whose values are names in a registry (plugins add to them)."""
FREE = {"model.actor", "model.extractor", "model.device", "experience.embedder", "preset"}
"""String settings that name a model, a device or a file, checked by their own rules."""


def cli(capsys, *args: str) -> tuple[int, str]:
    rc = main(["run", *args])
    return rc, capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# typed choices
# ---------------------------------------------------------------------------------------------

def test_every_string_setting_is_a_literal_a_registered_name_or_a_named_free_field():
    """No untyped string fork: a new str setting must be typed with its choices."""
    hints = {prefix + name: hint for prefix, obj in sections(RunConfig())
             for name, hint in typing.get_type_hints(type(obj)).items()}
    strings = {k for k, v in flat(RunConfig()).items()
               if isinstance(v, str) or hints[k] in (str, str | None)}
    assert strings - {k for k, _ in LITERALS} == REGISTERED | FREE
    assert len(LITERALS) >= 20  # sample_policy, update_mode, conversation, key, distill, agg, ...


@pytest.mark.parametrize("key,choices", LITERALS, ids=[k for k, _ in LITERALS])
def test_a_bad_choice_given_with_set_names_the_field_the_value_and_every_choice(capsys, tmp_path,
                                                                              key, choices):
    out = tmp_path / "run"
    rc, err = cli(capsys, "--agent", "grpo", "--tasks", "minihack", "--preset", "tiny",
                  "--out", str(out), "--set", f"{key}=bogus_value")
    assert rc == 2 and err.count("\n") == 1, err
    assert f"error: {key}='bogus_value': must be one of {', '.join(choices)}." in err
    assert not out.exists()


def test_a_near_miss_names_the_likely_intended_choice(capsys, tmp_path):
    rc, err = cli(capsys, "--agent", "grpo", "--tasks", "minihack", "--preset", "tiny",
                  "--out", str(tmp_path / "run"), "--set", "extractor.sample_policy=bufer")
    assert rc == 2 and "must be one of pool, buffer. Did you mean 'buffer'?" in err, err
    with pytest.raises(ConfigError, match=r"unknown policy loss. Available: cispo, ppo_clip. "
                                          r"Did you mean 'ppo_clip'\?"):
        build_config(**BASE, overrides={"actor.loss": "ppo"})


def test_literal_choices_are_the_ones_the_code_that_reads_them_knows():
    """The modules that act on a choice keep their own tables (prompt building, extraction
    templates, aggregation); they must name the same choices as the types."""
    from crl_bench.algorithms.losses import AGGREGATION_MODES
    from crl_bench.extractor.extraction import ANSWER_TEMPLATES
    from crl_bench.llm.prompting import CONVERSATIONS, EXAMPLE_PICKS

    choices = dict(LITERALS)
    assert set(choices["rollout.conversation"]) == set(CONVERSATIONS)
    assert set(choices["rollout.example_pick"]) == set(EXAMPLE_PICKS)
    assert set(choices["extractor.answer_template"]) == set(ANSWER_TEMPLATES)
    assert choices["actor.agg"] == choices["extractor.agg"] == AGGREGATION_MODES


# ---------------------------------------------------------------------------------------------
# presets and defaults
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(PRESETS))
def test_a_preset_differs_from_the_base_exactly_as_its_table_says(name):
    base, cfg = flat(RunConfig()), flat(PRESETS[name]())
    diff = {k: v for k, v in cfg.items() if v != base[k]}
    assert diff == {**PRESETS[name].changes, "preset": name}
    assert all(base[k] != v for k, v in PRESETS[name].changes.items())  # no entry restates the base


def test_the_commands_preset_choices_are_the_registry(capsys):
    from crl_bench.cli import build_parser

    parser = build_parser()
    run = parser._subparsers._group_actions[0].choices["run"]  # noqa: SLF001 - argparse has no API
    plan = parser._subparsers._group_actions[0].choices["plan"]  # noqa: SLF001
    reproduce = parser._subparsers._group_actions[0].choices["reproduce"]  # noqa: SLF001
    for sub in (run, plan, reproduce):
        action = next(a for a in sub._actions if a.dest == "preset")  # noqa: SLF001
        assert list(action.choices) == list(PRESETS)
    assert main(["list", "presets"]) == 0
    listed = capsys.readouterr().out
    for preset in PRESETS.values():
        assert f"{preset.name}: {preset.summary}" in listed
        assert all(f"  {k}={json.dumps(v)}" in listed for k, v in preset.changes.items())


@pytest.mark.parametrize("key,option,expected", [
    ("agent", "--agent", RunConfig().agent), ("tasks", "--tasks", RunConfig().tasks),
    ("preset", "--preset", default_preset()),
])
def test_the_commands_defaults_are_the_configs(capsys, tmp_path, key, option, expected):
    """What ``crl-bench run`` uses without an option (shown by the refusal of a --set that
    disagrees with it) is RunConfig()'s default; a preset left out is ``default_preset()``, as
    for RunConfig() (preset None: resolved by build_config)."""
    assert (DEFAULT_AGENT, DEFAULT_TASKS, RunConfig().preset) == ("comp_rl", "3mix", None)
    rc, err = cli(capsys, "--out", str(tmp_path / "run"), "--set", f"{key}=something_else")
    assert rc == 2 and f"conflicts with {option} {expected!r}" in err, err
    assert build_config().preset == default_preset()
    assert (build_config(preset="tiny").agent, build_config(preset="tiny").tasks) == (
        DEFAULT_AGENT, DEFAULT_TASKS)


# ---------------------------------------------------------------------------------------------
# one switch per mechanism
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key,switch", [("experience.merge_every", "method.merge=false"),
                                        ("experience.max_asks", "method.search_ask=false")])
def test_a_mechanism_is_switched_off_by_its_one_switch_only(key, switch):
    with pytest.raises(ConfigError, match=rf"^{key}=0: must be an integer >= 1 .*switched off by "
                                          rf"{switch}"):
        build_config(agent="comp_rl", tasks="minihack", preset="tiny", overrides={key: 0})
    name = switch.split("=")[0]
    build_config(agent="comp_rl", tasks="minihack", preset="tiny", overrides={name: False})


def test_the_gate_has_one_switch_and_the_bank_fill_its_own_name():
    from crl_bench.baselines.comp_rl import CompRLConfig

    assert "gate" not in {f.name for f in dataclasses.fields(CompRLConfig)}
    assert "warmup_steps" not in {f.name for f in dataclasses.fields(ExperienceConfig)}
    assert (PRESETS["paper"]().experience.gate, PRESETS["paper"]().experience.bank_fill_steps) == (
        True, 6)
    assert PRESETS["paper"]().actor.warmup_steps == 0  # the learning-rate warm-up, another thing


# ---------------------------------------------------------------------------------------------
# old names
# ---------------------------------------------------------------------------------------------

RENAMED = [(old, new) for old, new in DEPRECATED.items() if not is_field(old)]


@pytest.mark.parametrize("old,new", RENAMED, ids=[o for o, _ in RENAMED])
def test_an_old_name_given_with_set_names_the_new_one(capsys, tmp_path, old, new):
    rc, err = cli(capsys, "--agent", "comp_rl", "--tasks", "minihack", "--preset", "tiny",
                  "--out", str(tmp_path / "run"), "--set", f"{old}=1")
    assert rc == 2 and f"error: {old} was renamed {new}: use {new} instead" in err, err


def test_an_old_name_in_python_names_the_new_one():
    with pytest.raises(ConfigError, match="experience.warmup_steps was renamed experience.bank_fill_steps"):
        ExperienceConfig(warmup_steps=6)
    cfg = RunConfig()
    with pytest.raises(ConfigError, match="experience.warmup_steps was renamed experience.bank_fill_steps"):
        cfg.experience.warmup_steps = 6  # would otherwise be a new attribute nobody reads
    with pytest.raises(ConfigError, match=r"experience.bank_fil: no such setting. Settings here: .*bank_fill_steps"):
        cfg.experience.bank_fil = 6
    with pytest.raises(ConfigError, match="method.gate was renamed experience.gate"):
        RunConfig(agent="comp_rl", tasks="minihack", method={"gate": False}).validate()


@pytest.mark.parametrize("old,new", [(o, n) for o, n in RENAMED if not o.startswith("method.")])
def test_a_stored_config_with_an_old_name_is_refused_naming_the_new_one(tmp_path, old, new):
    """A run written before a rename resumes once its config.json uses the new key."""
    from crl_bench.runner.api import run_experiment

    cfg = PRESETS["tiny"]()
    cfg.tasks, cfg.agent = "minihack", "grpo"
    data = cfg.to_dict()
    section, name = old.split(".")
    data[section][name] = data[section].pop(new.split(".")[1])
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=rf"config.json is not a valid run configuration \({old} "
                                          rf"was renamed {new}"):
        run_experiment(None, None, None, None, run, progress=False)


# ---------------------------------------------------------------------------------------------
# loss argument ranges
# ---------------------------------------------------------------------------------------------

def _loss_range_cases() -> list[tuple[str, str, float, bool]]:
    from crl_bench.algorithms import LOSSES, loss_arg_ranges

    cases = []
    for loss in LOSSES.names():
        for arg, rng in loss_arg_ranges(loss).items():
            cases.append((loss, arg, rng.lo + min(1.0, (rng.hi - rng.lo) / 2), True))
            cases.append((loss, arg, rng.lo if rng.lo_open else rng.lo - 1, False))
            cases.append((loss, arg, rng.hi if rng.hi_open else rng.hi + 1, False))
    return cases


@pytest.mark.parametrize("loss,arg,value,ok", _loss_range_cases())
def test_the_configuration_and_the_loss_accept_the_same_argument_values(loss, arg, value, ok):
    """One range per argument, declared with the loss: what validation lets through the loss
    takes at its first update, and what the loss refuses validation refuses before the run."""
    torch = pytest.importorskip("torch")
    from crl_bench.algorithms import LOSSES

    overrides = {"actor.loss": loss, f"actor.loss_args.{arg}": value}
    t = torch.zeros(1, 1)
    if ok:
        build_config(**BASE, overrides=overrides)
        LOSSES.get(loss)(t, t, t, t, **{arg: value})
    else:
        with pytest.raises(ConfigError, match=rf"^actor.loss_args.{arg}={value!r}: must be "):
            build_config(**BASE, overrides=overrides)
        with pytest.raises(ValueError, match=rf"^{loss}: {arg} must be "):
            LOSSES.get(loss)(t, t, t, t, **{arg: value})


def test_ppo_clip_eps_of_one_or_more_is_refused_before_the_run():
    """Validation used to accept clip_eps up to 10; the loss refuses >= 1 at the first update."""
    with pytest.raises(ConfigError, match=r"actor.loss_args.clip_eps=1.5: must be a finite number > 0 and < 1"):
        build_config(**BASE, overrides={"actor.loss_args.clip_eps": 1.5})


# ---------------------------------------------------------------------------------------------
# one validation per run
# ---------------------------------------------------------------------------------------------

def test_a_run_validates_its_configuration_once_and_a_resume_once(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("nle")
    from crl_bench.runner.api import run_experiment

    calls: list[int] = []
    validate = RunConfig.validate

    def counted(self: RunConfig) -> None:
        calls.append(self.steps)
        validate(self)

    monkeypatch.setattr(RunConfig, "validate", counted)
    out = Path(tmp_path / "run")
    small = {"threads": 1, "eval.at_start": False, "eval.every": 0, "eval.episodes_per_task": 1,
             "rollout.groups": 1}
    run_experiment("grpo", "minihack", "tiny", 0, out, steps=1, progress=False, overrides=small)
    assert calls == [1]
    run_experiment(None, None, None, None, out, steps=2, progress=False)  # resumed, one more step
    assert calls == [1, 2]
