"""Roman numerals for 1..3999."""

import re

__all__ = ["to_roman", "from_roman"]

_NUMERALS = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
             (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
_VALUES = {"M": 1000, "D": 500, "C": 100, "L": 50, "X": 10, "V": 5, "I": 1}


def to_roman(n):
    """``to_roman(1994) == "MCMXCIV"``. Raises ValueError outside 1..3999."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"expected an int, got {type(n).__name__}")
    if not 1 <= n <= 3999:
        raise ValueError(f"{n} is outside 1..3999")
    out = []
    for value, numeral in _NUMERALS:
        count, n = divmod(n, value)
        out.append(numeral * count)
    return "".join(out)


def from_roman(text):
    """``from_roman("MCMXCIV") == 1994``. Accepts only canonical numerals (any case)."""
    s = text.strip().upper()
    if not s or not re.fullmatch(r"[MDCLXVI]+", s):
        raise ValueError(f"invalid Roman numeral: {text!r}")
    total = 0
    for i, ch in enumerate(s):
        value = _VALUES[ch]
        if i + 1 < len(s) and value < _VALUES[s[i + 1]]:
            total -= value
        else:
            total += value
    if not 1 <= total <= 3999 or to_roman(total) != s:
        raise ValueError(f"invalid Roman numeral: {text!r}")
    return total
