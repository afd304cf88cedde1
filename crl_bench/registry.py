"""Name -> object registries with lazy ``"module:attr"`` entries and entry-point plugins.

A :class:`Registry` maps names to either an object or a lazy import string. Lazy entries keep
``import crl_bench`` and ``crl-bench list`` cheap: nothing heavy (torch, NLE, TextWorld) is
imported until an entry is actually loaded.

Plugins register through the entry-point groups ``crl_bench.envs`` and ``crl_bench.agents``.
They are discovered on demand (the first time a registry is listed or queried for an unknown
name), never at import time. A plugin that fails to load is reported by name with the error
(:class:`PluginError`); it is never silently skipped.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


def did_you_mean(value: Any, names: Any) -> str:
    """`` Did you mean 'x'?`` for the closest of ``names`` to a mistyped ``value`` (difflib, or a
    name it starts), else ""."""
    import difflib

    names = [str(n) for n in names]
    text = str(value)
    close = difflib.get_close_matches(text, names, n=1, cutoff=0.6) or [
        n for n in names if text and n.startswith(text)][:1]
    if not close:  # a case slip ("3MIX", "crl/minihack-room-v0")
        close = [n for n in names if n.lower() == text.lower()][:1]
    return f" Did you mean {close[0]!r}?" if close else ""


class RegistryError(KeyError):
    """Unknown or duplicate name. ``str()`` gives the whole message (KeyError quotes it)."""

    def __str__(self) -> str:  # KeyError's repr-quoting makes messages unreadable
        return str(self.args[0]) if self.args else ""


class PluginError(RuntimeError):
    """An entry-point plugin could not be loaded; the message names the plugin."""


def load_import_string(target: str) -> Any:
    """Import ``"package.module:attr.sub"`` and return the attribute."""
    if ":" not in target:
        raise ValueError(f"Import string {target!r} must look like 'package.module:attribute'.")
    module_name, _, attr_path = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass
class Entry(Generic[T]):
    """One registry entry: an object or a lazy import string, plus free-form metadata."""

    name: str
    target: T | str
    metadata: dict[str, Any] = field(default_factory=dict)
    source: str = "builtin"  # "builtin" or "entry-point:<dist>"

    def load(self) -> T:
        if isinstance(self.target, str):
            if self.source == "builtin":
                self.target = load_import_string(self.target)
            else:  # a plugin: its import errors are reported by name, on every lookup
                try:
                    self.target = load_import_string(self.target)
                except Exception as exc:
                    raise PluginError(
                        f"Plugin {self.name!r} ({self.target!r}, {self.source}) failed to load: "
                        f"{type(exc).__name__}: {exc}. Fix or uninstall that package.") from exc
        return self.target  # type: ignore[return-value]


class Registry(Generic[T]):
    """A named collection of things (agents, task mixes, algorithm functions, ...).

    Args:
        kind: what is registered ("agent", "env", "advantage estimator"), used in messages.
        entry_point_group: optional ``importlib.metadata`` group scanned on demand for plugins.
            Each entry point's value is loaded; it must be a callable taking this registry
            (``def register(registry): registry.register(...)``) or the object to register under
            the entry point's name.
    """

    def __init__(self, kind: str, entry_point_group: str | None = None,
                 on_plugin: Callable[[str, Any], None] | None = None) -> None:
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._entries: dict[str, Entry[T]] = {}
        self._plugins_loaded = entry_point_group is None
        self._on_plugin = on_plugin
        self._plugin_errors: list[PluginError] = []

    # -- writing -------------------------------------------------------------------------------
    def register(self, name: str, target: T | str | None = None, *, source: str = "builtin",
                 **metadata: Any) -> Any:
        """Register ``target`` under ``name``; usable as a decorator when ``target`` is omitted.

        Raises:
            RegistryError: the name is already taken.
        """
        if target is None:
            def decorator(obj: T) -> T:
                self.register(name, obj, source=source, **metadata)
                return obj
            return decorator
        if name in self._entries:
            other = self._entries[name].source
            raise RegistryError(
                f"Duplicate {self.kind} name {name!r}: already registered by {other}. "
                f"Pick another name, or unregister the old one first.")
        self._entries[name] = Entry(name, target, dict(metadata), source)
        return target

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)

    def has_builtin(self, name: str) -> bool:
        """Whether ``name`` is registered already, without discovering plugins (registering the
        built-ins twice, on a re-import, is then a no-op)."""
        return name in self._entries

    # -- reading -------------------------------------------------------------------------------
    def _ensure_plugins(self) -> None:
        """Discover entry-point plugins once. With an ``on_plugin`` hook (envs) the hook runs at
        discovery; otherwise (agents) the entry point's import string is registered lazily, so a
        plugin's heavy imports happen only when it is used. A plugin that fails is reported on
        every later lookup, never hidden."""
        if not self._plugins_loaded:
            self._plugins_loaded = True
            from importlib.metadata import entry_points

            for ep in entry_points(group=self.entry_point_group):
                dist = getattr(getattr(ep, "dist", None), "name", "?")
                if self._on_plugin is None:
                    self.register(ep.name, ep.value, source=f"entry-point:{dist}")
                    continue
                try:
                    self._on_plugin(ep.name, ep.load())
                except RegistryError:
                    raise
                except Exception as exc:  # report, never skip silently
                    err = PluginError(
                        f"Plugin {ep.name!r} (entry point {ep.value!r} in group "
                        f"{self.entry_point_group!r}, distribution {dist!r}) failed to load: "
                        f"{type(exc).__name__}: {exc}. Fix or uninstall that package.")
                    err.__cause__ = exc
                    self._plugin_errors.append(err)
        if self._plugin_errors:
            raise self._plugin_errors[0]

    def names(self) -> list[str]:
        self._ensure_plugins()
        return sorted(self._entries)

    def entries(self) -> Iterator[Entry[T]]:
        self._ensure_plugins()
        for name in sorted(self._entries):
            yield self._entries[name]

    def entry(self, name: str) -> Entry[T]:
        if name not in self._entries:
            self._ensure_plugins()
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "(none)"
            raise RegistryError(f"Unknown {self.kind} {name!r}. Available: {known}."
                                f"{did_you_mean(name, self._entries)}") from None

    def get(self, name: str) -> T:
        return self.entry(name).load()

    def __contains__(self, name: object) -> bool:
        self._ensure_plugins()
        return name in self._entries

    def __len__(self) -> int:
        self._ensure_plugins()
        return len(self._entries)


# ---------------------------------------------------------------------------------------------
# The project's registries. Envs are also registered with gymnasium (see ``register_env``).
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EnvEntry:
    """What ``crl-bench list envs`` shows and ``gymnasium.make`` needs for one text env."""

    id: str                      # "crl/MiniHack-Room-5x5-v0"
    entry_point: str             # "crl_bench.envs.minihack.env:MiniHackTextEnv"
    family: str                  # "minihack" | "webshop" | "alfworld" | "swe" | plugin's own
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    extra: str | None = None     # pip extra that provides the dependencies, e.g. "minihack"
    system_prompt: str = ""      # the actor's system prompt for this env's family (its own text)


def _register_env_plugin(name: str, hook: Any) -> None:
    if not callable(hook):
        raise TypeError(f"env plugin {name!r} must point to a zero-argument function that calls "
                        f"crl_bench.register_env(...); got {type(hook).__name__}")
    hook()


ENVS: Registry[EnvEntry] = Registry("env", "crl_bench.envs", on_plugin=_register_env_plugin)
AGENTS: Registry[Any] = Registry("agent", "crl_bench.agents")
MIXES: Registry[Any] = Registry("task mix")


FAMILY_PROMPTS: dict[str, str] = {}
"""family -> the actor's system prompt registered with its envs (the first one registered)."""

