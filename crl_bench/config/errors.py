"""The error a configuration that cannot work raises (below the config and its validation)."""

MAX_MESSAGE_CHARS = 2000
"""Longer messages keep their head (what is wrong) and tail (the fix) around a marker: a value
given on the command line is echoed, and it may be 100 kB long."""


def cut_middle(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = (limit - 40) // 2
    return f"{text[:half]} [... {len(text) - 2 * half:,} characters cut ...] {text[-half:]}"


class ConfigError(ValueError):
    """A configuration that cannot work; the message says what to change."""

    def __init__(self, *args: object) -> None:
        if len(args) == 1 and isinstance(args[0], str):
            args = (cut_middle(args[0]),)
        super().__init__(*args)
