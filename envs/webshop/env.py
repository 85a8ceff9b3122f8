"""The WebShop environment (Yao et al. 2022, text mode): search, browse result pages, open an item, choose its
options and buy; the reward is WebShop's score of the purchase against the instruction."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from pydantic import Field, model_validator

from envs.base import DataSource, Env, EnvConfig, reject_options
from envs.registry import register_env
from envs.split import record_index
from envs.webshop.catalog import NO_BUDGET, Goal, Product, generate_catalog
from envs.webshop.data import load_webshop
from envs.webshop.reward import fuzzy_match, score_purchase
from envs.webshop.search import SearchIndex

ACTION = re.compile(r"(search|click)\[(.*)\]", re.IGNORECASE | re.DOTALL)
BACK, NEXT, PREV, BUY = "back to search", "next >", "< prev", "buy now"
MAX_QUERY = 200  # characters
MAX_TITLE, MAX_FEATURES = 120, 240  # characters shown on pages (long real titles and bullets are cut)


class WebShopConfig(EnvConfig):
    max_turns: int = Field(6, ge=1, description="Turns per episode.")
    max_actions_per_turn: int = Field(3, ge=1, description="Actions executed from one reply.")
    max_actions: int = Field(12, ge=1, description="Actions per episode; truncated without a purchase when spent.")
    num_products: int = Field(3000, ge=10, le=200_000, description="Size of the generated catalog.")
    catalog_seed: int = Field(0, description="Seed of the generated catalog (products and instructions).")
    products_path: str | None = Field(
        None, description="WebShop products JSON (items_shuffle*.json); None: the generated catalog."
    )
    goals_path: str | None = Field(
        None, description="WebShop instructions JSON (items_human_ins.json); needed with products_path."
    )
    attributes_path: str | None = Field(
        None, description="WebShop product attributes JSON (items_ins_v2*.json); optional with products_path."
    )
    results_per_page: int = Field(5, ge=1, le=50, description="Results per page (WebShop shows 10).")
    max_results: int = Field(50, ge=1, le=1000, description="Results a search returns (WebShop: top 50).")
    reward: Literal["score", "binary"] = Field(
        "score", description="score: WebShop's purchase score; binary: 1 when that score is 1, else 0 (RAGEN's, "
        "ragen/env/webshop/env.py:133)."
    )

    @model_validator(mode="after")
    def _paths(self) -> WebShopConfig:
        if (self.products_path is None) != (self.goals_path is None):
            raise ValueError("products_path and goals_path go together (set both, or neither for the generated catalog)")
        if self.attributes_path is not None and self.products_path is None:
            raise ValueError("attributes_path needs products_path and goals_path")
        return self


@dataclass(frozen=True)
class Shop:
    products: tuple[Product, ...]
    goals: tuple[Goal, ...]
    index: SearchIndex
    by_asin: dict[str, int]


@lru_cache(maxsize=4)
def _shop(products_path: str | None, goals_path: str | None, attributes_path: str | None, seed: int,
          num_products: int) -> Shop:
    if products_path is None or goals_path is None:
        products, goals = generate_catalog(seed, num_products)
    else:
        products, goals = load_webshop(products_path, goals_path, attributes_path)
    index = SearchIndex([p.search_text() for p in products])
    return Shop(products, goals, index, {p.asin.lower(): i for i, p in enumerate(products)})


def shop_for(config: WebShopConfig) -> Shop:
    """The catalog, goals and search index of `config` (built once per process and configuration)."""
    return _shop(config.products_path, config.goals_path, config.attributes_path, config.catalog_seed,
                 config.num_products)


@dataclass
class View:
    """Where the shopper is: the search page, a results page, or an item page (with the options chosen)."""

    page: str = "search"
    query: str = ""
    results: tuple[int, ...] = ()
    page_no: int = 1
    item: int | None = None
    chosen: dict[str, str] = field(default_factory=dict)


def option_choice(product: Product, goal: Goal) -> dict[str, str]:
    """The product's option values that best meet the goal's options (exact value first, then token-set match)."""
    choice: dict[str, str] = {}
    for wanted in goal.options:
        for match in (lambda v, w=wanted: v == w, lambda v, w=wanted: fuzzy_match(w, v)):
            found = next(((n, v) for n, vs in product.options.items() if n not in choice for v in vs if match(v)),
                         None)
            if found:
                choice[found[0]] = found[1]
                break
    return choice


def _price(price: float) -> str:
    return f"${price:.2f}"


@register_env("webshop")
class WebShopEnv(Env):
    """Shop for the instructed product: search, browse, pick options, buy."""

    data = DataSource("products_path", "WebShop items_shuffle*.json with items_human_ins.json (goals_path)",
                      "the generated synthetic catalog")

    config_class = WebShopConfig
    valid_actions = None
    answer_format = "search[keywords] or click[one of the clickables listed on the page]"
    config: WebShopConfig

    shop: Shop
    goal: Goal
    view: View
    bought: tuple[Product, dict[str, str], float] | None

    @property
    def instruction(self) -> str:
        return (
            "You are shopping on WebShop, a text e-commerce site. Buy a product that matches the instruction: "
            "its attributes, its options and a price under the budget. Actions: search[keywords] on the search "
            "page; click[x] where x is one of the clickables listed on the page: an item id, an option value "
            f"(on an item page, click each option the instruction asks for), {NEXT}, {PREV}, {BACK}, {BUY}. "
            f"Buying ends the episode. Reward: {self._reward_rule()}; 0 without a purchase."
        )

    def _reward_rule(self) -> str:
        if self.config.reward == "binary":
            return "1 when the purchase meets all of the instruction's attributes, options and price limit, else 0"
        return ("the share of the instruction's attributes, options and price limit that the purchase meets "
                "(1 = all), times 0 for a product of another type")

    def _reset(self, rng: random.Random, options: dict[str, Any]) -> None:
        reject_options(self, options, ())
        self.shop = shop_for(self.config)
        self.goal = self.shop.goals[record_index(self.seed, len(self.shop.goals))]
        self.view = View()
        self.bought = None

    # --- pages ---------------------------------------------------------------------------------------------------
    def _pages(self) -> int:
        return max(1, -(-len(self.view.results) // self.config.results_per_page))

    def _on_page(self) -> list[int]:
        start = (self.view.page_no - 1) * self.config.results_per_page
        return list(self.view.results[start : start + self.config.results_per_page])

    def _product(self) -> Product:
        assert self.view.item is not None
        return self.shop.products[self.view.item]

    def clickables(self) -> list[str]:
        """What `click[...]` accepts on the current page, as listed on it."""
        view = self.view
        if view.page == "results":
            pages = [PREV] * (view.page_no > 1) + [NEXT] * (view.page_no < self._pages())
            return [BACK, *pages, *(self.shop.products[i].asin for i in self._on_page())]
        if view.page == "item":
            values = [v for vs in self._product().options.values() for v in vs]
            return [BACK, PREV, *dict.fromkeys(values), BUY]
        return []

    def render_text(self) -> str:
        lines = [f"Instruction: {self.goal.instruction}"]
        view = self.view
        if self.bought is not None:
            product, chosen, price = self.bought
            picked = ", ".join(f"{n}: {v}" for n, v in chosen.items()) or "no options"
            return "\n".join([*lines, f"You bought [{product.asin}] {product.name[:MAX_TITLE]} for "
                              f"{_price(price)} ({picked})."])
        if view.page == "search":
            return "\n".join([*lines, "Search page. Type search[keywords]."])
        if view.page == "results":
            total = len(view.results)
            if not total:
                lines.append(f'No results for "{view.query}".')
            else:
                lines.append(f'Results for "{view.query}" (page {view.page_no} of {self._pages()}, {total} items):')
                for i in self._on_page():
                    product = self.shop.products[i]
                    lines.append(f"[{product.asin}] {product.name[:MAX_TITLE]} | {_price(product.price)}")
        else:
            product = self._product()
            lines += [f"Item [{product.asin}] {product.name[:MAX_TITLE]}", f"Price: {_price(product.price)}"]
            if product.features:
                lines.append(f"Features: {'; '.join(product.features)[:MAX_FEATURES]}")
            for name, values in product.options.items():
                chosen = f" (chosen: {view.chosen[name]})" if name in view.chosen else ""
                lines.append(f"{name}: {', '.join(values)}{chosen}")
        lines.append(f"Clickables: {', '.join(self.clickables())}")
        return "\n".join(lines)

    # --- dynamics --------------------------------------------------------------------------------------------------
    def _step(self, action: str) -> tuple[float, bool, dict[str, Any]]:
        match = ACTION.fullmatch(action.strip())
        if match is None:
            return 0.0, False, {"action_valid": False}
        verb, argument = match.group(1).lower(), " ".join(match.group(2).split())
        view = self.view
        if verb == "search":
            if view.page != "search" or not argument or len(argument) > MAX_QUERY:
                return 0.0, False, {"action_valid": False}
            results = tuple(self.shop.index.search(argument, self.config.max_results))
            self.view = View(page="results", query=argument, results=results)
            return 0.0, False, {}
        target = argument.lower()
        if target not in {c.lower() for c in self.clickables()}:
            return 0.0, False, {"action_valid": False}
        if target == BACK:
            self.view = View()
        elif target == NEXT:
            view.page_no += 1
        elif target == PREV:
            if view.page == "item":
                view.page, view.item, view.chosen = "results", None, {}
            else:
                view.page_no -= 1
        elif target == BUY:
            return self._buy()
        elif view.page == "results":
            view.page, view.item = "item", self.shop.by_asin[target]
        else:
            name = next(n for n, vs in self._product().options.items() if target in vs)
            view.chosen[name] = target
        return 0.0, False, {}

    def _buy(self) -> tuple[float, bool, dict[str, Any]]:
        product = self._product()
        score = score_purchase(product, self.view.chosen, product.price, self.goal)
        self.bought = (product, dict(self.view.chosen), product.price)
        reward = score.reward if self.config.reward == "score" else float(score.reward >= 1.0)
        return reward, True, {
            "success": score.reward >= 1.0,
            "score": score.reward,
            "r_type": score.r_type,
            "attributes_matched": score.attributes_matched,
            "options_matched": score.options_matched,
            "price_ok": score.price_ok,
            "goal_asin": self.goal.asin,
            "bought_asin": product.asin,
        }

    # --- the oracle --------------------------------------------------------------------------------------------------
    def search_keywords(self) -> str:
        """The solver's query: the goal's attributes, product type and options (the instruction's key words)."""
        return " ".join([*self.goal.attributes, self.goal.query or self.goal.name, *self.goal.options])

    def fits(self, index: int) -> bool:
        """Whether buying product `index` with the best option choice earns reward 1."""
        product = self.shop.products[index]
        return score_purchase(product, option_choice(product, self.goal), product.price, self.goal).reward >= 1.0

    def plan(self) -> tuple[str, list[str]]:
        """The solver's next actions from the current page, stopping at the first one that opens a new page (the
        next page's content is unseen), with reasoning that cites this page."""
        goal, view = self.goal, self.view
        budget = "no price limit" if goal.price_upper >= NO_BUDGET else f"under {_price(goal.price_upper)}"
        if view.page == "search":
            keywords = self.search_keywords()
            wanted = ", ".join(goal.options) or "no particular options"
            return (f"I need {' and '.join(goal.attributes)} {goal.query}, {wanted}, {budget}. "
                    f"I search for the key words.", [f"search[{keywords}]"])
        if view.page == "results":
            on_page = self._on_page()
            for i in on_page:
                product = self.shop.products[i]
                if self.fits(i) or product.asin == goal.asin:
                    return (f"[{product.asin}] {product.name[:MAX_TITLE]} costs {_price(product.price)}, {budget}, "
                            "and looks like the right product; I open it.", [f"click[{product.asin}]"])
            if view.page_no < self._pages():
                return (f"No item on page {view.page_no} fits the instruction; I look at the next page.", [f"click[{NEXT}]"])
            if on_page:
                product = self.shop.products[on_page[0]]
                return f"Nothing fits exactly; [{product.asin}] comes closest.", [f"click[{product.asin}]"]
            return "The search found nothing; I search again.", [f"click[{BACK}]"]
        product = self._product()
        if not (self.fits(view.item) or product.asin == goal.asin):
            return f"{product.name[:MAX_TITLE]} does not fit the instruction; I go back.", [f"click[{PREV}]"]
        choice = option_choice(product, goal)
        clicks = [value for name, value in choice.items() if view.chosen.get(name) != value]
        actions = [f"click[{value}]" for value in clicks] + [f"click[{BUY}]"]
        picked = ", ".join(f"{n}: {v}" for n, v in choice.items()) or "no options needed"
        reasoning = (f"This item costs {_price(product.price)}, {budget}, and has "
                     f"{', '.join(goal.attributes)}. I choose {picked} and buy it.")
        return reasoning, actions[: self.config.max_actions_per_turn]

    def demonstrate(self, rng: random.Random) -> tuple[str, list[str]]:
        reasoning, actions = self.plan()
        opening = rng.choice(["", "Let me check the page. ", "Looking at this page: "])
        return opening + reasoning, actions
