"""WebShop: the purchase reward by hand, the loader on small files in WebShop's format, search, the page dynamics
and the protocol, and the solver on the whole shipped (generated) set."""

from __future__ import annotations

import json
import random

import pytest

from envs import Episode, demonstrations, make_env
from envs.protocol import format_response
from envs.webshop.catalog import NO_BUDGET, Goal, Product, budget, generate_catalog
from envs.webshop.data import load_webshop
from envs.webshop.reward import score_purchase
from orchlib.errors import OrchError

SHOES = Product(
    asin="B000000001", name="Alvora Pro Running Shoes", category="fashion", query="running shoes",
    product_category="Clothing, Shoes & Jewelry › Running Shoes", price=45.99,
    attributes=("non slip", "lightweight"), options={"size": ("8", "9", "x-small"), "color": ("black", "red")},
    features=("breathable mesh",),
)
GOAL = Goal(
    asin="B000000001", instruction="i need non slip and breathable running shoes, with size: 9, and color: black",
    attributes=("non slip", "breathable"), options=("9", "black"), price_upper=50.0, name=SHOES.name,
    query="running shoes", category="fashion", product_category=SHOES.product_category,
)


def product(**changes) -> Product:
    return Product(**{**SHOES.__dict__, **changes})


def test_full_match_scores_1():
    score = score_purchase(SHOES, {"size": "9", "color": "black"}, 45.99, GOAL)
    assert (score.reward, score.r_type, score.attributes_matched, score.options_matched) == (1.0, 1.0, 2, 2)


def test_wrong_product_type_scores_0():
    lamp = product(name="Xandra Classic Desk Lamp", query="desk lamp", product_category="Home & Kitchen › Desk Lamp")
    score = score_purchase(lamp, {"size": "9", "color": "black"}, 45.99, GOAL)
    assert (score.r_type, score.reward) == (0.0, 0.0)


@pytest.mark.parametrize(
    ("name", "r_type"),
    [
        ("Corvel Trail Shoes", 1.0),  # 1 of 4 title words (> 20%)
        ("Corvel Trail Shoes Boots Clogs Sandals Slides", 1.0),  # the goal's share is what counts
        ("Alvora Sandals", 1.0),
    ],
)
def test_title_overlap_above_20_percent_keeps_the_type(name, r_type):
    other = product(name=name, query="other", product_category="Other › Things")
    assert score_purchase(other, {}, 1.0, GOAL).r_type == r_type


def test_type_reward_thresholds_on_long_goal_titles():
    long_goal = Goal(**{**GOAL.__dict__, "name": "Alvora Pro Lite Trail Road Running Shoes Mesh Knit Cushion"})
    other = dict(query="other", product_category="Other › Things")
    # 2 of 10 title words: 20% is not above 20% -> 0.5; 1 of 10 -> 0.5 (not under 10%); 0 -> 0
    assert score_purchase(product(name="Alvora Pro Hat", **other), {}, 1.0, long_goal).r_type == 0.5
    assert score_purchase(product(name="Alvora Hat", **other), {}, 1.0, long_goal).r_type == 0.5
    assert score_purchase(product(name="Zeno Hat", **other), {}, 1.0, long_goal).r_type == 0.0
    longer = Goal(**{**GOAL.__dict__, "name": " ".join(f"word{c}" for c in "abcdefghijk") + " alvora"})
    assert score_purchase(product(name="Alvora Hat", **other), {}, 1.0, longer).r_type == 0.1  # 1 of 12
    # a shared query or two shared breadcrumb parts keep r_type 1 even with a weak title
    assert score_purchase(product(name="Alvora Hat"), {}, 1.0, long_goal).r_type == 1.0


def test_partial_attribute_and_option_matches():
    plain = product(attributes=("non slip",), features=())  # 'breathable' nowhere
    score = score_purchase(plain, {"size": "8", "color": "black"}, 45.99, GOAL)
    assert (score.attributes_matched, score.options_matched, score.price_ok) == (1, 1, True)
    assert score.reward == pytest.approx(3 / 5)
    assert score_purchase(SHOES, {}, 45.99, GOAL).reward == pytest.approx(3 / 5)  # no option chosen


