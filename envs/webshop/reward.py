"""WebShop's reward of a purchase (Yao et al. 2022, web_agent_site/engine/goal.py), reimplemented from its
description:

    r = r_type * (|attributes matched| + |options matched| + 1[price <= price_upper]) / (|attributes| + |options| + 1)

r_type compares the purchased product with the goal's product: 1 if the search query is the same, or the category
breadcrumbs share at least two parts, or more than 20% of the goal title's words appear in the purchased title;
else 0.5; but 0.1 if under 10% of the words match and 0 if none does. WebShop counts only nouns of the titles
(spaCy); without a tagger, the words here are the title's lowercase alphabetic tokens outside a stop-word list.
An attribute matches when a product attribute and it agree as token sets (one set contains the other: WebShop's
fuzzy token-set ratio of 100; it takes > 85), or when it appears in the title or features; an option matches when
a chosen option value and it agree as token sets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from envs.webshop.catalog import Goal, Product

STOPWORDS = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "in", "into", "is", "it", "of", "on", "or",
    "the", "to", "with", "without", "x", "pack", "count", "oz", "ounce", "inch", "ft", "fl", "set",
))
_WORD = re.compile(r"[a-z0-9]+(?:\.[0-9]+)?")


def tokens(text: str) -> list[str]:
    """Lowercase word tokens (numbers with decimals kept whole)."""
    return _WORD.findall(text.lower())


def title_words(title: str) -> set[str]:
    """The words of a title compared for the product type: alphabetic tokens outside STOPWORDS."""
    return {t for t in tokens(title) if t.isalpha() and t not in STOPWORDS}


def fuzzy_match(left: str, right: str) -> bool:
    """True when the token sets of the two phrases are equal or one contains the other."""
    a, b = set(tokens(left)), set(tokens(right))
    return bool(a and b) and (a <= b or b <= a)


@dataclass(frozen=True)
class Score:
    reward: float
    r_type: float
    attributes_matched: int
    options_matched: int
    price_ok: bool


def type_reward(product: Product, goal: Goal) -> float:
    query_match = product.query.strip().lower() == goal.query.strip().lower()
    parts = {p.strip().lower() for p in product.product_category.split("›") if p.strip()}
    goal_parts = {p.strip().lower() for p in goal.product_category.split("›") if p.strip()}
    category_match = len(parts & goal_parts) >= 2
    wanted = title_words(goal.name)
    title_score = len(wanted & title_words(product.name)) / len(wanted) if wanted else 0.2
    r_type = 1.0 if query_match or category_match or title_score > 0.2 else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type


def score_purchase(product: Product, chosen: dict[str, str], price: float, goal: Goal) -> Score:
    """WebShop's reward of buying `product` at `price` with the `chosen` options (option name -> value)."""
    text = " ".join([product.name, *product.features]).lower()
    attributes = sum(
        any(fuzzy_match(wanted, have) for have in product.attributes) or wanted.lower() in text
        for wanted in goal.attributes
    )
    options = sum(any(fuzzy_match(wanted, value) for value in chosen.values()) for wanted in goal.options)
    price_ok = price <= goal.price_upper
    r_type = type_reward(product, goal)
    total = (attributes + options + price_ok) / (len(goal.attributes) + len(goal.options) + 1)
    return Score(r_type * total, r_type, attributes, options, price_ok)
