"""WebShop's site as an in-process state machine: pages, clickable elements, purchase.

The pages and their transitions follow WebShop's simulated server
(``web_agent_site/envs/web_agent_text_env.py``) and its HTML templates:

==============  ==========================================================================
page            shows / clickable
==============  ==========================================================================
search          the instruction and a search box (``search[...]``)
results         "Back to Search", "< Prev" (after page 1), "Next >" (always, as in WebShop),
                then 10 products per page: ASIN (clickable), title, price tag
item            "Back to Search", "< Prev" (back to the results), each option name with its
                values (clickable), title, price, rating, "Description", "Features",
                "Reviews" ("Attributes" with ``show_attributes``), "Buy Now"
description...  "Back to Search", "< Prev" (back to the item), the text
done            WebShop's thank-you page: purchased ASIN, chosen options, the score
==============  ==========================================================================

Clickable names are matched lower-cased (``click[Buy Now]`` = ``click[buy now]``); ASINs are
clickable lower-cased, as in WebShop. A search runs afresh (results reset the chosen options and
item); clicking an option value records it under its option name; "Buy Now" scores the purchase
with WebShop's reward.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from crl_bench.envs.webshop.goals import WebShopGoal
from crl_bench.envs.webshop.reward import RewardBreakdown, webshop_reward
from crl_bench.text_env import echo_text

PRODUCTS_PER_PAGE = 10

BACK_TO_SEARCH = "Back to Search"
PREV_PAGE = "< Prev"
NEXT_PAGE = "Next >"
BUY_NOW = "Buy Now"
SUB_PAGES: tuple[str, ...] = ("Description", "Features", "Reviews", "Attributes")

# Page kinds
SEARCH, RESULTS, ITEM, SUB_PAGE, DONE = "search", "results", "item", "sub_page", "done"


@dataclass(frozen=True)
class Segment:
    """One visible text piece of a page; ``role`` says how it can be used."""

    text: str
    role: str = "text"          # "text", "button", "option", "product"
    selected: bool = False      # option chosen / product visited (shown in text_rich mode)


@dataclass(frozen=True)
class Clickable:
    role: str                   # "button", "option", "product"
    target: str                 # button label, option name, or ASIN
    value: str = ""             # the option value for options


@dataclass
class Outcome:
    """What one action did."""

    valid: bool
    message: str = ""           # why an action was not executed
    reward: float = 0.0
    done: bool = False
    breakdown: RewardBreakdown | None = None


@dataclass
class ShopSession:
    """One shopper's visit: the page they are on and what they chose.

    Args:
        goal: the instruction this session shops for.
        by_asin: the catalogue, ASIN -> product.
        prices: ASIN -> price in dollars (what the reward compares with the bound).
        search: query -> ASINs, best first (WebShop returns up to 50).
        show_attributes: offer the "Attributes" sub-page on item pages (WebShop's show_attrs).
        nouns: title -> nouns for the type reward (spaCy by default).
    """

    goal: WebShopGoal
    by_asin: Mapping[str, Mapping[str, Any]]
    prices: Mapping[str, float]
    search: Callable[[str], Sequence[str]]
    show_attributes: bool = False
    nouns: Callable[[str], Sequence[str]] | None = None
    page: str = SEARCH
    keywords: str = ""
    results: list[str] = field(default_factory=list)
    page_number: int = 1
    asin: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    visited: set[str] = field(default_factory=set)
    sub_page: str = ""
    reward: float = 0.0
    breakdown: RewardBreakdown | None = None
    # The current page's segments and clickables, computed once per state change (every state
    # change goes through do_search / do_click, which clear these).
    _segments: list[Segment] | None = field(default=None, repr=False)
    _clickables: dict[str, Clickable] | None = field(default=None, repr=False)

    # -- actions ---------------------------------------------------------------------------------
    @property
    def has_search_bar(self) -> bool:
        return self.page == SEARCH

    def do_search(self, query: str) -> Outcome:
        """Run ``query`` and show page 1 of the results (WebShop lower-cases the query)."""
        self._segments = self._clickables = None
        self.keywords = query.lower()
        self.results = list(self.search(self.keywords))
        self._show_results(1)
        return Outcome(True)

    def do_click(self, name: str) -> Outcome:
        """Click the element labelled ``name`` (matched lower-cased) on the current page."""
        key = name.lower()
        clickables = self.clickables()
        if key not in clickables:
            return Outcome(False, f"there is no clickable '{clip_text(name)}' on this page")
        element = clickables[key]
        self._segments = self._clickables = None
        if element.role == "product":
            self.asin = element.target
            self.visited.add(element.target)
            self.page = ITEM
        elif element.role == "option":
            self.options[element.target] = element.value
            self.page = ITEM
        elif element.target == BUY_NOW:
            return self._purchase()
        elif element.target == BACK_TO_SEARCH:
            self.page, self.keywords, self.results = SEARCH, "", []
            self.asin, self.options, self.visited = None, {}, set()
        elif element.target == NEXT_PAGE:
            self._show_results(self.page_number + 1)
        elif element.target == PREV_PAGE:
            if self.page == RESULTS:
                self._show_results(self.page_number - 1)
            elif self.page == ITEM:
                self._show_results(self.page_number)
            else:  # a sub-page: back to its item, options kept
                self.page = ITEM
        elif element.target in SUB_PAGES:
            self.page, self.sub_page = SUB_PAGE, element.target
        return Outcome(True)

    def _show_results(self, page_number: int) -> None:
        # WebShop re-renders the results page from the last query; doing so clears the item and
        # the chosen options.
        self.page, self.page_number = RESULTS, page_number
        self.asin, self.options = None, {}

    def _purchase(self) -> Outcome:
        assert self.asin is not None
        product = self.by_asin[self.asin]
        kwargs = {"nouns": self.nouns} if self.nouns is not None else {}
        self.breakdown = webshop_reward(product, self.goal, self.prices[self.asin], self.options,
                                        **kwargs)
        self.reward = self.breakdown.reward
        self.page = DONE
        return Outcome(True, reward=self.reward, done=True, breakdown=self.breakdown)

    # -- what the page shows -------------------------------------------------------------------
    def page_results(self) -> list[str]:
        start = (self.page_number - 1) * PRODUCTS_PER_PAGE
        return self.results[start:start + PRODUCTS_PER_PAGE]

    def segments(self) -> list[Segment]:
        """The visible text of the current page, in reading order."""
        if self._segments is None:
            self._segments = self._page_segments()
        return self._segments

    def _page_segments(self) -> list[Segment]:
        instruction = [Segment("Instruction:"), Segment(self.goal.instruction_text)]
        back = [Segment(BACK_TO_SEARCH, "button")]
        if self.page == SEARCH:
            return [Segment("WebShop"), *instruction, Segment("Search", "button")]
        if self.page == RESULTS:
            out = [*instruction, *back,
                   Segment(f"Page {self.page_number} (Total results: {len(self.results)})")]
            if self.page_number > 1:
                out.append(Segment(PREV_PAGE, "button"))
            out.append(Segment(NEXT_PAGE, "button"))
            for asin in self.page_results():
                product = self.by_asin[asin]
                out += [Segment(asin, "product", selected=asin in self.visited),
                        Segment(product["Title"]), Segment(product["Price"])]
            return out
        if self.page == DONE:
            return [Segment(t) for t in done_page_texts(self.asin or "", self.options, self.reward)]
        assert self.asin is not None
        product = self.by_asin[self.asin]
        out = [*instruction, *back, Segment(PREV_PAGE, "button")]
        if self.page == ITEM:
            for option_name, values in product["options"].items():
                out.append(Segment(option_name))
                out += [Segment(v, "option", selected=self.options.get(option_name) == v)
                        for v in values]
            out += [Segment(product["Title"]), Segment(f"Price: {product['Price']}"),
                    Segment(f"Rating: {product['Rating']}")]
            out += [Segment(name, "button") for name in self._sub_page_buttons()]
            out.append(Segment(BUY_NOW, "button"))
            return out
        return out + [Segment(t) for t in self._sub_page_text(product) if t]

    def _sub_page_buttons(self) -> tuple[str, ...]:
        return SUB_PAGES if self.show_attributes else SUB_PAGES[:3]

    def _sub_page_text(self, product: Mapping[str, Any]) -> list[str]:
        if self.sub_page == "Description":
            return [str(product["Description"]).strip()]
        if self.sub_page == "Features":
            return [str(b).strip() for b in product["BulletPoints"]]
        if self.sub_page == "Reviews":
            out: list[str] = []
            for review in product.get("Reviews") or []:
                out += [f'"{review.get("title", "")}"', str(review.get("score", "")),
                        str(review.get("body", "")).strip()]
            return out
        return [*map(str, product["Attributes"]), product["category"], product["query"],
                product["product_category"]]

    def clickables(self) -> dict[str, Clickable]:
        """Lower-cased label -> element, for the current page. Option values come last and win
        a clash with a button label, as in WebShop's page parsing."""
        if self._clickables is None:
            self._clickables = self._page_clickables()
        return self._clickables

    def _page_clickables(self) -> dict[str, Clickable]:
        out: dict[str, Clickable] = {}
        options: dict[str, Clickable] = {}
        product = self.by_asin[self.asin] if self.page == ITEM and self.asin else None
        for seg in self.segments():
            if seg.role == "button" and seg.text != "Search":
                out[seg.text.lower()] = Clickable("button", seg.text)
            elif seg.role == "product":
                out[seg.text.lower()] = Clickable("product", seg.text)
        if product is not None:
            for option_name, values in product["options"].items():
                for v in values:
                    options[v] = Clickable("option", option_name, v)
        out.update(options)
        return out


def done_page_texts(asin: str, options: Mapping[str, str], reward: float) -> list[str]:
    """The visible text of WebShop's thank-you page, as its text env renders it.

    WebShop's template also lists the goal, but its text env does not pass the goal in, so those
    fields read "None" or nothing; the purchased ASIN, the chosen options (JSON, keys sorted,
    HTML-safe as Flask's ``tojson`` writes them) and the score are shown.
    """
    options_json = json.dumps(dict(options), sort_keys=True)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("'", "\\u0027")):
        options_json = options_json.replace(char, escape)
    return ["Thank you for shopping with us!", "Your code:", "None",
            "(Paste it in your MTurk interface.)", "Purchased", "asin", asin, "options",
            options_json, "attrs", "None", "category", "None", "query", "None", "product category",
            "None", "Target", "asin", "options", "attrs", "price upper", "instuction text",
            "category", "product category", "query", "Goal", "None", "Reward",
            "Your score (min 0.0, max 1.0)", f"{reward}", "Reward Details", "None"]


def clip_text(text: str, limit: int = 60) -> str:
    """Caller text quoted in an observation: clipped, control characters and lone surrogates
    escaped (:func:`crl_bench.text_env.echo_text`)."""
    return echo_text(text, limit)
