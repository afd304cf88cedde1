"""The experiment matrices behind the paper's tables (agents x task mixes), and their labels.

``single``: Baseline vs Complementary RL on each env family alone.
``multi``: the four paper agents on ``3mix``, plus Baseline and Comp. RL on ``6mix`` (task
scaling compares the two mixes).
``ablation``: Comp. RL and each one-mechanism-off variant on ``3mix``.
``all``: the union (runs shared between suites are run once).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PlannedRun", "SUITES", "PAPER_AGENTS", "ABLATIONS", "VARIANTS",
           "plan_suite", "run_dir_name", "agent_label"]

from crl_bench.agent import agent_label
from crl_bench.baselines import ABLATIONS, PAPER_AGENTS  # the one table of agents
from crl_bench.envs import FAMILIES  # the one list of env families

# Which evaluation variants (with_experience flag) make a table row for each agent. The baseline
# never sees experience; Exp. Only is a frozen actor, so its row is the one with experience.
# Agents not listed here get a row per variant found in their eval records.
VARIANTS: dict[str, tuple[bool, ...]] = {
    "grpo": (False,),
    "static_exp": (True, False),
    "exp_only": (True,),
    "comp_rl": (True, False),
    **{name: (True, False) for name in ABLATIONS},
}

SINGLE_TASK_MIXES: tuple[str, ...] = FAMILIES
"""The single-family task mixes (each built-in family's mix is named by the family)."""


@dataclass(frozen=True)
class PlannedRun:
    """One cell of a suite's matrix."""

    agent: str
    tasks: str
    seed: int

    @property
    def dir_name(self) -> str:
        return run_dir_name(self.tasks, self.agent, self.seed)


def run_dir_name(tasks: str, agent: str, seed: int) -> str:
    """Deterministic directory name, so a rerun of ``reproduce`` finds (and skips) its runs."""
    safe_tasks = tasks.replace("/", "-").replace(",", "+")
    return f"{safe_tasks}__{agent}__seed{seed}"


SUITES: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    # (tasks, agents) pairs
    "single": tuple((mix, ("grpo", "comp_rl")) for mix in SINGLE_TASK_MIXES),
    "multi": (("3mix", PAPER_AGENTS), ("6mix", ("grpo", "comp_rl"))),
    "ablation": (("3mix", ("comp_rl", *ABLATIONS)),),
}


def plan_suite(suite: str, seeds: int, tasks_filter: list[str] | None = None) -> list[PlannedRun]:
    """The runs of ``suite`` ("single", "multi", "ablation", "all") for seeds ``0..seeds-1``.

    Args:
        tasks_filter: keep only these task mixes (e.g. the env families whose data is here).

    Raises:
        ValueError: unknown suite, ``seeds < 1``, or a filter that keeps nothing.
    """
    names = list(SUITES) if suite == "all" else [suite]
    for name in names:
        if name not in SUITES:
            raise ValueError(f"Unknown suite {suite!r}. Available: {', '.join(SUITES)}, all.")
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    planned: dict[PlannedRun, None] = {}
    for name in names:
        for tasks, agents in SUITES[name]:
            if tasks_filter is not None and tasks not in tasks_filter:
                continue
            for agent in agents:
                for seed in range(seeds):
                    planned[PlannedRun(agent, tasks, seed)] = None
    if not planned:
        known = sorted({t for n in names for t, _ in SUITES[n]})
        raise ValueError(f"--tasks {','.join(tasks_filter or [])} keeps no run of suite "
                         f"{suite!r}; its task mixes are: {', '.join(known)}")
    return list(planned)
