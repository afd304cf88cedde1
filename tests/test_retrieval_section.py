"""Retrieval is one section of the run configuration (``retrieval.*``): its fields, defaults,
ranges and checks are declared once (``crl_bench.experience.retrieval.RetrievalSettings``) and
handed to the experience manager whole; the old spellings ``experience.k`` etc. still work where
a setting is given by name."""

from __future__ import annotations

import dataclasses

import pytest

from crl_bench.config.schema import (PRESETS, ConfigError, RunConfig, build_config,
                                     config_from_dict)
from crl_bench.config.validation import FIELD_RANGES
from crl_bench.experience.manager import RetrievalConfig
from crl_bench.experience.retrieval import RetrievalSettings, setting_ranges

BASE = dict(agent="grpo", tasks="minihack", preset="tiny")


def test_the_section_is_handed_to_the_manager_whole(tmp_path):
    """Every retrieval setting, given with --set, reaches the manager (the old hand-copied
    mapping passed six of them: batch_size, batch_wait_ms, query_cache and step_s could not be
    set)."""
    from crl_bench.records.files import RunDir
    from crl_bench.run.context import RunContext

    pytest.importorskip("torch")
    values = {"k": 2, "oversample": 3, "lam": 0.25, "recent_s": 100.0, "step_s": 50.0,
              "drop_recent_top1_p": 0.125, "batch_size": 7, "batch_wait_ms": 1.5,
              "query_cache": 11, "usage_per": "batch"}
    assert set(values) == {f.name for f in dataclasses.fields(RetrievalSettings)}
    cfg = build_config(**{**BASE, "agent": "comp_rl"}, seed=5,
                       overrides={f"retrieval.{k}": v for k, v in values.items()})
    ctx = RunContext(cfg, RunDir(tmp_path / "run"))
    try:
        ctx.build_experience(diversify=False)
        got = ctx.experience.manager.retrieval
        assert isinstance(got, RetrievalConfig)
        assert {k: getattr(got, k) for k in values} == values
        assert (got.diversify, got.seed) == (False, 5)  # the agent's switch, the run's seed
    finally:
        ctx.close()


def test_ranges_are_declared_on_the_fields_and_checked_by_both():
    """One declaration: validation's ranges for retrieval.* are the fields' own, and the
    manager's construction checks the same ones."""
    for name, rng in setting_ranges().items():
        assert FIELD_RANGES[f"retrieval.{name}"] is rng
    with pytest.raises(ConfigError, match=r"retrieval.k=0: must be an integer >= 1 and <= 64"):
        build_config(**BASE, overrides={"retrieval.k": 0})
    with pytest.raises(ValueError, match=r"k must be an integer >= 1 and <= 64"):
        RetrievalConfig(k=0)
    with pytest.raises(ConfigError, match="retrieval.usage_per='each': must be one of pick, batch"):
        build_config(**BASE, overrides={"retrieval.usage_per": "each"})


def test_old_spellings_still_work_where_a_setting_is_named():
    """--set experience.k=2 sets retrieval.k; a config.json stored with the settings under
    experience resumes with them; paper sets usage_per=batch. From Python the old attribute is
    refused naming the new one."""
    cfg = build_config(**BASE, overrides={"experience.k": 2, "experience.usage_per": "batch"})
    assert (cfg.retrieval.k, cfg.retrieval.usage_per) == (2, "batch")
    assert PRESETS["paper"]().retrieval.usage_per == "batch"
    stored = RunConfig().to_dict()
    del stored["retrieval"]
    stored["experience"].update(k=3, lam=0.5, usage_per="batch")
    old = config_from_dict(stored)
    assert (old.retrieval.k, old.retrieval.lam, old.retrieval.usage_per) == (3, 0.5, "batch")
    with pytest.raises(ConfigError, match=r"experience.k is retrieval.k now"):
        RunConfig().experience.k = 2
    with pytest.raises(ConfigError, match=r"section 'retrieval': k must be"):
        config_from_dict({**RunConfig().to_dict(), "retrieval": {"k": 0}})


def test_an_old_runs_fingerprint_reads_the_old_spelling(tmp_path):
    """A run fingerprinted with experience.usage_per=batch resumes under retrieval.usage_per
    (the same setting), and a real change is still named."""
    from crl_bench.records.checksums import fingerprint_fields
    from crl_bench.runner.api import _changed_fields

    cfg = PRESETS["paper"]()
    started = {("experience." + k[len("retrieval."):] if k in (
        "retrieval.k", "retrieval.usage_per") else k): v
        for k, v in fingerprint_fields(cfg).items()}
    assert started["experience.usage_per"] == "batch" and "retrieval.usage_per" not in started
    assert _changed_fields(started, cfg) == []
    cfg.retrieval.usage_per = "pick"
    assert _changed_fields(started, cfg) == ['retrieval.usage_per: "batch" -> "pick"']
