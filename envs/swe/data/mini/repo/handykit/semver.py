"""Semantic versions (https://semver.org): parsing, ordering and bumping."""

import re
from dataclasses import dataclass
from functools import total_ordering

__all__ = ["Version"]

_SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
                     r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
                     r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$")


def _identifier_key(ident):
    # Numeric identifiers compare numerically and rank below alphanumeric ones.
    return (0, int(ident), "") if ident.isdigit() else (1, 0, ident)


@total_ordering
@dataclass(frozen=True)
class Version:
    major: int
    minor: int
    patch: int
    prerelease: tuple = ()
    build: tuple = ()

    @classmethod
    def parse(cls, text):
        m = _SEMVER.match(text.strip())
        if not m:
            raise ValueError(f"not a semantic version: {text!r}")
        major, minor, patch, pre, build = m.groups()
        return cls(int(major), int(minor), int(patch),
                   tuple(pre.split(".")) if pre else (), tuple(build.split(".")) if build else ())

    def __str__(self):
        out = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            out += "-" + ".".join(self.prerelease)
        if self.build:
            out += "+" + ".".join(self.build)
        return out

    def _key(self):
        # A release ranks above every pre-release of the same version; build metadata is ignored.
        pre = (1,) if not self.prerelease else (0, tuple(_identifier_key(i) for i in self.prerelease))
        return (self.major, self.minor, self.patch, pre)

    def __eq__(self, other):
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __lt__(self, other):
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() < other._key()

    def bump(self, part):
        """Next version: ``part`` is "major", "minor" or "patch". Lower parts reset to 0 and
        pre-release and build metadata are dropped."""
        if part == "major":
            return Version(self.major + 1, 0, 0)
        if part == "minor":
            return Version(self.major, self.minor + 1, 0)
        if part == "patch":
            return Version(self.major, self.minor, self.patch + 1)
        raise ValueError(f"part must be 'major', 'minor' or 'patch', got {part!r}")
