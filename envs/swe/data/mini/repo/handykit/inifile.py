"""A small INI parser: ``[section]`` headers, ``key = value`` or ``key: value`` lines, and
full-line comments starting with ``#`` or ``;``."""

__all__ = ["IniError", "parse_ini"]


class IniError(ValueError):
    """A line could not be parsed; ``lineno`` is 1-based."""

    def __init__(self, lineno, message):
        self.lineno = lineno
        super().__init__(f"line {lineno}: {message}")


def _split_pair(line):
    # The key ends at the first separator; the value may contain '=' or ':' itself.
    positions = [p for p in (line.find("="), line.find(":")) if p >= 0]
    if not positions:
        return None
    cut = min(positions)
    return line[:cut], line[cut + 1:]


def parse_ini(text):
    """Parse INI text into ``{section: {key: value}}``.

    Keys are lower-cased, keys and values stripped. Keys before the first section go to
    ``"DEFAULT"``. A repeated key keeps its last value.

    Raises:
        IniError: a line is neither a section, a pair, a comment nor blank.
    """
    sections = {}
    current = "DEFAULT"
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            if not line.endswith("]") or len(line) < 3:
                raise IniError(lineno, f"bad section header {line!r}")
            current = line[1:-1].strip()
            sections.setdefault(current, {})
            continue
        pair = _split_pair(line)
        if pair is None:
            raise IniError(lineno, f"expected 'key = value', got {line!r}")
        key, value = pair[0].strip().lower(), pair[1].strip()
        if not key:
            raise IniError(lineno, "empty key")
        sections.setdefault(current, {})[key] = value
    return sections
