"""Registry behaviour: lazy entries, duplicates, unknown names, broken plugins."""

from __future__ import annotations

import sys
import types

import pytest

from crl_bench.registry import PluginError, Registry, RegistryError


def test_lazy_entry_is_imported_only_when_loaded(tmp_path, monkeypatch):
    mod = types.ModuleType("crl_lazy_probe")
    mod.THING = object()
    registry: Registry[object] = Registry("thing")
    registry.register("probe", "crl_lazy_probe:THING")
    assert "crl_lazy_probe" not in sys.modules
    monkeypatch.setitem(sys.modules, "crl_lazy_probe", mod)
    assert registry.get("probe") is mod.THING


def test_duplicate_name_is_rejected():
    registry: Registry[int] = Registry("number")
    registry.register("one", 1)
    with pytest.raises(RegistryError, match="Duplicate number name 'one'"):
        registry.register("one", 2)


def test_unknown_name_lists_known_ones():
    registry: Registry[int] = Registry("number")
    registry.register("one", 1)
    registry.register("two", 2)
    with pytest.raises(RegistryError) as err:
        registry.get("three")
    assert str(err.value) == "Unknown number 'three'. Available: one, two."


def test_decorator_registration():
    registry: Registry[object] = Registry("fn")

    @registry.register("double")
    def double(x):
        return 2 * x

    assert registry.get("double")(4) == 8


class _BrokenEP:
    name = "broken_one"
    value = "no_such_module_xyz:thing"
    group = "crl_test.group"
    dist = None

    def load(self):
        raise ImportError("No module named 'no_such_module_xyz'")


def _only_broken(monkeypatch):
    from importlib import metadata

    monkeypatch.setattr(metadata, "entry_points",
                        lambda group=None: [_BrokenEP()] if group == "crl_test.group" else [])


def test_broken_plugin_hook_is_reported_by_name_on_every_lookup(monkeypatch):
    _only_broken(monkeypatch)
    registry: Registry[object] = Registry("widget", "crl_test.group", on_plugin=lambda n, obj: None)
    for _ in range(2):  # the second lookup repeats the cause instead of "Unknown widget"
        with pytest.raises(PluginError, match="Plugin 'broken_one'.*no_such_module_xyz"):
            registry.get("broken_one")


def test_plugin_entries_load_lazily_and_report_on_every_use(monkeypatch):
    """Agents: a plugin is listed without importing it; using it imports it, and a failure is
    reported by name every time."""
    _only_broken(monkeypatch)
    registry: Registry[object] = Registry("widget", "crl_test.group")
    assert registry.names() == ["broken_one"]
    assert registry.entry("broken_one").source.startswith("entry-point:")
    for _ in range(2):
        with pytest.raises(PluginError, match="Plugin 'broken_one'.*no_such_module_xyz"):
            registry.get("broken_one")


def test_env_ids_must_use_crl_namespace():
    from crl_bench.registry import register_env

    with pytest.raises(ValueError, match="must start with 'crl/'"):
        register_env("Foo-v0", "x:y", family="x")


def test_resolve_tasks_unknown_mix_lists_known():
    from crl_bench.mixes import resolve_tasks

    with pytest.raises(RegistryError, match="Unknown task mix 'nope'. Available: .*3mix"):
        resolve_tasks("nope")
    assert [t.name for t in resolve_tasks("3mix")] == ["MiniHack Room", "WebShop", "ALFWorld"]


def test_make_env_builds_a_registered_env_and_names_known_ids_for_an_unknown_one():
    pytest.importorskip("nle")  # the minihack extra (MiniHack is imported through our shim)
    from crl_bench import make_env

    env = make_env("crl/MiniHack-Room-5x5-v0", max_steps=3)
    try:
        obs, info = env.reset(seed=0)
        assert isinstance(obs, str) and obs
        assert env.unwrapped.family == "minihack"
    finally:
        env.close()
    with pytest.raises(RegistryError, match="crl/MiniHack-Room-5x5-v0"):
        make_env("crl/No-Such-Env-v0")
