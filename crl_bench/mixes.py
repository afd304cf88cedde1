"""Task mixes: which envs a run trains and evaluates on.

A mix is a list of :class:`MixTask`. Each task names a registered env id plus the keyword
arguments used to build it for training and for evaluation (held-out tasks), so that the
evaluation set never overlaps the training set.

``3mix`` is the paper's multi-task set (MiniHack Room, WebShop, ALFWorld). The paper does not
list its six tasks; ``6mix`` is our documented choice: the three of ``3mix`` plus two more
MiniHack navigation tasks and SWE (the ``mini`` task set).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class MixTask:
    """One task of a mix.

    Attributes:
        name: short column name in tables ("MiniHack Room", "WebShop", ...).
        env_id: registered env id.
        family: env family (for availability checks and messages).
        train_kwargs: ``gymnasium.make`` kwargs for training episodes.
        eval_kwargs: ``gymnasium.make`` kwargs for held-out evaluation episodes.
        eval_seed_offset: evaluation episodes use seeds from here on (procedural envs such as
            MiniHack draw a new level per seed, so disjoint seed ranges give held-out levels).
            The block ``[eval_seed_offset, eval_seed_offset + EVAL_SEED_BLOCK)`` is reserved for
            evaluation: no training episode of any run seed uses a seed in it
            (:func:`crl_bench.run.context.train_seed`).
    """

    name: str
    env_id: str
    family: str
    train_kwargs: dict[str, Any] = field(default_factory=dict)
    eval_kwargs: dict[str, Any] = field(default_factory=dict)
    eval_seed_offset: int = 1_000_000


EVAL_SEED_BLOCK = 1_000_000
"""Seeds reserved for evaluation from each task's ``eval_seed_offset`` on (more than any
``eval.episodes_per_task``)."""

MINIHACK_ROOM = MixTask("MiniHack Room", "crl/MiniHack-Room-Ultimate-5x5-v0", "minihack")
WEBSHOP = MixTask("WebShop", "crl/WebShop-v0", "webshop",
                  train_kwargs={"split": "train"}, eval_kwargs={"split": "test"})
ALFWORLD = MixTask("ALFWorld", "crl/ALFWorld-v0", "alfworld",
                   train_kwargs={"split": "train"}, eval_kwargs={"split": "valid_unseen"})
SWE = MixTask("SWE", "crl/SWE-v0", "swe",
              train_kwargs={"task_set": "mini", "split": "train"},
              eval_kwargs={"task_set": "mini", "split": "test"})
MINIHACK_CORRIDOR = MixTask("MiniHack Corridor", "crl/MiniHack-Corridor-R3-v0", "minihack")
MINIHACK_MAZE = MixTask("MiniHack MazeWalk", "crl/MiniHack-MazeWalk-9x9-v0", "minihack")

BUILTIN_MIXES: dict[str, tuple[MixTask, ...]] = {
    "minihack": (MINIHACK_ROOM,),
    "webshop": (WEBSHOP,),
    "alfworld": (ALFWORLD,),
    "swe": (SWE,),
    "3mix": (MINIHACK_ROOM, WEBSHOP, ALFWORLD),
    "6mix": (MINIHACK_ROOM, WEBSHOP, ALFWORLD, MINIHACK_CORRIDOR, MINIHACK_MAZE, SWE),
}


def register_builtin_mixes() -> None:
    from crl_bench.registry import MIXES

    for name, tasks in BUILTIN_MIXES.items():
        if not MIXES.has_builtin(name):
            MIXES.register(name, tasks)


def resolve_tasks(spec: str) -> tuple[MixTask, ...]:
    """Resolve ``--tasks``: a mix name, or comma-separated env ids / mix names.

    Raises:
        KeyError: unknown name (the message lists the known mixes).
    """
    from crl_bench.registry import ENVS, MIXES

    tasks: list[MixTask] = []
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        if part in MIXES:
            tasks.extend(MIXES.get(part))
        elif part.startswith("crl/") and part in ENVS:
            entry = ENVS.get(part)
            tasks.append(MixTask(part.split("/", 1)[1], part, entry.family))
        elif "/" in part:
            ENVS.entry(part)  # an env id: raises with the known ids and the closest one
        else:
            MIXES.entry(part)  # raises with the list of known mixes and the closest one
    if not tasks:
        raise ValueError("--tasks is empty; give a mix name (e.g. 3mix) or env ids.")
    return tuple(tasks)