RetrievalQuery = Callable[[str, str, Any], str]
"""A family's retrieval query form: ``query(goal, first_observation, raw_obs) -> text``
(``raw_obs``: the env's ``info["raw_obs"]`` at reset, None when it gives none)."""

FAMILY_QUERIES: dict[str, RetrievalQuery] = {}
"""family -> the retrieval query form registered with its envs (the first one registered)."""


def goal_observation_query(goal: str, observation: str, raw_obs: Any = None) -> str:
    """The official env manager's query, for a family that registers no form of its own
    (``traj_env_manager.py:149-157``): ``"Goal: {goal}\nObservation: {obs}"``."""
    return f"Goal: {goal}\nObservation: {observation}" if goal else f"Observation: {observation}"


def register_env(id: str, entry_point: str, *, family: str, kwargs: dict[str, Any] | None = None,
                 description: str = "", extra: str | None = None, source: str = "builtin",
                 system_prompt: str = "", retrieval_query: RetrievalQuery | None = None) -> EnvEntry:
    """Register a text env with crl-bench *and* gymnasium (lazily: nothing is imported).

    ``id`` must live in the ``crl/`` namespace (``"crl/MyEnv-v0"``) so that our envs never collide
    with other gymnasium registrations. ``system_prompt`` and ``retrieval_query`` belong to the
    env's family (the first env of a family that gives one sets it): the actor's system prompt,
    and the text an episode start retrieves experience with under ``experience.query=family``
    (default: :func:`goal_observation_query`).
    """
    if not id.startswith("crl/"):
        raise ValueError(f"Env id {id!r} must start with 'crl/' (e.g. 'crl/{id}').")
    import gymnasium

    entry = EnvEntry(id=id, entry_point=entry_point, family=family, kwargs=dict(kwargs or {}),
                     description=description, extra=extra, system_prompt=system_prompt)
    ENVS.register(id, entry, source=source)
    if system_prompt:
        FAMILY_PROMPTS.setdefault(family, system_prompt)
    if retrieval_query is not None:
        FAMILY_QUERIES.setdefault(family, retrieval_query)
    if id not in gymnasium.registry:
        gymnasium.register(id=id, entry_point=entry_point, kwargs=dict(kwargs or {}),
                           disable_env_checker=False, order_enforce=True)
    return entry


def family_system_prompt(family: str) -> str | None:
    """The system prompt registered with the envs of ``family`` (None if none was). Called for
    every prompt: a dict lookup; env plugins are discovered only when the family is unknown."""
    if family not in FAMILY_PROMPTS:
        ENVS.names()  # discovers env plugins once
    return FAMILY_PROMPTS.get(family)


def family_retrieval_query(family: str) -> RetrievalQuery:
    """The retrieval query form registered with the envs of ``family``
    (:func:`goal_observation_query` if none was); env plugins are discovered only when the
    family is unknown."""
    if family not in FAMILY_QUERIES:
        ENVS.names()  # discovers env plugins once
    return FAMILY_QUERIES.get(family, goal_observation_query)


def make_env(id: str, **kwargs: Any) -> Any:
    """``gymnasium.make`` with our error message for unknown ids (lists the known ones)."""
    import gymnasium

    entry = ENVS.get(id)  # raises with the list of known envs
    return gymnasium.make(entry.id, **kwargs)
