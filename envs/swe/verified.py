"""SWE-bench Verified for evaluation under ``--preset paper`` (the paper's SWE benchmark), where
its instances file exists: ``$CRL_BENCH_SWE_VERIFIED`` names it (.json/.jsonl; the docker
backend runs it). Without it SWE trains and evaluates on our ``mini`` task set, as under every
other preset."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

SWE_VERIFIED_ENV = "CRL_BENCH_SWE_VERIFIED"
"""Path of a SWE-bench Verified instances file (.json/.jsonl, the docker backend runs them)."""


def swe_verified_file() -> Path | None:
    """The file named by ``$CRL_BENCH_SWE_VERIFIED`` if it exists, else None."""
    value = os.environ.get(SWE_VERIFIED_ENV, "").strip()
    path = Path(value) if value else None
    return path if path is not None and path.is_file() else None


def verified_eval_kwargs() -> dict[str, Any]:
    """``gymnasium.make`` kwargs that evaluate on SWE-bench Verified (empty without its file)."""
    verified = swe_verified_file()
    return {} if verified is None else {"task_set": str(verified), "split": "all"}
