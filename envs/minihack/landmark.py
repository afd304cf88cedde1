"""The Landmark level: stairs hidden under one of eight rocks, their place fixed by the room's
landmark (pure data and des-file text; no NLE import).

A lit 5x5 room, the agent in the centre, a rock on each of the 8 squares around it and the
staircase down under one of them: NetHack draws an object over the terrain beneath it, so the
observation lists eight identical ``rock (object): adjacent ...`` lines and never names the
stairs. One *landmark* stands on the room's outer ring (distance 2 from the agent), and its kind
fixes where the stairs are (:data:`LANDMARK_RULE`: the fountain always means southwest). The
knowledge the actor needs is therefore stable across every episode of the family but absent from
the observation: a policy learns the eight pairs from reward, or an experience entry retrieved at
the episode's start ("in the room with the fountain the stairs are southwest") carries them.

Level seed -> layout (:func:`landmark_layout`): the landmark's kind is ``seed % 8`` (any 8
consecutive seeds cover the 8 kinds, hence the 8 stairs directions, once each: a runner step of
8 or 16 groups on consecutive seeds pushes no constant move) and its square on the ring is
``(seed // 8) % 16``, independent of the kind, so the landmark's own direction says nothing about
the stairs. There are 8 x 16 = 128 layouts. The first observation depends only on the landmark's
name and its direction word, so training and evaluation share the rule and the set of layouts
by design; what differs between them is the level seeds (disjoint ranges in the runner).
"""

from __future__ import annotations

from crl_bench.envs.minihack.language import DIRECTION_STEPS, DIRECTIONS

# Landmark kind -> (des-file statement placing it at {x},{y}, the name the observation gives it).
LANDMARKS: tuple[tuple[str, str, str], ...] = (
    ("fountain", "FOUNTAIN:({x},{y})", "fountain"),
    ("altar", "ALTAR:({x},{y}),neutral,altar", "altar"),
    ("sink", "SINK:({x},{y})", "sink"),
    ("throne", "TERRAIN:({x},{y}),'\\\\'", "opulent throne"),
    ("grave", "GRAVE:({x},{y})", "grave"),
    ("ice", "TERRAIN:({x},{y}),'I'", "ice"),
    ("boulder", "OBJECT:('`',\"boulder\"),({x},{y})", "boulder"),
    ("chest", "OBJECT:('(',\"chest\"),({x},{y})", "chest"),
)
"""The eight landmark kinds, in level-seed order (``seed % 8``)."""

LANDMARK_RULE: dict[str, str] = {
    "fountain": "southwest", "altar": "north", "sink": "east", "throne": "northwest",
    "grave": "south", "ice": "northeast", "boulder": "west", "chest": "southeast",
}
"""Landmark kind -> direction of the staircase down from the agent (a permutation of the eight
compass words; arbitrary by design, so nothing in the words themselves gives it away)."""

COVER_OBJECT = "rock"
"""The object on each of the 8 squares around the agent (one of them hides the stairs)."""

CENTRE = (3, 3)  # the agent's square in the map below (x east, y south)
RING: tuple[tuple[int, int], ...] = (
    (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (5, 2), (5, 3), (5, 4),
    (5, 5), (4, 5), (3, 5), (2, 5), (1, 5), (1, 4), (1, 3), (1, 2),
)
"""The 16 floor squares at distance 2 from the agent, clockwise from the north-west corner."""

_ROOM = """MAZE: "mylevel", ' '
FLAGS:hardfloor
INIT_MAP: solidfill,' '
GEOMETRY:center,center
MAP
-------
|.....|
|.....|
|.....|
|.....|
|.....|
-------
ENDMAP
REGION:(0,0,7,7),lit,"ordinary"
BRANCH:(3,3,3,3),(0,0,0,0)
"""


def landmark_layout(level_seed: int) -> tuple[str, tuple[int, int], str]:
    """(landmark kind, its square on the map, the stairs' direction from the agent) of a seed."""
    if level_seed < 0:
        raise ValueError(f"level seeds are non-negative integers, got {level_seed}")
    kind = LANDMARKS[level_seed % len(LANDMARKS)][0]
    square = RING[(level_seed // len(LANDMARKS)) % len(RING)]
    return kind, square, LANDMARK_RULE[kind]


def landmark_des(level_seed: int) -> str:
    """The des-file of a level seed's layout (see the module docstring)."""
    kind, (x, y), stairs = landmark_layout(level_seed)
    statement = next(s for k, s, _ in LANDMARKS if k == kind)
    cx, cy = CENTRE
    lines = [statement.format(x=x, y=y)]
    lines += [f"OBJECT:('*',\"{COVER_OBJECT}\"),({cx + dx},{cy + dy})" for dx, dy in DIRECTION_STEPS]
    dx, dy = DIRECTION_STEPS[DIRECTIONS.index(stairs)]
    lines.append(f"STAIR:({cx + dx},{cy + dy}),down")
    return _ROOM + "\n".join(lines) + "\n"


def landmark_name(kind: str) -> str:
    """The name the observation gives a landmark kind (``throne`` -> ``opulent throne``)."""
    for k, _, name in LANDMARKS:
        if k == kind:
            return name
    raise ValueError(f"unknown landmark {kind!r}; the kinds are "
                     f"{', '.join(k for k, _, _ in LANDMARKS)}")
