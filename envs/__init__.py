"""Built-in environment families (installed as ``crl_bench.envs``).

Each family is a sub-package whose ``registration.py`` has a cheap ``register()`` that calls
:func:`crl_bench.register_env` for its ids, with lazy ``"module:Class"`` entry points, so that
``import crl_bench`` never imports NLE, TextWorld or the WebShop engine.
"""

from __future__ import annotations

import importlib

FAMILIES: tuple[str, ...] = ("minihack", "webshop", "alfworld", "swe")


def register_builtin_envs() -> None:
    for family in FAMILIES:
        importlib.import_module(f"crl_bench.envs.{family}.registration").register()
