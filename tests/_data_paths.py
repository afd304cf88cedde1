"""Where tests find env data that cannot be downloaded in CI (WebShop, ALFWorld, SWE).

Import it from a test module as ``from _data_paths import shared_data_dir`` (pytest puts the
``tests/`` folder on ``sys.path`` because it has no ``__init__.py``). No conftest is involved, so
each test file says for itself what it needs.

Order, first hit wins:

1. ``$CRL_BENCH_<FAMILY>_DATA`` (e.g. ``CRL_BENCH_WEBSHOP_DATA``), the folder itself;
2. ``$CRL_BENCH_DATA/<family>``;
3. ``<repo>/../shared/data/<family>``: the layout of the development machines and of CI, where
   ``shared/`` sits beside the clone.

A test that needs the data calls ``pytest.skip`` with the reason when this returns ``None``.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def shared_data_dir(family: str) -> Path | None:
    """Return the data folder of ``family`` ("webshop", "alfworld", "swe"), or ``None``."""
    candidates: list[Path] = []
    own = os.environ.get(f"CRL_BENCH_{family.upper()}_DATA")
    if own:
        candidates.append(Path(own).expanduser())
    parent = os.environ.get("CRL_BENCH_DATA")
    if parent:
        candidates.append(Path(parent).expanduser() / family)
    candidates.append(REPO_ROOT.parent / "shared" / "data" / family)
    for folder in candidates:
        if folder.is_dir():
            return folder
    return None


def missing_data_reason(family: str) -> str:
    """The skip message when :func:`shared_data_dir` finds nothing."""
    return (f"no {family} data: set CRL_BENCH_{family.upper()}_DATA=PATH (or CRL_BENCH_DATA=PARENT), "
            f"or put the folder at {REPO_ROOT.parent / 'shared' / 'data' / family}")
