"""A WebShop oracle: knows the goal's product and options, acts only through text actions.

It searches for the goal product's title, pages through the results until the product's ASIN is
clickable, opens it, clicks each goal option value and buys. Reaching reward 1.0 this way shows
that the search, the pages and the purchase path work end to end; it is also the scripted
"good" policy of the throughput benchmark.
"""

from __future__ import annotations

from typing import Any

from crl_bench.envs.webshop.engine import ITEM, RESULTS, SEARCH


class WebShopOracle:
    """``act(info) -> action`` for a :class:`~crl_bench.envs.webshop.env.WebShopTextEnv`.

    Args:
        env: the env (wrapped or not); the oracle reads the goal from ``env.unwrapped.goal``.
    """

    def __init__(self, env: Any) -> None:
        self.env = env.unwrapped

    def act(self, info: dict[str, Any]) -> str:
        goal = self.env.goal
        session = self.env.session
        clickables = info["clickables"]
        page = info["page"]
        if page == SEARCH:
            return f"search[{self.env.data.by_asin[goal.asin]['Title']}]"
        if page == RESULTS:
            if goal.asin.lower() in clickables:
                return f"click[{goal.asin.lower()}]"
            if session.page_results():
                return "click[next >]"
            return "click[back to search]"  # not found: give up on this query
        if page == ITEM:
            if session.asin != goal.asin:
                return "click[< prev]"
            for name, value in self._wanted_options().items():
                if session.options.get(name) != value and value in clickables:
                    return f"click[{value}]"
            return "click[buy now]"
        return "click[< prev]"  # a sub-page: back to the item

    def _wanted_options(self) -> dict[str, str]:
        goal = self.env.goal
        if isinstance(goal.goal_options, dict):
            return dict(goal.goal_options)
        # human goals list values only: find each value's option name on the product
        product = self.env.data.by_asin[goal.asin]
        wanted: dict[str, str] = {}
        for value in goal.goal_options:
            for name, values in product["options"].items():
                if value in values:
                    wanted[name] = value
        return wanted


def run_oracle_episode(env: Any, task_id: str | int, seed: int = 0) -> dict[str, Any]:
    """Play one episode with the oracle; returns the final info plus ``actions``."""
    oracle = WebShopOracle(env)
    _obs, info = env.reset(seed=seed, options={"task_id": task_id})
    actions: list[str] = []
    while True:
        action = oracle.act(info)
        actions.append(action)
        _obs, _reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return {**info, "actions": actions}
