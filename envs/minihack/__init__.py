"""The MiniHack text-env family: MiniHack tasks on the real NLE, observed and played in words.

Modules: ``env`` (:class:`MiniHackTextEnv`), ``language`` (the observation text), ``actions``
(action words), ``tasks`` (registered tasks and goal sentences), ``registration`` (cheap
``register()``), ``scripted`` (a rule-based agent that reads only the text).

Importing this package is cheap; NLE is imported when an env is made.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MiniHackTextEnv", "ScriptedTextAgent"]


def __getattr__(name: str) -> Any:
    if name == "MiniHackTextEnv":
        from crl_bench.envs.minihack.env import MiniHackTextEnv

        return MiniHackTextEnv
    if name == "ScriptedTextAgent":
        from crl_bench.envs.minihack.scripted import ScriptedTextAgent

        return ScriptedTextAgent
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
