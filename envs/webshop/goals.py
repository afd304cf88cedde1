"""WebShop's goals (shopping instructions) and its train/dev/test split by goal index.

How WebShop makes them (``web_agent_site/engine/goal.py`` and ``engine.py``), as its baseline
scripts run it - ``random.seed(233)`` is called before the server is built:

1. **Prices.** Each product gets one price: its single listed price, or, for a "$a - $b" range, a
   uniform draw in [a, b] (one draw per ranged product, in catalogue order).
2. **Price bounds.** For each goal-bearing product (synthetic) or each human instruction (human),
   take the first four multiples of $10 above the price, draw two of them and keep the larger
   as the bound ("..., and price lower than 40.00 dollars"). A product priced $980 or more gets
   no bound (1,000,000) and no price text.
3. **Synthetic goals** (``items_ins_v2``): a product with an ``instruction`` yields one goal per
   combination of its option values (option names sorted), worded
   ``"<instruction> with color: black, and size: large, and price lower than 40.00 dollars"``.
   **Human goals** (``items_human_ins``): one goal per human instruction that names at least one
   attribute, with the instruction's own option values.
4. The goal list is shuffled with a fresh ``random.seed(233)``.

The same stream of draws is reproduced here with ``random.Random(233)``, so goal *i* is goal *i*
of WebShop as its baseline scripts build it (same text, same bound, same product). Note that
WebShop's server itself does not seed before drawing prices and bounds: harnesses that build it
without ``random.seed(233)`` get the same goal order and texts (the shuffle is seeded) but other
price bounds. Goals recorded from such runs agree with ours word for word except, for some
goals, the "price lower than" figure (e.g. goal 490 agrees entirely; goal 71 reads 40.00 there
and 30.00 here).

**Splits** (WebShop's ``baseline_models/env.py``): goals ``[0, 500)`` are ``test``, ``[500, 1500)``
are ``dev`` (WebShop calls it "eval"), ``[1500, end)`` are ``train``; ``all`` is every goal. On
the 1,000-product catalogue there are 6,910 synthetic goals (5,410 train) and 13 human goals
(all of them in ``test``).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

GOAL_SEED = 233
PRICE_STEPS: tuple[float, ...] = tuple(10.0 * i for i in range(1, 100))  # $10 ... $990
NO_PRICE_BOUND = 1_000_000.0
GOAL_SOURCES: tuple[str, ...] = ("synthetic", "human")

SPLITS: dict[str, tuple[int, int | None]] = {
    "test": (0, 500),
    "dev": (500, 1500),
    "eval": (500, 1500),   # WebShop's own name for dev
    "train": (1500, None),
    "all": (0, None),
}


@dataclass(frozen=True)
class WebShopGoal:
    """One shopping instruction and what the reward compares the purchase against.

    Mapping-style access (``goal["attributes"]``) mirrors WebShop's goal dicts so that
    :func:`crl_bench.envs.webshop.reward.webshop_reward` takes either.
    """

    index: int                     # position in the shuffled goal list (the task id)
    source: str                    # "synthetic" or "human"
    asin: str                      # the product the instruction was written for
    instruction_text: str
    attributes: tuple[str, ...]
    goal_options: Mapping[str, str] | tuple[str, ...]  # synthetic: name -> value; human: values
    price_upper: float             # dollars
    query: str
    name: str                      # the product's title (used by the type reward)
    category: str
    product_category: str
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    @property
    def option_values(self) -> list[str]:
        opts = self.goal_options
        return list(opts.values()) if isinstance(opts, Mapping) else list(opts)


def sample_prices(products: Sequence[Mapping[str, Any]], rng: random.Random) -> dict[str, float]:
    """ASIN -> price in dollars: the listed price, or a uniform draw inside a listed range."""
    prices: dict[str, float] = {}
    for product in products:
        pricing = product["pricing"]
        if not pricing:
            prices[product["asin"]] = 100.0
        elif len(pricing) == 1:
            prices[product["asin"]] = pricing[0]
        else:
            prices[product["asin"]] = rng.uniform(*pricing[:2])
    return prices


def draw_price_bound(price: float, rng: random.Random) -> tuple[float, str]:
    """(bound, text appended to the instruction) for a product costing ``price`` dollars."""
    steps_above = [p for p in PRICE_STEPS if p > price][:4]
    if len(steps_above) < 2:
        return NO_PRICE_BOUND, ""
    _lower, upper = sorted(rng.sample(steps_above, 2))
    return upper, f", and price lower than {upper:.2f} dollars"


def synthetic_goals(products: Sequence[Mapping[str, Any]], instructions: Mapping[str, Any],
                    prices: Mapping[str, float], rng: random.Random) -> list[WebShopGoal]:
    """WebShop's synthetic goals, in generation order (before the shuffle; index -1)."""
    goals: list[WebShopGoal] = []
    for product in products:
        entry = instructions.get(product["asin"], {})
        text = entry.get("instruction")
        if text is None:
            continue
        attributes = tuple(entry.get("instruction_attributes") or ())
        if not attributes:
            raise ValueError(f"items_ins entry {product['asin']} has an instruction but no "
                             "instruction_attributes; the attribute file is damaged.")
        upper, price_text = draw_price_bound(prices[product["asin"]], rng)
        names = sorted(product["options"])
        for combination in itertools.product(*(product["options"][n] for n in names)):
            chosen = dict(zip(names, combination))
            option_text = ", and ".join(f"{k}: {v}" for k, v in chosen.items())
            option_text = f" with {option_text}" if option_text else ""
            goals.append(WebShopGoal(
                index=-1, source="synthetic", asin=product["asin"],
                instruction_text=f"{text}{option_text}{price_text}", attributes=attributes,
                goal_options=chosen, price_upper=upper, query=product["query"],
                name=product["Title"], category=product["category"],
                product_category=product["product_category"]))
    return goals


