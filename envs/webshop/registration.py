"""Registration of the webshop envs (cheap: nothing heavy is imported here)."""

from __future__ import annotations

from typing import Any

ENTRY_POINT = "crl_bench.envs.webshop.env:WebShopTextEnv"

SYSTEM_PROMPT = (
    'You are a shopping assistant on a web store. Each turn you read the current page and '
    'choose one action: search[keywords] on the search page, or click[element] on a button, '
    'product or option shown on the page. Buy the product that best matches the instruction, '
    'with the requested options, within the price limit.')
"""The actor's system prompt for this family (``crl_bench.llm.prompting``)."""


def retrieval_query(goal: str, observation: str, raw_obs: Any = None) -> str:
    """The retrieval query of the launched WebShop env manager (``traj_env_manager_shop.py:40``
    keeps ``BaseEnvManager``'s, ``base_env_manager.py:49-57``): ``"goal: {goal}, observation:
    {obs}"``."""
    return f"goal: {goal}, observation: {observation}" if goal else str(observation)


def register() -> None:
    """Register this family's envs with crl-bench and gymnasium."""
    from crl_bench.registry import ENVS, register_env

    specs = [
        ("crl/WebShop-v0", {},
         "WebShop, 1k products, WebShop's synthetic goals (split= train/dev/test/all), 15 steps"),
        ("crl/WebShop-Human-v0", {"goal_source": "human", "split": "all"},
         "WebShop, 1k products, the human-written goals for those products, 15 steps"),
    ]
    for env_id, kwargs, description in specs:
        if not ENVS.has_builtin(env_id):  # registering twice (re-import) is not an error
            register_env(env_id, ENTRY_POINT, family="webshop", system_prompt=SYSTEM_PROMPT, kwargs=kwargs,
                         retrieval_query=retrieval_query,
                         description=description, extra="webshop")
