"""Money amounts as ``Decimal`` with two decimal places (cents)."""

from decimal import ROUND_HALF_UP, Decimal

__all__ = ["to_cents", "from_cents", "round_money", "split_amount"]

_CENT = Decimal("0.01")


def round_money(amount):
    """Round to cents, halves away from zero: ``round_money("2.675") == Decimal("2.68")``."""
    return Decimal(str(amount)).quantize(_CENT, rounding=ROUND_HALF_UP)


def to_cents(amount):
    return int(round_money(amount) * 100)


def from_cents(cents):
    return (Decimal(cents) / 100).quantize(_CENT)


def split_amount(total, parts):
    """Split ``total`` into ``parts`` amounts that differ by at most one cent and add up to
    ``total`` exactly; the larger amounts come first.

    >>> [str(x) for x in split_amount("10.00", 3)]
    ['3.34', '3.33', '3.33']
    """
    if parts < 1:
        raise ValueError("parts must be at least 1")
    base, remainder = divmod(to_cents(total), parts)
    return [from_cents(base + (1 if i < remainder else 0)) for i in range(parts)]
