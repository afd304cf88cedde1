"""WebShop's reward, component by component, against values worked out by hand.

These tests need no data folder: products and goals are small dicts written here.
"""

from __future__ import annotations

import pytest

from crl_bench.envs.webshop.reward import (
    category_levels,
    count_attribute_matches,
    count_option_matches,
    normalize_colour,
    price_within_bound,
    title_nouns,
    type_factor,
    webshop_reward,
)


def product(**overrides):
    base = {
        "Title": "Organic Cotton Crew T-Shirt",
        "BulletPoints": ["Machine wash cold", "Made of soft fabric"],
        "Description": "A plain tee for every day.",
        "Attributes": ["machine wash", "short sleeve"],
        "query": "men's t-shirts",
        "product_category": "Clothing › Men › Shirts › T-Shirts",
        "name": "Organic Cotton Crew T-Shirt",
    }
    base.update(overrides)
    return base


def goal(**overrides):
    base = {
        "attributes": ["machine wash", "short sleeve"],
        "goal_options": {"color": "black", "size": "large"},
        "price_upper": 40.0,
        "query": "men's t-shirts",
        "product_category": "Clothing › Men › Shirts › T-Shirts",
        "name": "Organic Cotton Crew T-Shirt",
    }
    base.update(overrides)
    return base


def fixed_nouns(table):
    return lambda title: table[title]


# -- colour normalisation --------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    ("", ""),
    ("black forest", "black"),
    ("violet lavender", "lavender"),   # "lavender" comes before "violet" in WebShop's list
    ("steelivy fuchsia", "fuchsia"),   # "fuchsia" comes before "ivy" and "steel"
    ("123alabaster", "alabaster"),     # substring match, not word match
    ("webshop", "webshop"),            # no colour word: unchanged
    ("navy | white", "navy"),
])
def test_normalize_colour_takes_the_first_listed_colour_word(value, expected):
    assert normalize_colour(value) == expected


# -- attributes ----------------------------------------------------------------------------------

def test_attribute_matches_fuzzily_against_product_attributes():
    # token-set ratio of "wash machine" vs "machine wash" is 100 (> 85): a match
    assert count_attribute_matches(product(), ["wash machine"]) == 1


def test_attribute_found_in_the_title_counts_when_no_attribute_matches():
    # "organic cotton" is not near any product attribute but is in the lower-cased title;
    # "gluten free" is nowhere: 1 of 2.
    assert count_attribute_matches(product(), ["organic cotton", "gluten free"]) == 1


def test_attribute_found_in_bullet_points_or_description_counts():
    p = product(Attributes=[])
    assert count_attribute_matches(p, ["soft fabric"]) == 1         # bullet point
    assert count_attribute_matches(p, ["plain tee"]) == 1           # description
    assert count_attribute_matches(p, ["Organic Cotton"]) == 0      # text match is case-sensitive on the goal side


# -- options -------------------------------------------------------------------------------------

def test_option_colour_is_normalised_before_matching():
    # chosen "jet black forest" -> "black"; goal pair ("color", "black") has the colour word
    # "black" as its value -> "black": ratio 100, a match. Chosen "medium" vs goal
    # ("size", "large") -> "size large": no common token, ratio < 85. 1 of the 2 goal options.
    chosen = {"color": "jet black forest", "size": "medium"}
    assert count_option_matches({"color": "black", "size": "large"}, chosen) == 1


def test_each_goal_option_counts_at_most_once():
    # two chosen values both match the one goal option: it still counts once
    assert count_option_matches(["black"], {"color": "black", "trim": "black"}) == 1


def test_option_found_only_in_product_text_does_not_count():
    # WebShop's get_option_reward never looks at the product's text (only attributes do)
    assert count_option_matches({"style": "v-neck"}, {"style": "crew"}) == 0


# -- price ---------------------------------------------------------------------------------------

def test_price_within_bound():
    assert price_within_bound(39.99, 40.0)
    assert price_within_bound(40.0, 40.0)
    assert not price_within_bound(40.01, 40.0)


# -- product type ------------------------------------------------------------------------------

def test_category_levels_split_on_the_chevron():
    assert category_levels("Beauty › Hair Care ›  Shampoo") == {"Beauty", "Hair Care", "Shampoo"}


