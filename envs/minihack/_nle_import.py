"""Import MiniHack on current setuptools.

MiniHack 1.0.2 does ``import pkg_resources`` in the modules that ``import minihack`` loads, and
calls its ``resource_filename`` to find its own scripts and NLE's data directory. setuptools 81+
no longer ships ``pkg_resources`` (and older setuptools warns on every import of it). When it is
missing we put a one-function module in ``sys.modules`` for the duration of the import, answering
the same question with :mod:`importlib.resources` (both packages are plain directories on disk,
so the path is the same), then take it out again: MiniHack's modules keep their reference, and
nothing else in the process (pytest, for one, probes ``sys.modules["pkg_resources"]``) ever sees
the stand-in.
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
    shim = None
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*pkg_resources is deprecated.*")
        try:
            import pkg_resources  # noqa: F401
        except ImportError:
            shim = types.ModuleType("pkg_resources")
            shim.__doc__ = "crl-bench stand-in: resource_filename() only, for importing MiniHack."
            shim.resource_filename = _resource_filename  # type: ignore[attr-defined]
            sys.modules["pkg_resources"] = shim
        try:
            return importlib.import_module("minihack")
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError(
                f"The MiniHack envs need NLE and MiniHack ({exc}). Install them with "
                "`pip install 'crl-bench[minihack]'` (nle==1.3.*, minihack==1.0.*).") from exc
        finally:
            if shim is not None and sys.modules.get("pkg_resources") is shim:
                del sys.modules["pkg_resources"]
