"""The official MiniHack observation and prompt text (``view="official"``), from NLE's arrays.

Source: the ComplementaryRL fork of ROLL at ab2574f (paths relative to that repository):

* ``roll/pipeline/agentic/env/minihack/env.py`` (``env.py`` below) ``_obs_to_text`` (:526-590)
  renders each observation from the keys the launched config asks for
  (``examples/singletask-agentic/multitask_env_tool.yaml:275``: ``glyphs``, ``message``,
  ``chars_crop``, ``glyphs_crop``, ``screen_descriptions``; ``chars`` is always added,
  ``env.py:157-158``). Without ``blstats`` and ``inv_strs`` among them, the position, health and
  inventory parts of ``_obs_to_text`` are skipped, so an observation is:

  - ``Message: <message>`` when NLE's message is not empty (:531-534);
  - ``\\nDungeon view:`` and MiniHack's own 9 x 9 ``chars_crop`` around the agent, one row per
    line, 0 and space shown as space (:553-556, :570-572; ``utils.py:210-271``
    ``render_glyphs``) — left out when the crop is all blank;
  - the symbol legend (:574-582): a header, then one line ``<symbol>: [<descriptions>]`` per
    symbol on the *whole* screen (``collect_symbol_descriptions_from_obs``, ``utils.py:19-76``:
    ``screen_descriptions`` is 21 x 79, so it is matched with the full ``chars``, not the crop),
    in order of first appearance (row by row), each with the sorted list of NLE's screen
    descriptions of its squares, printed as a Python list;

  the parts joined by newlines (:590).
* After an action the action list follows (``env.py:390-394``):
  ``\\nYour available actions are:\\n`` and the action names, comma-separated; the first
  observation has none, the list is in the env instruction (``get_instructions``, :277-292)
  instead, after the default instruction (``_default_instruction``, :742-749).
* An action that is not one of the names (``parse_action``, :415-449;
  ``parse_action_utils.py:4-46``): the last observation (without the action list) followed by
  ``At turn 0, you did not provide a valid action.`` (:349-353; the turn counter is set to 0 by
  ``reset``, :327, and never advanced, so it always reads 0).
* Action names: ``_canonical_action_name`` (:948-1034) over MiniHack's action set, in its order
  (MiniHack's navigation tasks: ``north, east, south, west, northeast, southeast, southwest,
  northwest``).

The env manager's templates (``traj_env_manager.py``, the launched MiniHack env's config
``multitask_env_tool.yaml:263-270``): the system prompt ``minihack_maze_system_template``
(yaml :25-28), each turn's user message ``minihack_nav_train_template`` (yaml :65-69), and the
memory header (``traj_env_manager.py:101-108``).
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

HEADER_LEGEND = ("The meaning of common symbols in the dungeon view is (same symbol may have "
                 "different descriptions):\n")
"""``env.py:577-579``."""

ACTIONS_HEADER = "\nYour available actions are:\n"
"""``env.py:288, :390``."""

DEFAULT_INSTRUCTION = (
    "You are playing NetHack, a roguelike game. "
    "Navigate through the dungeon, avoid monsters, and reach the goal. "
    "Think carefully, then respond with exactly one action per turn using "
    "the format <think>[Your thoughts]</think><answer>[One of the actions in the action list]"
    "</answer>.")
"""``env.py:742-749`` (``_default_instruction``; the launched config sets no ``env_instruction``)."""

INVALID_ACTION = "At turn 0, you did not provide a valid action."
"""``env.py:351`` with ``current_turn`` always 0 (:327, :347)."""

SYSTEM_TEMPLATE = (
    "You are navigating a maze with varied terrain and obstacles. Plan a route toward the down "
    "staircase (>),\n"
    "avoiding dead ends, hazards (lava, ice, traps), and monsters. Watch for objects that might "
    "help.\n"
    "Evaluate alternate paths if blocked. Put your thoughts between <think> ... </think> tags. "
    "Respond with one action wrapped in <answer> ... </answer> tags.\n")
"""``minihack_maze_system_template`` (``multitask_env_tool.yaml:25-28``; a YAML ``|`` block: its
lines joined by newlines, one newline at the end), the launched env's ``agent_system_template``
(yaml :269)."""

TURN_TEMPLATE = "Observation:\n{observation}\n\nThink carefully, then choose your next action:\n"
"""``minihack_nav_train_template`` (``multitask_env_tool.yaml:65-69``), the launched env's
``agent_template`` (yaml :270)."""

MEMORY_TEMPLATE = ("\nBelow is distilled knowledge from earlier experiences.\n"
                   "Use it to guide your actions without overfitting.\n"
                   "Some insights may be overly specific, so identify only what is most relevant.\n"
                   "Knowledge: \n"
                   "{memory_message}\n"
                   "                ")
"""``traj_env_manager.py:101-108``: the memory block appended to the system prompt (after a
newline, :370-371)."""

_COMPASS = {"N": "north", "E": "east", "S": "south", "W": "west", "NE": "northeast",
            "SE": "southeast", "SW": "southwest", "NW": "northwest"}
_MISC = {"UP": "upstairs", "DOWN": "downstairs", "WAIT": "wait"}


def official_action_name(action: Any) -> str | None:
    """The official name of one NLE action (``env.py:948-1001``) for the moves MiniHack's
    navigation tasks use (``CompassDirection``, ``CompassDirectionLonger``, ``MiscDirection``);
    None for other commands."""
    kind = type(action).__name__
    name = getattr(action, "name", str(action))
    if kind == "CompassDirection":
        return _COMPASS.get(name, name.lower())
    if kind == "CompassDirectionLonger":
        return _COMPASS[name] + "_run" if name in _COMPASS else f"{name.lower()}_run"
    if kind == "MiscDirection":
        return _MISC.get(name, name.lower())
    return None


def _decode(data: np.ndarray) -> str:
    """``env.py:592-597`` (message) and ``utils.py:14-15`` (screen descriptions)."""
    return bytes(np.asarray(data, dtype=np.uint8)).decode("utf-8", errors="ignore").rstrip("\x00")


def render_crop(chars_crop: np.ndarray) -> str:
    """``render_glyphs(chars_crop, crop_to_bounds=False)`` (``utils.py:210-271``): each row of the
    crop, 0 and 32 as a space; "" when every square is blank."""
    grid = np.asarray(chars_crop)
    rows = ["".join(" " if int(v) in (0, 32) else chr(int(v)) for v in row) for row in grid]
    if all(not row.strip() for row in rows):
        return ""
    return "\n".join(rows)


def symbol_legend(chars: np.ndarray, screen_descriptions: np.ndarray) -> dict[str, list[str]]:
    """``collect_symbol_descriptions_from_obs`` (``utils.py:19-76``) on the full screen: each
    non-blank symbol (first appearance, row by row) with the sorted set of its squares' non-empty
    descriptions."""
    chars = np.asarray(chars)
    found: dict[str, set[str]] = {}
    for r in range(chars.shape[0]):
        for c in range(chars.shape[1]):
            value = int(chars[r, c])
            if value in (0, 32):
                continue
            text = bytes(np.asarray(screen_descriptions[r, c], dtype=np.uint8)).decode(
                "utf-8", errors="replace").rstrip("\x00").strip()
            if not text:
                continue
            found.setdefault(chr(value) if value <= 255 else str(value), set()).add(text)
    return {k: sorted(v) for k, v in found.items()}


def render_observation(obs: dict[str, np.ndarray]) -> str:
    """``_obs_to_text`` (``env.py:526-590``) for the launched observation keys."""
    parts: list[str] = []
    message = _decode(obs["message"]).strip()
    if message:
        parts.append(f"Message: {message}")
    view = render_crop(obs["chars_crop"])
    if view.strip():
        parts.append("\nDungeon view:")
        parts.append(view)
    legend = HEADER_LEGEND
    for symbol, descriptions in symbol_legend(obs["chars"], obs["screen_descriptions"]).items():
        legend += f"{symbol}: {descriptions}\n"
    parts.append(legend)
    return "\n".join(parts)


def action_list(names: Iterable[str]) -> str:
    """``env.py:390-392``: the header and the names, comma-separated."""
    return ACTIONS_HEADER + ", ".join(names)


def instruction(names: Iterable[str]) -> str:
    """``get_instructions`` (``env.py:277-292``): the default instruction and the action list."""
    return DEFAULT_INSTRUCTION + action_list(names)


def prompt_info(names: Iterable[str]) -> dict[str, str]:
    """What the official env manager shows around the observations of this env, for the prompt
    builder (``crl_bench.llm.prompting``, ``layout="official"``): ``system`` (system prompt),
    ``instruction`` (the env instruction, first user message), ``turn`` (each user message,
    ``{observation}`` filled in) and ``memory`` (the retrieved-memory block of the system
    prompt, ``{memory_message}`` filled in)."""
    return {"system": SYSTEM_TEMPLATE, "instruction": instruction(names), "turn": TURN_TEMPLATE,
            "memory": MEMORY_TEMPLATE}