def test_type_factor_full_when_query_matches_and_titles_share_nouns():
    m = type_factor(query_match=True, category_match=False, purchased_nouns=["shirt", "cotton"],
                    desired_nouns=["shirt", "tee"])
    assert (m.r_type, m.title_score) == (1.0, 0.5)


def test_type_factor_half_when_nothing_matches_but_title_score_is_exactly_point_two():
    # 1 of 5 nouns shared: title_score 0.2 is not > 0.2, no query or category match -> 0.5
    m = type_factor(query_match=False, category_match=False, purchased_nouns=["a"],
                    desired_nouns=["a", "b", "c", "d", "e"])
    assert (m.r_type, m.title_score) == (0.5, 0.2)


def test_type_factor_title_score_above_point_two_is_a_match_on_its_own():
    m = type_factor(query_match=False, category_match=False, purchased_nouns=["a", "b"],
                    desired_nouns=["a", "b", "c", "d", "e"])
    assert m.r_type == 1.0  # 0.4 > 0.2


def test_type_factor_point_one_when_titles_barely_overlap_even_if_query_matches():
    m = type_factor(query_match=True, category_match=True, purchased_nouns=["a"],
                    desired_nouns=[str(i) for i in range(11)] + ["a"])
    assert m.title_score == pytest.approx(1 / 12)
    assert m.r_type == 0.1


def test_type_factor_zero_when_titles_share_no_noun_even_if_category_matches():
    m = type_factor(query_match=False, category_match=True, purchased_nouns=["sofa"],
                    desired_nouns=["shirt"])
    assert m.r_type == 0.0


def test_type_factor_goal_without_nouns_scores_title_point_two():
    assert type_factor(query_match=True, category_match=False, purchased_nouns=["x"],
                       desired_nouns=[]).r_type == 1.0
    assert type_factor(query_match=False, category_match=False, purchased_nouns=["x"],
                       desired_nouns=[]).r_type == 0.5


# -- the whole reward -------------------------------------------------------------------------

SAME_NOUNS = fixed_nouns({"Organic Cotton Crew T-Shirt": ["cotton", "crew", "t", "shirt"]})


def test_reward_is_one_when_everything_matches():
    r = webshop_reward(product(), goal(), 25.0, {"color": "black", "size": "large"},
                       nouns=SAME_NOUNS)
    # (2 attributes + 2 options + price) / (2 + 2 + 1) * 1
    assert r.reward == 1.0
    assert (r.attributes_matched, r.options_matched, r.price_ok, r.r_type) == (2, 2, True, 1.0)


def test_reward_price_over_the_bound():
    r = webshop_reward(product(), goal(), 40.5, {"color": "black", "size": "large"},
                       nouns=SAME_NOUNS)
    assert r.reward == pytest.approx(4 / 5)
    assert not r.price_ok


def test_reward_missing_option_and_half_type_factor():
    # different query and category, 1 of 5 goal nouns shared -> r_type 0.5;
    # only "black" chosen -> options 1 of 2; (2 + 1 + 1) / 5 * 0.5 = 0.4
    nouns = fixed_nouns({"Organic Cotton Crew T-Shirt": ["shirt"],
                         "Goal Title": ["shirt", "b", "c", "d", "e"]})
    g = goal(query="other", product_category="Home › Kitchen", name="Goal Title")
    r = webshop_reward(product(), g, 25.0, {"color": "black"}, nouns=nouns)
    assert r.r_type == 0.5
    assert r.reward == pytest.approx(0.4)


def test_reward_never_exceeds_one_when_more_options_are_chosen_than_the_goal_lists():
    # human goals list option values only; extra chosen options cannot add matches:
    # (2 attributes + 1 option + price) / (2 + 1 + 1) = 1.0
    g = goal(goal_options=["black"])
    r = webshop_reward(product(), g, 25.0, {"color": "black", "style": "crew"}, nouns=SAME_NOUNS)
    assert r.reward == 1.0


def test_title_nouns_uses_spacy_pos_tags():
    nouns = title_nouns("The dog chased a red ball")
    assert "dog" in nouns and "ball" in nouns
    assert "chased" not in nouns and "red" not in nouns
