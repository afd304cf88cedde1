"""URL query strings: ``a=1&b=two+words`` <-> ``{"a": ["1"], "b": ["two words"]}``."""

from urllib.parse import quote_plus, unquote_plus

__all__ = ["parse_qs", "encode_qs"]


def parse_qs(query, keep_blank=False):
    """Parse a query string (a leading ``?`` is allowed) into ``{key: [values]}``.

    ``+`` and ``%20`` both decode to a space. Repeated keys collect all their values in order.
    Pairs with an empty value are dropped unless ``keep_blank`` is true.
    """
    result = {}
    for pair in query.lstrip("?").split("&"):
        if not pair:
            continue
        key, _, value = pair.partition("=")
        key, value = unquote_plus(key), unquote_plus(value)
        if not value and not keep_blank:
            continue
        result.setdefault(key, []).append(value)
    return result


def encode_qs(params):
    """Inverse of :func:`parse_qs`: values may be a string or a list of strings."""
    parts = []
    for key, values in params.items():
        if isinstance(values, str):
            values = [values]
        for value in values:
            parts.append(f"{quote_plus(str(key))}={quote_plus(str(value))}")
    return "&".join(parts)