def test_attributes_found_in_title_or_features_and_token_set_options():
    features_only = product(attributes=())  # 'breathable' in the features, 'non slip' nowhere
    assert score_purchase(features_only, {"size": "9", "color": "black"}, 1.0, GOAL).attributes_matched == 1
    small = Goal(**{**GOAL.__dict__, "options": ("small",)})
    assert score_purchase(SHOES, {"size": "x-small"}, 1.0, small).options_matched == 1  # token-set ratio 100
    assert score_purchase(SHOES, {"size": "8"}, 1.0, Goal(**{**GOAL.__dict__, "options": ("8.5",)})).options_matched == 0


def test_over_budget_loses_the_price_share_only():
    score = score_purchase(SHOES, {"size": "9", "color": "black"}, 50.01, GOAL)
    assert (score.price_ok, score.reward) == (False, pytest.approx(4 / 5))
    assert score_purchase(SHOES, {"size": "9", "color": "black"}, 50.0, GOAL).reward == 1.0


def test_budget_follows_webshop_price_buckets():
    rng = random.Random(0)
    for price in (0.5, 9.99, 45.99, 333.0):
        upper = budget(price, rng)
        buckets = [10.0 * i for i in range(1, 100) if 10.0 * i > price][:4]
        assert upper in buckets[1:]
    assert budget(985.0, rng) == NO_BUDGET


# --- the loader ------------------------------------------------------------------------------------------------
PRODUCTS = [
    {"asin": "B0TEST0001", "name": "Lumis Clip In Hair Extensions", "category": "beauty",
     "query": "Hair Extensions ", "product_category": "Beauty & Personal Care › Hair Care › Extensions",
     "pricing": "$24.99", "small_description": ["100% human hair", "natural looking"],
     "customization_options": {"Color": [{"value": "Natural Black", "image": None}, {"value": "Blonde/Ash"}],
                               "Length": [{"value": "18 Inch"}, {"value": "22 Inch"}]},
     "full_description": "ignored", "Reviews": []},
    {"asin": "B0TEST0002", "name": "Halden Wavy Hair Extensions", "category": "beauty", "query": "hair extensions",
     "product_category": "Beauty & Personal Care › Hair Care › Extensions", "pricing": "$10.00$15.50",
     "customization_options": None},
    {"asin": "B0TEST0003", "name": "Sonter Bluetooth Speaker", "category": "electronics", "query": "speaker",
     "product_category": "Electronics › Speakers", "pricing": "", "customization_options": {}},
    {"name": "no asin: skipped"},
]
ATTRIBUTES = {"B0TEST0001": {"attributes": ["clip in", "human hair"], "instruction": "x"},
              "B0TEST0003": {"attributes": ["waterproof"]}}
HUMAN_GOALS = {
    "B0TEST0001": [
        {"asin": "B0TEST0001", "instruction": "i want clip in human hair extensions in natural black, 18 inch.",
         "instruction_attributes": ["clip in", "human hair"], "instruction_options": ["natural black", "18 inch"]},
        {"asin": "B0TEST0001", "instruction": "no attributes: dropped", "instruction_attributes": [],
         "instruction_options": []},
    ],
    "B0TEST0003": [{"asin": "B0TEST0003", "instruction": "a waterproof speaker",
                    "instruction_attributes": ["waterproof"], "instruction_options": {}}],
    "B0MISSING0": [{"instruction": "its product is missing", "instruction_attributes": ["a"]}],
}


def write_webshop(tmp_path) -> dict[str, str]:
    paths = {}
    for key, data in (("products_path", PRODUCTS), ("attributes_path", ATTRIBUTES), ("goals_path", HUMAN_GOALS)):
        paths[key] = str(tmp_path / f"{key}.json")
        (tmp_path / f"{key}.json").write_text(json.dumps(data))
    return paths


