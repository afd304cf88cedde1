"""The error a configuration that cannot work raises (below the config and its validation)."""


class ConfigError(ValueError):
    """A configuration that cannot work; the message says what to change."""
