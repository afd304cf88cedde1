"""Registration of the MiniHack text envs (cheap: nothing heavy is imported here).

Every task of :data:`crl_bench.envs.minihack.tasks.TASKS` becomes ``crl/<MiniHack id>``, e.g.
``crl/MiniHack-Room-Ultimate-5x5-v0`` (the paper's task), with the entry point
``crl_bench.envs.minihack.env:MiniHackTextEnv`` and the kwargs ``task`` and ``max_steps``.
"""

from __future__ import annotations

ENTRY_POINT = "crl_bench.envs.minihack.env:MiniHackTextEnv"

SYSTEM_PROMPT = (
    'You are an agent playing MiniHack, a small dungeon game built on NetHack. Each turn you '
    'read a text description of what you see around you and choose one action. Reach the goal '
    'in as few actions as possible; walls and closed doors block you.')
"""The actor's system prompt for this family (``crl_bench.llm.prompting``)."""


def register() -> None:
    """Register this family's envs with crl-bench and gymnasium."""
    from crl_bench.envs.minihack.tasks import TASKS
    from crl_bench.registry import ENVS, register_env

    for task in TASKS:
        if ENVS.has_builtin(task.env_id):  # registering twice (re-import) is a no-op
            continue
        register_env(task.env_id, ENTRY_POINT, family="minihack", system_prompt=SYSTEM_PROMPT,
                     kwargs={"task": task.minihack_id, "max_steps": task.max_steps},
                     description=task.description, extra="minihack")
