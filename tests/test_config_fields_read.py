"""Every configuration field is read by some code (a field nothing reads would make `--set` of it
silently do nothing)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from crl_bench.config.schema import RunConfig

ROOT = Path(__file__).resolve().parents[1]


def _sources() -> str:
    texts = []
    for folder in ("crl_bench", "baselines", "envs"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            if path.name == "config.py" and path.parent.name == "runner":
                # the field declarations, validate() and the presets do not count as use
                text = re.sub(r"(?m)^ {4}\w+: [^\n]*= [^\n]*$", "", text)
                text = re.sub(r"(?s)    def validate\(.*?\n(?=    def |\S)", "", text)
                text = text.split("# presets")[0]
            texts.append(text)
    return "\n".join(texts)


def _fields(cls, prefix=""):
    for f in dataclasses.fields(cls):
        value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(value):
            yield from _fields(type(value), f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f.name


def test_every_config_field_is_read_outside_the_config_module():
    code = _sources()
    unread = [path for path, name in _fields(RunConfig)
              if not re.search(rf"\.{name}\b|\"{name}\"|'{name}'", code)]
    assert not unread, f"config fields no code reads (remove them or use them): {unread}"
