"""Text helpers: slugs, truncation, identifier case conversion and word wrapping."""

import re
import unicodedata

__all__ = ["slugify", "truncate", "snake_case", "camel_case", "wrap"]


def slugify(text, sep="-"):
    """Return a lower-case ASCII slug of ``text``.

    Accents are stripped (``"Café"`` -> ``"cafe"``) and every run of characters that are not
    letters or digits becomes a single ``sep``; the slug never starts or ends with ``sep``.

    >>> slugify("Hello, World!")
    'hello-world'
    """
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    words = re.findall(r"[a-z0-9]+", ascii_text.lower())
    return sep.join(words)


def truncate(text, width, ellipsis="..."):
    """Shorten ``text`` to at most ``width`` characters, ending with ``ellipsis`` if cut.

    >>> truncate("abcdefghij", 8)
    'abcde...'
    """
    if width < len(ellipsis):
        raise ValueError(f"width {width} is smaller than the ellipsis {ellipsis!r}")
    if len(text) <= width:
        return text
    return text[: width - len(ellipsis)] + ellipsis


def snake_case(name):
    """Convert ``CamelCase``, ``mixedCase``, ``kebab-case`` or spaced words to ``snake_case``.

    Runs of capitals are kept together as one word: ``"HTTPServer"`` -> ``"http_server"``.
    """
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    name = re.sub(r"[-\s]+", "_", name)
    return name.lower()


def camel_case(name, upper_first=True):
    """Convert ``snake_case`` (or kebab/spaced words) to ``CamelCase`` / ``camelCase``."""
    words = [w for w in re.split(r"[_\-\s]+", name) if w]
    if not words:
        return ""
    first = words[0].capitalize() if upper_first else words[0].lower()
    return first + "".join(w.capitalize() for w in words[1:])


def wrap(text, width):
    """Greedy word wrap: a list of lines of at most ``width`` characters.

    A word longer than ``width`` gets a line of its own.
    """
    if width < 1:
        raise ValueError("width must be at least 1")
    lines = []
    current = ""
    for word in text.split():
        if not current:
            current = word
        elif len(current) + 1 + len(word) <= width:
            current += " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines
