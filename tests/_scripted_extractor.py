"""A deterministic ``generate`` callable for the extractor role.

It answers from a fixed script instead of a model, so merge / extraction / Search-and-Ask logic
can be exercised exactly (including malformed answers) and dry runs need no LLM. Its outputs
have the same ``.text`` attribute as a real backend's generation objects.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Sequence, Union

Messages = list[dict[str, str]]
Script = Union[Sequence[str], Callable[[Messages], str]]


@dataclass
class TextGeneration:
    """A generation with only its text (real backends add token ids and log-probs)."""

    text: str


class ScriptedGenerator:
    """``generate(list of message lists) -> list[TextGeneration]`` from a script.

    Args:
        script: either a list of answers handed out in order (one per prompt, across calls;
            running out raises), or a function ``messages -> answer``.
    """

    def __init__(self, script: Script) -> None:
        self._script = script
        self._next = 0
        self._lock = threading.Lock()
        self.prompts: list[Messages] = []  # every prompt seen, in order

    def __call__(self, batch: Sequence[Messages]) -> list[TextGeneration]:
        out = []
        with self._lock:
            for messages in batch:
                self.prompts.append(messages)
                if callable(self._script):
                    text = self._script(messages)
                else:
                    if self._next >= len(self._script):
                        raise RuntimeError(f"ScriptedGenerator ran out of answers after "
                                           f"{len(self._script)}")
                    text = self._script[self._next]
                    self._next += 1
                out.append(TextGeneration(str(text)))
        return out
