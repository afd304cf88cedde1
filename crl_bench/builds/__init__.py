"""Named models that crl-bench builds by training (``crl-bench build-model NAME``): the tiny SFT
model (:mod:`.tiny_sft`) and the reader (:mod:`.reader`)."""

from __future__ import annotations

from pathlib import Path


def _tiny_sft(out: Path) -> None:
    from crl_bench.builds.tiny_sft import build_tiny_sft

    build_tiny_sft(out)


def _reader(out: Path) -> None:
    from crl_bench.builds.reader import build_known_reader

    build_known_reader(out)


def register_builtin_builds() -> None:
    """Register the builders of ``tiny-sft`` and ``smollm2-135m-reader`` with
    :data:`crl_bench.llm.models.BUILDERS` (called when ``crl_bench`` is imported; light: the
    builders import their modules when they run)."""
    from crl_bench.llm.models import BUILDERS

    BUILDERS.setdefault("tiny-sft", _tiny_sft)
    BUILDERS.setdefault("smollm2-135m-reader", _reader)
