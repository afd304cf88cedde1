"""Registration of the MiniHack text envs (cheap: nothing heavy is imported here).

Every task of :data:`crl_bench.envs.minihack.tasks.TASKS` becomes ``crl/<MiniHack id>``, e.g.
``crl/MiniHack-Room-Ultimate-5x5-v0`` (the paper's task), with the entry point
``crl_bench.envs.minihack.env:MiniHackTextEnv`` and the kwargs ``task`` and ``max_steps``.
"""

from __future__ import annotations

from typing import Any

ENTRY_POINT = "crl_bench.envs.minihack.env:MiniHackTextEnv"

SYSTEM_PROMPT = (
    'You are an agent playing MiniHack, a small dungeon game built on NetHack. Each turn you '
    'read a text description of what you see around you and choose one action. Reach the goal '
    'in as few actions as possible; walls and closed doors block you.')
"""The actor's system prompt for this family (``crl_bench.llm.prompting``)."""


def retrieval_query(goal: str, observation: str, raw_obs: Any = None) -> str:
    """The retrieval query of the official MiniHack env manager (``traj_env_manager.py:146-148``):
    ``"Observation: {raw_obs}"``, ``raw_obs`` the NLE observation dict the env's reset returned
    (``env/minihack/env.py:325-329``), printed as Python prints it; no goal (every MiniHack level
    shares one goal text). An env that gives no ``raw_obs`` is queried with its text observation."""
    return f"Observation: {raw_obs if raw_obs is not None else observation}"


def register() -> None:
    """Register this family's envs with crl-bench and gymnasium."""
    from crl_bench.envs.minihack.tasks import TASKS
    from crl_bench.registry import ENVS, register_env

    for task in TASKS:
        if ENVS.has_builtin(task.env_id):  # registering twice (re-import) is a no-op
            continue
        register_env(task.env_id, ENTRY_POINT, family="minihack", system_prompt=SYSTEM_PROMPT,
                     retrieval_query=retrieval_query,
                     kwargs={"task": task.minihack_id, "max_steps": task.max_steps},
                     description=task.description, extra="minihack")
