"""Registration of the swe envs (cheap: nothing heavy is imported here)."""

from __future__ import annotations

from typing import Any

SYSTEM_PROMPT = (
    'You are a software engineer working in a code repository through a shell. Each turn you '
    'run one command and read its output. Find and fix the bug described in the issue so that '
    'the tests pass, then submit.')
"""The actor's system prompt for this family (``crl_bench.llm.prompting``)."""


def retrieval_query(goal: str, observation: str, raw_obs: Any = None) -> str:
    """The retrieval query of the official SWE env manager (``traj_env_manager_swe.py:150-164``):
    the problem statement alone (our SWE env's goal)."""
    return str(goal)


def register() -> None:
    """Register this family's envs with crl-bench and gymnasium."""
    from crl_bench.registry import ENVS, register_env

    if ENVS.has_builtin("crl/SWE-v0"):
        return
    register_env(
        "crl/SWE-v0", "crl_bench.envs.swe.env:SWETextEnv", family="swe",
        system_prompt=SYSTEM_PROMPT, retrieval_query=retrieval_query,
        kwargs={"task_set": "mini"},
        description="Repository repair with a sandboxed shell and editor, graded by SWE-bench "
                    "FAIL_TO_PASS/PASS_TO_PASS tests. task_set='mini' (handykit, fast; splits "
                    "train/test) or 'lite-dev-local' (11 SWE-bench Lite dev instances, offline).",
        extra="swe")
