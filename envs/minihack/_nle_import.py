"""Import MiniHack on current setuptools.

MiniHack 1.0.2 calls ``pkg_resources.resource_filename`` at import time to find its scripts and
NLE's data directory. setuptools 81+ no longer ships ``pkg_resources``, and older setuptools
warns on every import of it. When ``pkg_resources`` is missing we register a one-function module
answering the same question with :mod:`importlib.resources` (both packages are plain directories
on disk, so the path is the same), then import MiniHack.
"""

from __future__ import annotations

import importlib
import importlib.resources
import sys
import types
import warnings
from typing import Any


def _resource_filename(package: str, resource: str) -> str:
    return str(importlib.resources.files(package) / resource)


def import_minihack() -> Any:
    """Import and return the ``minihack`` package (registers its gymnasium ids).

    Raises:
        ModuleNotFoundError: MiniHack/NLE are not installed; the message says how to install them.
    """
    if "minihack" in sys.modules:
        return sys.modules["minihack"]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*pkg_resources is deprecated.*")
        try:
            import pkg_resources  # noqa: F401
        except ImportError:
            shim = types.ModuleType("pkg_resources")
            shim.__doc__ = "crl-bench stand-in: resource_filename() only (MiniHack's one use)."
            shim.resource_filename = _resource_filename  # type: ignore[attr-defined]
            sys.modules["pkg_resources"] = shim
        try:
            return importlib.import_module("minihack")
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError(
                f"The MiniHack envs need NLE and MiniHack ({exc}). Install them with "
                "`pip install 'crl-bench[minihack]'` (nle==1.3.*, minihack==1.0.*).") from exc
