"""Allowed ranges of numeric settings (torch-free): a loss declares its arguments' ranges with
them, the run configuration its fields', and both checks read the same :class:`Range`."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """Allowed values of one numeric setting: ``lo <(=) value <(=) hi``, always finite."""

    lo: float
    hi: float
    lo_open: bool = False
    """True: ``value > lo`` (else ``value >= lo``)."""
    hi_open: bool = False
    note: str = ""
    """What special values mean (shown in the error)."""

    def __contains__(self, value: float) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        above = value > self.lo if self.lo_open else value >= self.lo
        below = value < self.hi if self.hi_open else value <= self.hi
        return above and below

    def describe(self, integer: bool = False) -> str:
        def num(x: float) -> str:
            return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"

        lo = f"> {num(self.lo)}" if self.lo_open else f">= {num(self.lo)}"
        hi = f"< {num(self.hi)}" if self.hi_open else f"<= {num(self.hi)}"
        kind = "an integer" if integer else "a finite number"
        return f"{kind} {lo} and {hi}" + (f" ({self.note})" if self.note else "")


def check_args(what: str, ranges: dict[str, Range], **values: float | None) -> None:
    """Raise ``ValueError`` naming the first of ``values`` outside its range (None: not set)."""
    for name, value in values.items():
        rng = ranges.get(name)
        if rng is not None and value is not None and value not in rng:
            raise ValueError(f"{what}: {name} must be {rng.describe()}, got {value}")
