"""Loader for WebShop's own data files (github.com/princeton-nlp/WebShop, `data/`), read from local paths:

* products (`items_shuffle*.json`): a JSON list of products with `asin`, `name`, `category`, `query`,
  `product_category`, `pricing` (a string like "$12.99" or "$10.99$15.99", or a list of numbers),
  `customization_options` ({name: [{"value": ..., "image": ...}, ...]} or null), `small_description` (bullets);
* attributes (`items_ins_v2*.json`, optional): {asin: {"attributes": [...], ...}};
* goals (`items_human_ins.json`): {asin: [{"instruction", "instruction_attributes", "instruction_options"}, ...]}.

As in WebShop, option names and values are lowercased ('/' becomes ' | '), a product's price is the first of its
`pricing` (WebShop draws one within a range; here the lower end), goals without attributes are dropped, and each
goal's budget is drawn from its product's price (`catalog.budget`, seeded by the goal's asin and position).
"""

from __future__ import annotations

import json
import random
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from envs.webshop.catalog import Goal, Product, budget, instruction_text
from orchlib.errors import OrchError

DEFAULT_PRICE = 100.0


def _read_json(path: str, what: str, kind: type) -> Any:
    file = Path(path)
    if not file.is_file():
        raise OrchError(f"webshop {what}: no such file {path}")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, OSError) as err:
        raise OrchError(f"webshop {what} {path}: cannot read JSON ({err.__class__.__name__}: {err})") from None
    if not isinstance(data, kind):
        raise OrchError(f"webshop {what} {path}: expected a JSON {'list' if kind is list else 'object'}")
    return data


def _prices(pricing: Any) -> list[float]:
    if isinstance(pricing, str):
        return [float(re.sub(r"[^\d.]", "", part)) for part in pricing.split("$")[1:] if re.search(r"\d", part)]
    if isinstance(pricing, list):
        return [float(p) for p in pricing if isinstance(p, int | float)]
    return []


def _options(customization: Any) -> dict[str, tuple[str, ...]]:
    options = {}
    for name, contents in (customization or {}).items():
        if not contents:
            continue
        values = [c.get("value") if isinstance(c, dict) else c for c in contents]
        options[name.lower()] = tuple(str(v).strip().replace("/", " | ").lower() for v in values if v is not None)
    return options


def _product(record: Any, attributes: dict[str, Any]) -> Product | None:
    if not isinstance(record, dict) or not record.get("asin") or not record.get("name"):
        return None
    asin = str(record["asin"])
    extra = attributes.get(asin) or {}
    bullets = record.get("small_description") or []
    return Product(
        asin=asin,
        name=str(record["name"]).strip(),
        category=str(record.get("category") or ""),
        query=str(record.get("query") or "").lower().strip(),
        product_category=str(record.get("product_category") or ""),
        price=(_prices(record.get("pricing")) or [DEFAULT_PRICE])[0],
        attributes=tuple(str(a) for a in extra.get("attributes", [])),
        options=_options(record.get("customization_options")),
        features=tuple(str(b).strip() for b in bullets if isinstance(b, str) and b.strip()),
    )


@lru_cache(maxsize=2)
def load_webshop(
    products_path: str, goals_path: str, attributes_path: str | None = None
) -> tuple[tuple[Product, ...], tuple[Goal, ...]]:
    """The products (those with an asin and a name, in file order) and the goals (in file order, skipping goals
    whose product is missing or that have no attributes). OrchError for a missing or malformed file or no goal."""
    records = _read_json(products_path, "products_path", list)
    attributes = _read_json(attributes_path, "attributes_path", dict) if attributes_path else {}
    products, seen = [], set()
    for record in records:
        product = _product(record, attributes)
        if product is not None and product.asin not in seen:
            seen.add(product.asin)
            products.append(product)
    by_asin = {p.asin: p for p in products}
    goals = []
    for asin, entries in _read_json(goals_path, "goals_path", dict).items():
        product = by_asin.get(asin)
        for index, entry in enumerate(entries if product is not None and isinstance(entries, list) else []):
            if not isinstance(entry, dict) or not isinstance(entry.get("instruction"), str):
                continue
            wanted, chosen = entry.get("instruction_attributes") or [], entry.get("instruction_options") or []
            if not wanted:
                continue
            price_upper = budget(product.price, random.Random(f"{asin}/{index}"))
            goals.append(Goal(
                asin=asin,
                instruction=instruction_text(entry["instruction"], price_upper),
                attributes=tuple(map(str, wanted)),
                options=tuple(str(o).lower() for o in (chosen.values() if isinstance(chosen, dict) else chosen)),
                price_upper=price_upper,
                name=product.name,
                query=product.query,
                category=product.category,
                product_category=product.product_category,
            ))
    if not goals:
        raise OrchError(f"webshop goals_path {goals_path}: no goal with attributes for a product of {products_path}")
    return tuple(products), tuple(goals)
