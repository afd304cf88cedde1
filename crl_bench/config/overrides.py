"""``--set KEY=VALUE`` pairs as a dict of overrides (every command line that takes them)."""

from __future__ import annotations

from collections.abc import Sequence


def parse_overrides(pairs: Sequence[str]) -> dict[str, object]:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}`` (values parsed as JSON when they can be)."""
    import json

    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"override {pair!r} must look like KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out
