"""Registration of the webshop envs (cheap: nothing heavy is imported here)."""

from __future__ import annotations

ENTRY_POINT = "crl_bench.envs.webshop.env:WebShopTextEnv"

SYSTEM_PROMPT = (
    'You are a shopping assistant on a web store. Each turn you read the current page and '
    'choose one action: search[keywords] on the search page, or click[element] on a button, '
    'product or option shown on the page. Buy the product that best matches the instruction, '
    'with the requested options, within the price limit.')
"""The actor's system prompt for this family (``crl_bench.llm.prompting``)."""


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
                         description=description, extra="webshop")
