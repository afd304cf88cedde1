"""Issue 17: ``envs/webshop/reward.py`` equals WebShop's own ``get_reward``.

The expected values are worked out by hand from WebShop's published code
(princeton-nlp/WebShop, ``web_agent_site/engine/goal.py``: ``get_reward``,
``get_option_reward``, ``get_attribute_reward``, ``get_type_reward``; ``normalize.py``:
``normalize_color``). Fuzzy scores are ``thefuzz.fuzz.token_set_ratio`` on lower-cased,
punctuation-stripped text; with Indel similarity ratio(a, b) = 2 * LCS / (len(a) + len(b)), and
100 when one side's tokens are a subset of the other's.

The last test replays the parity fixture (``tests/fixtures/webshop_reward_parity.json``): cases
drawn from the 1k catalogue whose expected values come from running WebShop's own ``get_reward``
(``experiments/webshop_reward_parity.py``), not from this project's code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _data_paths import shared_data_dir
from crl_bench.envs.webshop.reward import (
    count_attribute_matches,
    count_option_matches,
    fuzzy_ratio,
    normalize_colour,
    normalize_goal_option,
    type_factor,
    webshop_reward,
)

FIXTURE = Path(__file__).parent / "fixtures" / "webshop_reward_parity.json"


def product(**overrides):
    base = {
        "Title": "Organic Cotton Crew T-Shirt",
        "BulletPoints": ["Machine wash cold"],
        "Description": "A plain tee.",
        "Attributes": ["machine wash", "short sleeve"],
        "query": "men's t-shirts",
        "product_category": "Clothing › Men › Shirts › T-Shirts",
        "name": "P",
    }
    base.update(overrides)
    return base


def goal(**overrides):
    base = {
        "attributes": ["machine wash", "short sleeve"],
        "goal_options": {"color": "black"},
        "price_upper": 40.0,
        "query": "men's t-shirts",
        "product_category": "Clothing › Men › Shirts › T-Shirts",
        "name": "G",
    }
    base.update(overrides)
    return base


def nouns_of(table):
    return lambda title: table[title]


SAME = nouns_of({"P": ["shirt"], "G": ["shirt"]})


# -- cause 1: options have no fallback to the product's text ----------------------------------

def test_cause1_option_in_title_but_not_chosen_does_not_count():
    # goal option ("style", "v-neck"); chosen "crew", which the title contains.
    # get_option_reward: token_set_ratio("crew", "('style', 'v-neck')") -> "crew" vs
    # "style v neck": no common token, ratio <= 2*3/(4+12) = 37 < 85 -> 0 options.
    # get_reward = (2 attributes + 0 options + 1 price) / (2 + 1 + 1) * r_type 1 = 0.75
    # (the project used to count the title hit: 1.0)
    r = webshop_reward(product(), goal(goal_options={"style": "v-neck"}), 25.0,
                       {"style": "crew"}, nouns=SAME)
    assert r.options_matched == 0
    assert r.reward == pytest.approx(3 / 4)


def test_cause1_attributes_do_fall_back_to_the_text():
    # get_attribute_reward: "organic" is no product attribute (ratio vs "machine wash" and
    # "short sleeve" < 85) but is in the lower-cased title -> counts.
    assert count_attribute_matches(product(), ["organic"]) == 1
    assert count_attribute_matches(product(), ["bamboo"]) == 0


# -- cause 2: goal options are (name, value) pairs -----------------------------------------------

def test_cause2_exact_purchase_of_a_value_containing_a_colour_word_misses():
    # goal {"color": "navyblue"} bought exactly as asked.
    # normalize_color("navyblue") -> "blue" ("blue" is listed before "navy");
    # normalize_color(("color", "navyblue")) -> unchanged (neither item *equals* a colour word).
    # token_set_ratio("blue", "color navyblue"): no common token,
    # ratio("blue", "color navyblue") = 2*4/(4+14) = 44 < 85 -> 0 options.
    # get_reward = (2 + 0 + 1) / (2 + 1 + 1) * 1 = 0.75 (the project normalised both: 1.0)
    assert normalize_colour("navyblue") == "blue"
    assert normalize_goal_option(("color", "navyblue")) == ("color", "navyblue")
    r = webshop_reward(product(), goal(goal_options={"color": "navyblue"}), 25.0,
                       {"color": "navyblue"}, nouns=SAME)
    assert r.reward == pytest.approx(0.75)


def test_cause2_pair_with_an_exact_colour_word_is_normalised():
    # ("color", "black") contains the colour word "black" as an item -> "black";
    # chosen "black forest" -> "black": ratio 100 -> the option counts.
    assert normalize_goal_option(("color", "black")) == "black"
    assert count_option_matches({"color": "black"}, {"color": "black forest"}) == 1


def test_cause2_the_option_name_is_a_token_of_the_comparison():
    # chosen "vanilla beans" vs goal ("flavor name", "vanilla bean") -> tokens
    # {vanilla, beans} vs {flavor, name, vanilla, bean}: intersection "vanilla" (7 chars);
    # ratio("vanilla", "vanilla beans") = 2*7/(7+13) = 70,
    # ratio("vanilla", "vanilla bean flavor name") = 14/31 = 45,
    # ratio("vanilla beans", "vanilla bean flavor name") = 2*12/(13+24) = 65 -> 70, no match.
    # On the bare values it would be ratio("vanilla bean", "vanilla beans") = 24/25 = 96.
    assert fuzzy_ratio("vanilla beans", "('flavor name', 'vanilla bean')") == 70
    assert count_option_matches({"flavor name": "vanilla bean"}, {"flavor": "vanilla beans"}) == 0
    assert count_option_matches(["vanilla bean"], {"flavor": "vanilla beans"}) == 1  # human goal
    r = webshop_reward(product(), goal(goal_options={"flavor name": "vanilla bean"}), 25.0,
                       {"flavor name": "vanilla beans"}, nouns=SAME)
    assert r.reward == pytest.approx(3 / 4)


# -- cause 3: every option, size included, is matched fuzzily ------------------------------------

def test_cause3_chosen_large_counts_for_goal_x_large():
    # chosen "large" vs ("size", "x-large") -> "size x large": {large} is a subset -> 100 > 85.
    # get_reward = (2 + 1 + 1) / (2 + 1 + 1) = 1.0 (the project matched size exactly: 0.75)
    r = webshop_reward(product(), goal(goal_options={"size": "x-large"}), 25.0,
                       {"size": "large"}, nouns=SAME)
    assert r.options_matched == 1
    assert r.reward == 1.0


def test_cause3_chosen_x_large_misses_goal_large():
    # chosen "x-large" -> "x large" vs "size large": intersection "large";
    # ratio("large", "large x") = 10/12 = 83, ratio("large", "large size") = 10/15 = 67,
    # ratio("large x", "large size") = 2*6/17 = 71 -> 83, not > 85.
    # get_reward = (2 + 0 + 1) / 4 = 0.75
    r = webshop_reward(product(), goal(goal_options={"size": "large"}), 25.0,
                       {"size": "x-large"}, nouns=SAME)
    assert r.reward == pytest.approx(0.75)


# -- cause 4: title_score divides by the list of goal nouns --------------------------------------

def test_cause4_title_score_counts_repeated_goal_nouns():
    # goal nouns ["shirt", "shirt", "cotton", "tee", "top"], purchased ["shirt"]:
    # title_score = |{shirt}| / 5 = 0.2 (a set would give 1/4 = 0.25 > 0.2).
    # No query or category match and 0.2 is not > 0.2 -> r_type 0.5.
    # get_reward = (2 + 1 + 1) / (2 + 1 + 1) * 0.5 = 0.5
    nouns = nouns_of({"P": ["shirt"], "G": ["shirt", "shirt", "cotton", "tee", "top"]})
    r = webshop_reward(product(query="other", product_category="Home › Kitchen"), goal(), 25.0,
                       {"color": "black"}, nouns=nouns)
    assert r.title_score == pytest.approx(0.2)
    assert r.r_type == 0.5
    assert r.reward == pytest.approx(0.5)


# -- type factor wiring --------------------------------------------------------------------------

FIFTH = nouns_of({"P": ["a"], "G": ["a", "b", "c", "d", "e"]})  # title_score 0.2 exactly


@pytest.mark.parametrize("query, expected", [("men's t-shirts", 1.0), ("women's", 0.5)])
def test_type_query_match_alone_keeps_the_full_factor(query, expected):
    # category shares one level only; title_score 0.2 -> only the query decides
    r = webshop_reward(product(query=query, product_category="Clothing › Other"), goal(), 25.0,
                       {"color": "black"}, nouns=FIFTH)
    assert (r.query_match, r.category_match) == (expected == 1.0, False)
    assert r.r_type == expected
    assert r.reward == pytest.approx(expected)


@pytest.mark.parametrize("category, matched", [
    ("Clothing › Men", True),                  # two levels shared: >= 2
    ("Clothing › Women", False),               # one level
    ("Men › Clothing › Toys", True),           # order ignored
    ("  Clothing ›Men  ", True),               # levels are stripped
])
def test_type_category_needs_two_shared_levels(category, matched):
    r = webshop_reward(product(query="x", product_category=category), goal(), 25.0,
                       {"color": "black"}, nouns=FIFTH)
    assert r.category_match is matched
    assert r.r_type == (1.0 if matched else 0.5)


@pytest.mark.parametrize("n_other, expected_score, expected_type", [
    (9, 0.1, 1.0),         # 1/10 = 0.1 is not < 0.1
    (10, 1 / 11, 0.1),     # 1/11 < 0.1 overrides the query match
])
def test_type_title_score_point_one_boundary(n_other, expected_score, expected_type):
    m = type_factor(query_match=True, category_match=True, purchased_nouns=["a"],
                    desired_nouns=["a"] + [f"n{i}" for i in range(n_other)])
    assert m.title_score == pytest.approx(expected_score)
    assert m.r_type == expected_type


def test_type_title_score_zero_overrides_everything():
    m = type_factor(query_match=True, category_match=True, purchased_nouns=["b"],
                    desired_nouns=["a"])
    assert (m.title_score, m.r_type) == (0.0, 0.0)
    r = webshop_reward(product(), goal(), 25.0, {"color": "black"},
                       nouns=nouns_of({"P": ["b"], "G": ["a"]}))
    assert r.reward == 0.0


def test_type_nouns_compared_lower_cased():
    m = type_factor(query_match=False, category_match=False, purchased_nouns=["Shirt"],
                    desired_nouns=["SHIRT"])
    assert m.title_score == 1.0 and m.r_type == 1.0


# -- fuzzy threshold: strictly above 85 ----------------------------------------------------------

def test_fuzzy_threshold_86_counts_85_does_not():
    # ratio("abcdefg", "abcdef9") = 2*6/14 = 85.7 -> 86 > 85: match
    # ratio("abcdefghijklm", "abcdefghijk99") = 2*11/26 = 84.6 -> 85, not > 85: no match
    assert fuzzy_ratio("abcdefg", "abcdef9") == 86
    assert fuzzy_ratio("abcdefghijklm", "abcdefghijk99") == 85
    for text in ("abcdef9", "abcdefghijk99", "abcdefg", "abcdefghijklm"):
        assert normalize_colour(text) == text
    assert count_option_matches(["abcdefg"], {"x": "abcdef9"}) == 1
    assert count_option_matches(["abcdefghijklm"], {"x": "abcdefghijk99"}) == 0
    p = product(Attributes=["abcdef9", "abcdefghijk99"])
    assert count_attribute_matches(p, ["abcdefg"]) == 1
    assert count_attribute_matches(p, ["abcdefghijklm"]) == 0


def test_price_bound_inclusive_and_weighted_once():
    # (2 + 1 + 0) / (2 + 1 + 1) = 0.75 just over the bound; at the bound: 1.0
    assert webshop_reward(product(), goal(), 40.0, {"color": "black"}, nouns=SAME).reward == 1.0
    assert webshop_reward(product(), goal(), 40.01, {"color": "black"},
                          nouns=SAME).reward == pytest.approx(0.75)


# -- parity fixture: values from WebShop's own get_reward ----------------------------------------

def test_parity_fixture_matches_webshop_get_reward():
    folder = shared_data_dir("webshop")
    if folder is None:
        pytest.skip("WebShop data not found (set CRL_BENCH_WEBSHOP_DATA)")
    from crl_bench.envs.webshop.data import load_webshop_data

    data = load_webshop_data(folder)
    goals = data.goals("synthetic")
    cases = json.loads(FIXTURE.read_text())["cases"]
    assert len(cases) >= 40
    assert sum(c["expected"] < 1.0 for c in cases) >= 20   # the fixture is not all easy cases
    wrong = []
    for case in cases:
        got = webshop_reward(data.by_asin[case["asin"]], goals[case["goal"]], case["price"],
                             case["options"]).reward
        if got != pytest.approx(case["expected"], abs=1e-9):
            wrong.append((case, got))
    assert not wrong, f"{len(wrong)} of {len(cases)} differ from WebShop, e.g. {wrong[:3]}"
