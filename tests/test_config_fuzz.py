"""Fuzz of the run configuration (issue 20): every numeric field set to out-of-range values
(negative, 0 where invalid, NaN, inf, huge, wrong type) and every name field to bogus values
gives a clean ConfigError naming the field — before any model or env is built — and random
values never give any other exception. Pure validation: the whole file runs in seconds."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crl_bench.config.schema import ConfigError, RunConfig, apply_overrides, build_config
from crl_bench.config.validation import FIELD_RANGES, MAX_EPISODES_PER_STEP

BASE = dict(agent="grpo", tasks="minihack", preset="tiny")


OPTIONAL: set[str] = set()
"""Numeric fields typed ``X | None``: None is their "unset" value, not a bad one."""


def numeric_fields() -> dict[str, str]:
    """dotted name -> "int" / "float" for every numeric field of RunConfig."""
    out = {}
    cfg = RunConfig()
    for prefix, obj in [("", cfg)] + [(f.name + ".", getattr(cfg, f.name)) for f in dataclasses.fields(cfg)
                                       if dataclasses.is_dataclass(getattr(cfg, f.name))]:
        for f in dataclasses.fields(obj):
            kind = str(f.type).removesuffix(" | None")  # optional: None means "unset"
            if kind in ("int", "float"):
                out[prefix + f.name] = kind
                if kind != str(f.type):
                    OPTIONAL.add(prefix + f.name)
    return out


NUMERIC = numeric_fields()


def test_every_numeric_field_has_a_documented_range():
    assert sorted(NUMERIC) == sorted(FIELD_RANGES)


def bad_values(key: str) -> list[Any]:
    r = FIELD_RANGES[key]
    integer = NUMERIC[key] == "int"
    values: list[Any] = [float("nan"), float("inf"), float("-inf"), r.lo - 1, r.hi + 1,
                         10**12 if integer else 1e12, -10**12 if integer else -1e12, "bogus",
                         True, [1]] + ([] if key in OPTIONAL else [None])
    if r.lo_open:
        values.append(r.lo)
    if r.hi_open:
        values.append(r.hi)
    if integer:
        values.append(1.5)
    return values


CASES = [(key, value) for key in NUMERIC for value in bad_values(key)]


def set_field(cfg: RunConfig, key: str, value: Any) -> None:
    obj: Any = cfg
    parts = key.split(".")
    for part in parts[:-1]:
        obj = getattr(obj, part)
    setattr(obj, parts[-1], value)


@pytest.mark.parametrize("key,value", CASES, ids=[f"{k}={v!r}" for k, v in CASES])
def test_out_of_range_value_names_the_field(key, value):
    # as stored in config.json (or set in Python): validate() alone must refuse it
    cfg = build_config(**BASE)
    set_field(cfg, key, value)
    with pytest.raises(ConfigError) as info:
        cfg.validate()
    assert str(info.value).startswith(f"{key}=") and "must be" in str(info.value)
    # as given on the command line (--set KEY=VALUE arrives as text)
    text = ("NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity") \
        if isinstance(value, float) and not math.isfinite(value) else value
    if key in ("seed", "steps"):  # have their own options; --set must agree with them
        overrides = {key: text}
    else:
        overrides = {key: str(text).lower() if isinstance(text, bool) else text}
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build_config(**BASE, overrides=overrides)


NAME_CASES = [
    ("agent", "bogus", r"^agent='bogus': unknown agent.*Available: .*grpo"),
    ("tasks", "bogus", r"^tasks='bogus': Unknown task mix"),
    ("tasks", ",", r"^tasks=',': --tasks is empty"),
    ("preset", "bogus", r"^preset='bogus': unknown preset. Available: cpu, paper, quick, tiny"),
    ("model.actor", "/etc/passwd", r"^model.actor='/etc/passwd': that is a file, not a model"),
    ("model.actor", "/nonexistent/model", r"^model.actor='/nonexistent/model': not a known model"),
    ("model.actor", "", r"^model.actor='': must be a model name"),
    ("model.actor", "/tmp", r"^model.actor='/tmp': the folder has no config.json"),
    ("model.extractor", "a/b/c", r"^model.extractor='a/b/c': not a known model"),
    ("model.backend", "bogus", r"^model.backend='bogus': unknown generation backend. Available: hf, vllm"),
    ("model.dtype", "int7", r"^model.dtype='int7': must be one of auto, float32, fp32, bfloat16, bf16, float16, fp16"),
    ("model.device", "gpu", r"^model.device='gpu': must be auto, cpu, mps, cuda or cuda:N"),
    ("actor.loss", "bogus", r"^actor.loss='bogus': unknown policy loss. Available: cispo, ppo_clip"),
    ("extractor.loss", "bogus", r"^extractor.loss='bogus': unknown policy loss"),
    ("actor.schedule", "bogus", r"^actor.schedule='bogus': must be one of constant, cosine"),
    ("extractor.schedule", "linear", r"^extractor.schedule='linear'"),
    ("actor.agg", "bogus", r"^actor.agg='bogus': must be one of token-mean, seq-mean-token-mean, seq-mean-token-sum"),
    ("extractor.agg", "sum", r"^extractor.agg='sum'"),
    ("actor.advantage", "bogus", r"^actor.advantage='bogus': unknown advantage estimator. Available: mean, mean_std"),
    ("extractor.answer_template", "bogus", r"^extractor.answer_template='bogus'"),
    ("rollout.conversation", "chat", r"^rollout.conversation='chat': must be one of window, full"),
    ("rollout.example_pick", "last", r"^rollout.example_pick='last': must be one of first, random, none"),
    ("experience.embedder", " ", r"^experience.embedder"),
    ("rollout.env_max_steps", {"minihack": 0}, r"^rollout.env_max_steps\['minihack'\]=0"),
    ("rollout.env_max_steps", {"minihack": float("nan")}, r"^rollout.env_max_steps\['minihack'\]=nan"),
    ("rollout.env_max_steps", {"minihack": 10**9}, r"^rollout.env_max_steps\['minihack'\]"),
    ("rollout.env_max_steps", [1], r"^rollout.env_max_steps=\[1\]: must be"),
    ("rollout.env_kwargs", {"minihack": "compact"}, r"^rollout.env_kwargs\['minihack'\]='compact': must map a family"),
    ("rollout.env_kwargs", {"minihack": {"max_steps": 5}}, r"^rollout.env_kwargs\['minihack'\] sets max_steps: use rollout.env_max_steps"),
    ("rollout.think", "maybe", r"^rollout.think='maybe': must be true or false"),
    ("extractor.runs", "fork", r"^extractor.runs='fork': must be one of inline, thread, process"),
    ("model", None, r"^model: must be a section"),
]


@pytest.mark.parametrize("key,value,match", NAME_CASES, ids=[f"{k}={v!r}" for k, v, _ in NAME_CASES])
def test_bogus_name_names_the_field(key, value, match):
    cfg = build_config(**BASE)
    set_field(cfg, key, value)
    with pytest.raises(ConfigError, match=match):
        cfg.validate()


def test_names_are_checked_against_the_registries_not_a_fixed_list():
    from crl_bench.algorithms import LOSSES

    cfg = build_config(**BASE)
    set_field(cfg, "actor.loss", "my_loss")
    with pytest.raises(ConfigError, match="my_loss"):
        cfg.validate()
    LOSSES.register("my_loss", "crl_bench.algorithms.losses:ppo_clip_loss")
    try:
        cfg.validate()              # a registered plugin loss is accepted
    finally:
        LOSSES.unregister("my_loss")


def test_episode_budget_is_bounded():
    with pytest.raises(ConfigError, match=rf"= 8192 episodes per step, more than the maximum {MAX_EPISODES_PER_STEP}"):
        build_config(**BASE, overrides={"rollout.groups": 8, "rollout.group_size": 1024})
    build_config(**BASE, overrides={"rollout.groups": 4, "rollout.group_size": 1024})


NUMERIC_KEYS = sorted(NUMERIC)
ANY_NUMBER = st.one_of(st.integers(min_value=-10**15, max_value=10**15),
                       st.floats(allow_nan=True, allow_infinity=True))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(NUMERIC_KEYS), ANY_NUMBER), min_size=1, max_size=4))
def test_random_values_pass_or_fail_cleanly_naming_a_field(assignments):
    """Random (possibly huge, NaN, negative) values: validation either accepts them - and then
    every value lies in its documented range - or raises a ConfigError naming one of them."""
    cfg = build_config(**BASE)
    for key, value in assignments:
        if NUMERIC[key] == "int" and isinstance(value, float):
            value = int(value) if math.isfinite(value) and abs(value) < 1e15 else value
        set_field(cfg, key, value)
    try:
        cfg.validate()
    except ConfigError as exc:
        named = [k for k, _ in assignments if str(exc).startswith(k + "=")]
        assert named or "episodes per step" in str(exc), str(exc)
        return
    for key, _ in assignments:
        obj: Any = cfg
        for part in key.split("."):
            obj = getattr(obj, part)
        assert obj in FIELD_RANGES[key]
    r = cfg.rollout
    assert r.groups * r.group_size <= MAX_EPISODES_PER_STEP


def test_overrides_of_valid_values_still_work():
    cfg = build_config(**BASE, overrides={"actor.lr": "3e-5", "rollout.top_p": 1, "threads": 2,
                                          "rollout.history": -1, "eval.every": 0,
                                          "model.actor": "tiny-random", "actor.schedule": "cosine",
                                          "actor.agg": "seq-mean-token-mean"})
    assert (cfg.actor.lr, cfg.rollout.top_p, cfg.threads) == (3e-5, 1.0, 2)
    apply_overrides(cfg, {"model.extractor": None})
    cfg.validate()
