"""The MiniHack tasks crl-bench registers, with their goal sentences (pure data, no NLE import).

Each :class:`MiniHackTask` names a MiniHack gymnasium id (``MiniHack-Room-5x5-v0``) and says how
the text env presents it: the goal sentence shown in ``info["goal"]`` and the default episode
cap. The registration module turns every entry into ``crl/<minihack id>``. Three levels are our
own (``MiniHack-Room-Adjacent-3x3-v0``, its ``-Balanced-`` variant and
``MiniHack-Room-Landmark-5x5-v0``, des-files run by MiniHack's custom navigation class; only their
``crl/`` ids exist, MiniHack itself does not register them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from crl_bench.envs.minihack.landmark import landmark_des

# Paper setting: 30 actions per MiniHack Room episode.
PAPER_MAX_STEPS = 30


@dataclass(frozen=True)
class MiniHackTask:
    """One MiniHack task as crl-bench exposes it.

    Attributes:
        minihack_id: the gymnasium id MiniHack registers (``"MiniHack-Room-5x5-v0"``).
        goal: the goal sentence given to the agent in ``info["goal"]``.
        max_steps: default episode cap in actions (``truncated`` when reached).
        description: one line for ``crl-bench list envs``.
        des_file: for a level of our own, its NetHack level description (MiniHack's des-file
            language); the env is then MiniHack's ``MiniHack-Navigation-Custom-v0`` class with
            this file. None for MiniHack's own registered tasks.
        des_for_seed: for a level of our own whose layout the level seed sets (not NetHack's
            random generator): ``level seed -> des-file``, written into the game at each reset.
            ``des_file`` is then the file the env starts with.
    """

    minihack_id: str
    goal: str
    max_steps: int = PAPER_MAX_STEPS
    description: str = ""
    des_file: str | None = None
    des_for_seed: Callable[[int], str] | None = None

    @property
    def env_id(self) -> str:
        return f"crl/{self.minihack_id}"


_ROOM_GOAL = "Reach the staircase down (>) in this room."
_DARK = " The room is dark: you only see the squares next to you, so explore to find the stairs."
_MONSTER = " A hostile monster roams the room; avoid it or fight past it."
_MONSTERS = " Hostile monsters roam the room; avoid them or fight past them."
_TRAP = " A trap is hidden somewhere on the floor; stepping on it can hurt you."
_TRAPS = " Many traps are hidden on the floor; stepping on them can hurt you."


def _room_tasks() -> list[MiniHackTask]:
    tasks: list[MiniHackTask] = []
    for size in (5, 15):
        many = size == 15
        monster = _MONSTERS if many else _MONSTER
        trap = _TRAPS if many else _TRAP
        variants = [
            ("", _ROOM_GOAL + " You start in the top-left corner; the stairs are in the "
                 "bottom-right corner.", "fixed start and stairs, lit room"),
            ("Random-", _ROOM_GOAL, "random start and stairs, lit room"),
            ("Dark-", _ROOM_GOAL + _DARK, "random start and stairs, unlit room"),
            ("Monster-", _ROOM_GOAL + monster, "lit room with "
             + ("3 monsters" if many else "1 monster")),
            ("Trap-", _ROOM_GOAL + trap, "lit room with " + ("15 traps" if many else "1 trap")),
            ("Ultimate-", _ROOM_GOAL + _DARK + monster + trap,
             "unlit room with " + ("3 monsters and 15 traps" if many else "1 monster and 1 trap")),
        ]
        for prefix, goal, what in variants:
            paper = " (the paper's task)" if prefix == "Ultimate-" and size == 5 else ""
            tasks.append(MiniHackTask(f"MiniHack-Room-{prefix}{size}x{size}-v0", goal,
                                      description=f"MiniHack Room {size}x{size}: {what}{paper}"))
    return tasks


_CORRIDOR_GOAL = ("Find the staircase down (>). It is in another room; the rooms are joined by "
                  "corridors (#) that start at doorways.")
_MAZE_GOAL = "Find your way through the maze to the staircase down (>)."
_MAZE_MAPPED_GOAL = ("Find your way through the maze to the staircase down (>); the maze's layout "
                     "is already on your map.")

# A level of our own, written in MiniHack's des-file language: a lit 3x3 room, the agent in the
# centre, the stairs on one of the 8 squares around it (SHUFFLE picks which, per level seed). One
# move in the direction the observation names ("staircase down: adjacent southwest") solves it and
# any other move cannot: the reading skill of Room-Random-5x5 with the credit of each decision made
# exact (one action per episode by default). A uniform walker succeeds 1 time in 8. There are 8
# layouts in all, so held-out levels test the mapping from the observation's word to the move,
# not generalisation over layouts (experiments/minihack_reading.py --run ... --env
# crl/MiniHack-Room-Random-5x5-v0 probes whether it carries over to a real room).
_ADJACENT_3X3_ROOM = """MAZE: "mylevel", ' '
FLAGS:hardfloor
INIT_MAP: solidfill,' '
GEOMETRY:center,center
MAP
...
...
...
ENDMAP
REGION:(0,0,3,3),lit,"ordinary"
"""
ADJACENT_3X3_DES = _ADJACENT_3X3_ROOM + """\
$place = { (0,0),(1,0),(2,0),(0,1),(2,1),(0,2),(1,2),(2,2) }
SHUFFLE: $place
BRANCH:(1,1,1,1),(0,0,0,0)
STAIR:$place[0],down
"""


def adjacent_3x3_balanced_des(level_seed: int) -> str:
    """The Adjacent-3x3 level with the stairs in direction ``DIRECTIONS[level_seed % 8]`` of the
    centre: any 8 consecutive level seeds cover the 8 directions once each. A training step whose
    groups play consecutive seeds (the runner's ``step * groups + group``; 8 or 16 groups) then
    rewards every direction equally often, so a policy that ignores the observation gets no net
    push towards one move from the levels drawn (with NetHack's own shuffle, 8 groups repeat
    some directions and miss others, which can push a blind policy towards the repeated ones);
    the 64 held-out levels have each direction 8 times, so the best single move scores 1/8."""
    from crl_bench.envs.minihack.language import DIRECTION_STEPS

    dx, dy = DIRECTION_STEPS[level_seed % len(DIRECTION_STEPS)]
    return (_ADJACENT_3X3_ROOM + "BRANCH:(1,1,1,1),(0,0,0,0)\n"
            + f"STAIR:({1 + dx},{1 + dy}),down\n")


# A level of our own where the knowledge the actor needs is not in its observation: the stairs
# are hidden under one of eight identical rocks, and which one is fixed by the room's landmark
# (crl_bench.envs.minihack.landmark). The goal says that such a rule exists, not what it is.
_LANDMARK_GOAL = (_ROOM_GOAL + " You start in the centre; the stairs are hidden under one of the "
                  "eight rocks next to you. Which rock hides them depends only on the room's "
                  "landmark (the same landmark always means the same place). You have one "
                  "action.")

_ADJACENT_GOAL = (_ROOM_GOAL + " You start in the centre; the stairs are next to you. You have "
                  "one action.")

# Longer tasks get longer caps: an optimal Corridor-R3 path alone is often over 30 moves. The
# values keep the tasks solvable by a competent text agent without making episodes costly.
TASKS: tuple[MiniHackTask, ...] = (
    *_room_tasks(),
    MiniHackTask("MiniHack-Room-Adjacent-3x3-v0", _ADJACENT_GOAL, 1,
                 "ours: lit 3x3 room, stairs next to the centre start, 1 action (reading only)",
                 des_file=ADJACENT_3X3_DES),
    MiniHackTask("MiniHack-Room-Adjacent-3x3-Balanced-v0", _ADJACENT_GOAL, 1,
                 "ours: Adjacent-3x3 with the stairs' direction set by the level seed (seed mod 8)",
                 des_file=adjacent_3x3_balanced_des(0), des_for_seed=adjacent_3x3_balanced_des),
    MiniHackTask("MiniHack-Room-Landmark-5x5-v0", _LANDMARK_GOAL, 1,
                 "ours: lit 5x5 room, stairs hidden under 1 of 8 rocks, the landmark's kind says "
                 "which (1 action; knowledge not in the observation)",
                 des_file=landmark_des(0), des_for_seed=landmark_des),
    MiniHackTask("MiniHack-Corridor-R2-v0", _CORRIDOR_GOAL, 100,
                 "MiniHack Corridor: 2 random rooms joined by corridors"),
    MiniHackTask("MiniHack-Corridor-R3-v0", _CORRIDOR_GOAL, 100,
                 "MiniHack Corridor: 3 random rooms joined by corridors"),
    MiniHackTask("MiniHack-Corridor-R5-v0", _CORRIDOR_GOAL, 200,
                 "MiniHack Corridor: 5 random rooms joined by corridors"),
    MiniHackTask("MiniHack-MazeWalk-9x9-v0", _MAZE_GOAL, 100,
                 "MiniHack MazeWalk: random 9x9 maze, unmapped"),
    MiniHackTask("MiniHack-MazeWalk-Mapped-9x9-v0", _MAZE_MAPPED_GOAL, 50,
                 "MiniHack MazeWalk: random 9x9 maze, layout shown"),
    MiniHackTask("MiniHack-MazeWalk-15x15-v0", _MAZE_GOAL, 200,
                 "MiniHack MazeWalk: random 15x15 maze, unmapped"),
    MiniHackTask("MiniHack-MazeWalk-Mapped-15x15-v0", _MAZE_MAPPED_GOAL, 100,
                 "MiniHack MazeWalk: random 15x15 maze, layout shown"),
)

TASKS_BY_ID: dict[str, MiniHackTask] = {t.minihack_id: t for t in TASKS}

GENERIC_GOAL = "Complete the MiniHack task {task}: usually, reach the staircase down (>)."


def des_for_seed(minihack_id: str) -> Callable[[int], str] | None:
    """``level seed -> des-file`` for a level of ours whose layout the seed sets (else None)."""
    task = TASKS_BY_ID.get(minihack_id)
    return task.des_for_seed if task else None


def des_file_for(minihack_id: str) -> str | None:
    """The des-file of one of our own levels (None for MiniHack's registered tasks)."""
    task = TASKS_BY_ID.get(minihack_id)
    return task.des_file if task else None


def goal_for(minihack_id: str) -> str:
    """The goal sentence of a task (a generic one for MiniHack tasks we do not register)."""
    task = TASKS_BY_ID.get(minihack_id)
    return task.goal if task else GENERIC_GOAL.format(task=minihack_id)
