"""handykit: small, dependency-free helpers. Import the module you need, e.g.
``from handykit.text import slugify``."""

__version__ = "1.0.0"

__all__ = ["graph", "inifile", "intervals", "iterutils", "lru", "money", "querystring", "roman",
           "semver", "stats", "text"]
