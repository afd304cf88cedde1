"""Action words of the MiniHack text envs and the NLE key presses behind them.

A task's admissible actions are the words for its own NLE action set (MiniHack navigation
tasks: the 8 compass moves; Corridor adds open, kick and search). Commands that ask "In what
direction?" become one word per direction (``open north`` ... ``open northwest``) so that every
admissible action is a complete move. Order: moves clockwise from north, then the rest in the
task's order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from crl_bench.envs.minihack.language import DIRECTIONS

# NetHack keys of the 8 moves (vi-keys), in DIRECTIONS order.
MOVE_KEYS: dict[str, int] = {"north": ord("k"), "northeast": ord("u"), "east": ord("l"),
                             "southeast": ord("n"), "south": ord("j"), "southwest": ord("b"),
                             "west": ord("h"), "northwest": ord("y")}
RUN_KEYS: dict[str, int] = {d: ord(chr(k).upper()) for d, k in MOVE_KEYS.items()}

# Commands that prompt for a direction, by key: open, close, kick (^D), untrap (#untrap is M-u).
DIRECTIONAL_COMMANDS: dict[int, str] = {ord("o"): "open", ord("c"): "close", 4: "kick",
                                        ord("u") | 0x80: "untrap"}
# Words for other commands; the rest fall back to NLE's enum name.
COMMAND_WORDS: dict[int, str] = {ord("s"): "search", ord("."): "wait", ord(","): "pick up",
                                 ord("e"): "eat", ord("a"): "apply", ord("<"): "go up",
                                 ord(">"): "go down", ord("q"): "quaff", ord("r"): "read",
                                 ord("z"): "zap", ord("w"): "wield", ord("W"): "wear",
                                 ord("P"): "put on", ord("f"): "fire", ord("t"): "throw",
                                 ord("#"): "extended command", ord("p") | 0x80: "pray",
                                 ord("i"): "inventory"}


@dataclass(frozen=True)
class ActionWord:
    """One admissible action: its text and the indices into the NLE env's action list to press."""

    text: str
    steps: tuple[int, ...]


def build_action_words(nle_actions: Sequence[Any]) -> tuple[ActionWord, ...]:
    """Words for an NLE action set (``env.actions``: a sequence of ``IntEnum`` key codes).

    Raises:
        ValueError: a directional command is in the set but its directions are not (the
            command could never be completed).
    """
    index_of_key = {int(a): i for i, a in enumerate(nle_actions)}
    words: list[ActionWord] = []
    for d in DIRECTIONS:
        if MOVE_KEYS[d] in index_of_key:
            words.append(ActionWord(d, (index_of_key[MOVE_KEYS[d]],)))
    for d in DIRECTIONS:
        if RUN_KEYS[d] in index_of_key:
            words.append(ActionWord(f"run {d}", (index_of_key[RUN_KEYS[d]],)))
    taken = {MOVE_KEYS[d] for d in DIRECTIONS} | {RUN_KEYS[d] for d in DIRECTIONS}
    for action in nle_actions:
        key = int(action)
        if key in taken:
            continue
        taken.add(key)
        if key in DIRECTIONAL_COMMANDS:
            verb = DIRECTIONAL_COMMANDS[key]
            missing = [d for d in DIRECTIONS if MOVE_KEYS[d] not in index_of_key]
            if missing:
                raise ValueError(f"The action set has {verb!r} but not the moves {missing} it "
                                 "needs as its direction; add the compass directions to `actions`.")
            for d in DIRECTIONS:
                words.append(ActionWord(f"{verb} {d}", (index_of_key[key],
                                                        index_of_key[MOVE_KEYS[d]])))
        else:
            name = COMMAND_WORDS.get(key) or getattr(action, "name", f"key {key}").lower()
            words.append(ActionWord(name.replace("_", " "), (index_of_key[key],)))
    texts = [w.text for w in words]
    if len(set(texts)) != len(texts):
        raise ValueError(f"Two NLE actions map to the same word in {texts}; pass a smaller "
                         "`actions` set.")
    return tuple(words)


def normalise_action(text: str) -> str:
    """Lower-case and collapse white space.

    ``" North "`` -> ``"north"``; ``"open  EAST"`` -> ``"open east"``.
    """
    return " ".join(text.lower().split())