def human_goals(products: Sequence[Mapping[str, Any]], human_instructions: Mapping[str, Any],
                prices: Mapping[str, float], rng: random.Random) -> list[WebShopGoal]:
    """WebShop's human goals, in generation order (before the shuffle; index -1)."""
    goals: list[WebShopGoal] = []
    for product in products:
        for written in human_instructions.get(product["asin"], ()):
            attributes = tuple(written["instruction_attributes"])
            if not attributes:  # WebShop skips instructions that name no attribute
                continue
            upper, price_text = draw_price_bound(prices[product["asin"]], rng)
            goals.append(WebShopGoal(
                index=-1, source="human", asin=product["asin"],
                instruction_text=written["instruction"].strip(".") + price_text,
                attributes=attributes, goal_options=tuple(written["instruction_options"]),
                price_upper=upper, query=product["query"], name=product["name"],
                category=product["category"], product_category=product["product_category"]))
    return goals


def build_goals(products: Sequence[Mapping[str, Any]], *, source: str,
                instructions: Mapping[str, Any] | None = None,
                human_instructions: Mapping[str, Any] | None = None,
                ) -> tuple[list[WebShopGoal], dict[str, float]]:
    """WebShop's shuffled goal list for ``source`` and the product prices it was built with.

    Args:
        products: the catalogue, in WebShop's order.
        source: "synthetic" (needs ``instructions``, the items_ins_v2 dict) or "human" (needs
            ``human_instructions``, the items_human_ins dict).
    """
    if source not in GOAL_SOURCES:
        raise ValueError(f"goal source {source!r} is unknown; use one of {GOAL_SOURCES}.")
    rng = random.Random(GOAL_SEED)
    prices = sample_prices(products, rng)
    if source == "synthetic":
        if instructions is None:
            raise ValueError("synthetic goals need the items_ins_v2 instructions")
        goals = synthetic_goals(products, instructions, prices, rng)
    else:
        if human_instructions is None:
            raise ValueError("human goals need the items_human_ins instructions")
        goals = human_goals(products, human_instructions, prices, rng)
    random.Random(GOAL_SEED).shuffle(goals)
    numbered = [dataclasses.replace(g, index=i) for i, g in enumerate(goals)]
    return numbered, prices


def split_indices(split: str, n_goals: int) -> range:
    """Goal indices of ``split`` ("train", "dev"/"eval", "test", "all") among ``n_goals``."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is unknown; use one of {sorted(SPLITS)}.")
    start, stop = SPLITS[split]
    return range(min(start, n_goals), n_goals if stop is None else min(stop, n_goals))