def test_loader_reads_webshop_files(tmp_path):
    paths = write_webshop(tmp_path)
    products, goals = load_webshop(paths["products_path"], paths["goals_path"], paths["attributes_path"])
    assert [p.asin for p in products] == ["B0TEST0001", "B0TEST0002", "B0TEST0003"]
    extensions = products[0]
    assert (extensions.price, extensions.query) == (24.99, "hair extensions")
    assert extensions.options == {"color": ("natural black", "blonde | ash"), "length": ("18 inch", "22 inch")}
    assert extensions.attributes == ("clip in", "human hair")
    assert extensions.features == ("100% human hair", "natural looking")
    assert (products[1].price, products[1].options, products[2].price) == (10.0, {}, 100.0)
    assert [g.asin for g in goals] == ["B0TEST0001", "B0TEST0003"]
    first = goals[0]
    assert first.options == ("natural black", "18 inch") and first.name == extensions.name
    assert first.price_upper in (40.0, 50.0, 60.0)
    assert first.instruction == f"i want clip in human hair extensions in natural black, 18 inch, and price lower " \
                                f"than {first.price_upper:.2f} dollars"
    assert load_webshop(paths["products_path"], paths["goals_path"])[0][0].attributes == ()


def test_env_on_webshop_files_is_solved_by_the_solver(tmp_path):
    env = make_env("webshop", **write_webshop(tmp_path))
    for seed in (0, 1):
        env.reset(seed)
        reward, done = 0.0, False
        while not done:
            for action in env.plan()[1]:
                _, reward, terminated, truncated, info = env.step(action)
                assert info["action_valid"], action
                done = terminated or truncated
                if done:
                    break
        assert (reward, info["success"], info["bought_asin"]) == (1.0, True, env.goal.asin)


def test_loader_errors_name_the_file_and_the_problem(tmp_path):
    paths = write_webshop(tmp_path)
    with pytest.raises(OrchError, match="products_path: no such file"):
        load_webshop(str(tmp_path / "missing.json"), paths["goals_path"])
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(OrchError, match="cannot read JSON"):
        load_webshop(str(tmp_path / "bad.json"), paths["goals_path"])
    with pytest.raises(OrchError, match="expected a JSON list"):
        load_webshop(paths["goals_path"], paths["goals_path"])
    (tmp_path / "none.json").write_text(json.dumps({"B0TEST0002": [{"instruction": "x", "instruction_attributes": []}]}))
    with pytest.raises(OrchError, match="no goal with attributes"):
        load_webshop(paths["products_path"], str(tmp_path / "none.json"))
    with pytest.raises(OrchError, match="products_path and goals_path go together"):
        make_env("webshop", products_path=paths["products_path"])


# --- the generated catalog, search and the pages ---------------------------------------------------------------
def test_generated_catalog_is_deterministic_and_goals_come_from_products():
    products, goals = generate_catalog(0, 300)
    assert (products, goals) == generate_catalog(0, 300)
    assert generate_catalog(1, 300)[0] != products
    assert len({p.asin for p in products}) == 300
    for product, goal in zip(products, goals, strict=True):
        assert goal.asin == product.asin and set(goal.attributes) <= set(product.attributes)
        assert product.price <= goal.price_upper
        assert all(any(o in values for values in product.options.values()) for o in goal.options)


def test_search_ranks_the_goal_product_and_unknown_words_find_nothing():
    env = make_env("webshop")
    env.reset(7)
    results = env.shop.index.search(env.search_keywords(), 50)
    assert env.shop.by_asin[env.goal.asin.lower()] in results
    assert results == env.shop.index.search(env.search_keywords(), 50)
    state, *_ = env.step("search[qwertyuiop zxcvb]")
    assert 'No results for "qwertyuiop zxcvb".' in state and "Clickables: back to search" in state


def test_pages_navigation_and_options():
    env = make_env("webshop")
    state, _ = env.reset(3)
    assert "Search page" in state and env.goal.instruction in state
    state, *_ = env.step("search[ running  shoes ]")
    assert 'Results for "running shoes" (page 1 of 10, 50 items)' in state
    assert "< prev" not in env.clickables() and "next >" in env.clickables()
    first = env.clickables()[2]
    state, *_ = env.step("Click[Next >]")  # case-insensitive
    assert "page 2 of 10" in state and env.clickables()[:2] == ["back to search", "< prev"]
    assert first not in state
    env.step("click[< prev]")
    state, *_ = env.step(f"click[{first.lower()}]")
    assert f"Item [{first}]" in state and "Price: $" in state and env.clickables()[-1] == "buy now"
    value = env.clickables()[2]
    state, *_ = env.step(f"click[{value}]")
    assert f"(chosen: {value})" in state
    env.step("click[< prev]")
    assert "page 1 of 10" in env.render_text()
    state, *_ = env.step("click[back to search]")
    assert "Search page" in state


