"""Registration of the alfworld envs (cheap: nothing heavy is imported here)."""

from __future__ import annotations


def register() -> None:
    """Register this family's envs with crl-bench and gymnasium."""