@pytest.mark.parametrize(
    "action",
    ["click[bogus]", "click[buy now]", "search[]", "buy now", "search[shoes", "click[next >] extra", "press[x]"],
)
def test_invalid_actions_change_nothing(action):
    env = make_env("webshop")
    env.reset(3)
    before = env.render_text()
    state, reward, terminated, truncated, info = env.step(action)
    assert (reward, terminated, info["action_valid"], state) == (0.0, False, False, before)


def test_invalid_clicks_on_results_and_item_pages():
    env = make_env("webshop")
    env.reset(3)
    env.step("search[running shoes]")
    assert not env.step("search[again]")[4]["action_valid"]  # the search bar is on the search page only
    assert not env.step("click[< prev]")[4]["action_valid"]  # page 1
    hidden = env.shop.products[env.view.results[-1]].asin  # on the last page, not this one
    assert not env.step(f"click[{hidden}]")[4]["action_valid"]
    env.step(f"click[{env.clickables()[2]}]")
    assert not env.step("click[next >]")[4]["action_valid"]


def test_format_penalty_and_truncation_without_purchase():
    episode = Episode(make_env("webshop", max_actions=2), seed=3)
    turn = episode.act(format_response("guess", ["click[buy now]"]))
    assert (turn.reward, turn.format_valid, turn.info["failure"]) == (-0.1, False, "invalid_action")
    assert "Your previous reply was invalid" in episode.messages[-1]["content"]
    turn = episode.act(format_response("search", ["search[shoes]", "click[next >]"]))
    assert (turn.reward, turn.info["ended"], episode.done, episode.success) == (0.0, True, True, False)


def test_buying_reports_the_reward_parts():
    env = make_env("webshop")
    env.reset(11)
    while True:
        reasoning, actions = env.plan()
        for action in actions:
            state, reward, terminated, _, info = env.step(action)
        if terminated:
            break
    assert info["success"] and reward == 1.0 and info["r_type"] == 1.0 and info["price_ok"]
    assert state.endswith(")." ) and "You bought" in state


def test_binary_reward_pays_only_a_full_match():
    """RAGEN's WebShop reward: 1 when WebShop's score is 1, else 0 (ragen/env/webshop/env.py:133)."""
    env = make_env("webshop", reward="binary")
    env.reset(11)
    assert "else 0" in env.instruction
    while env.view.page != "item":  # the solver's way to the goal item, stopping before it chooses any option
        _, actions = env.plan()
        for action in actions:
            env.step(action)
            if env.view.page == "item":
                break
    _, reward, terminated, _, info = env.step("click[buy now]")
    assert terminated and 0 < info["score"] < 1 and reward == 0.0 and not info["success"]


# --- the solver --------------------------------------------------------------------------------------------------
def test_solver_buys_a_matching_product_for_every_shipped_instruction():
    env = make_env("webshop")
    goals = env.config.num_products  # one instruction per generated product
    for seed in range(goals):
        env.reset(seed)
        turns, done = 0, False
        while not done:
            turns += 1
            for action in env.plan()[1]:
                _, reward, terminated, truncated, info = env.step(action)
                assert info["action_valid"], (seed, action)
                done = terminated or truncated
                if done:
                    break
        assert info["success"] and reward == 1.0 and turns <= env.config.max_turns, seed


def test_demonstrations_follow_the_protocol_and_succeed():
    for messages in demonstrations("webshop", 8, seed=2):
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        assert "Reward of your previous turn: -0.1" not in "".join(m["content"] for m in messages)
        assert replies[0].split("<answer>")[1].strip().startswith("search[")
        assert replies[-1].rstrip().endswith("click[buy now] </answer>")
