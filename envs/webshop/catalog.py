"""Products and shopping goals in WebShop's shape, and the generated (synthetic) catalog shipped with orch.

The generated catalog is NOT WebShop's scraped Amazon data: it is drawn from `seed` by `generate_catalog` (product
types with attribute pools and options, brands, prices), and every goal is drawn from one product, as WebShop
draws its instructions from products, so that the goal product always exists and a solver can buy it.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass, field

# WebShop's price buckets (web_agent_site/utils.py PRICE_RANGE): a goal's budget is one of the next buckets above
# its product's price.
PRICE_RANGE = tuple(10.0 * i for i in range(1, 100))
NO_BUDGET = 1_000_000.0


@dataclass(frozen=True)
class Product:
    asin: str
    name: str  # the title
    category: str  # WebShop's top category (beauty, fashion, ...)
    query: str  # the search query the product was collected under
    product_category: str  # breadcrumb, parts separated by '›'
    price: float
    attributes: tuple[str, ...] = ()
    options: dict[str, tuple[str, ...]] = field(default_factory=dict)  # option name -> values (lowercase)
    features: tuple[str, ...] = ()  # bullet points shown on the item page

    def search_text(self) -> str:
        values = [value for values in self.options.values() for value in values]
        return " ".join([self.name, *self.attributes, *self.features, self.query, *values])


@dataclass(frozen=True)
class Goal:
    """A shopping instruction and what it asks for; `name`, `query`, `category` and `product_category` are those
    of the product it was drawn from (WebShop compares them for the product-type reward)."""

    asin: str
    instruction: str
    attributes: tuple[str, ...]
    options: tuple[str, ...]  # the option values asked for
    price_upper: float
    name: str
    query: str
    category: str
    product_category: str


def budget(price: float, rng: random.Random) -> float:
    """WebShop's budget: of the first four price buckets above `price`, the larger of two drawn at random
    (NO_BUDGET when fewer than two buckets lie above)."""
    above = [p for p in PRICE_RANGE if p > price][:4]
    if len(above) < 2:
        return NO_BUDGET
    return max(rng.sample(above, 2))


def instruction_text(base: str, price_upper: float) -> str:
    """WebShop's instruction: the request, then ', and price lower than X dollars' unless there is no budget."""
    base = base.strip().rstrip(".")
    return base if price_upper >= NO_BUDGET else f"{base}, and price lower than {price_upper:.2f} dollars"


# --- the generated catalog ------------------------------------------------------------------------------------
# department -> (top category, brands); type -> (department, price range, attribute pool, options)
DEPARTMENTS = {
    "Clothing, Shoes & Jewelry": ("fashion", ("Alvora", "Brisk", "Corvel", "Dunmore", "Elkin", "Fayre")),
    "Beauty & Personal Care": ("beauty", ("Glowe", "Halden", "Iris Lane", "Juniper", "Kaori", "Lumis")),
    "Grocery & Gourmet Food": ("grocery", ("Mesa Farms", "Northcup", "Oakroot", "Pantry Co", "Quillan")),
    "Electronics": ("electronics", ("Raylink", "Sonter", "Tekvo", "Ultrix", "Voltra", "Wavely")),
    "Home & Kitchen": ("home", ("Xandra", "Yardley", "Zephyr Home", "Arbor", "Bellhaus")),
}
COLORS = ("black", "white", "navy blue", "grey", "red", "green", "beige", "pink")
SIZES = ("x-small", "small", "medium", "large", "x-large", "xx-large")
TYPES: dict[str, tuple[str, tuple[int, int], tuple[str, ...], dict[str, tuple[str, ...]]]] = {
    "running shoes": ("Clothing, Shoes & Jewelry", (25, 140),
                      ("non slip", "lightweight", "breathable", "memory foam", "rubber sole", "arch support"),
                      {"size": ("6", "7", "7.5", "8", "8.5", "9", "10", "11", "12"), "color": COLORS}),
    "rain jacket": ("Clothing, Shoes & Jewelry", (30, 180),
                    ("waterproof", "hooded", "packable", "windproof", "machine wash", "zip pockets"),
                    {"size": SIZES, "color": COLORS}),
    "t-shirt": ("Clothing, Shoes & Jewelry", (8, 40),
                ("cotton", "short sleeve", "moisture wicking", "relaxed fit", "crew neck", "machine wash"),
                {"size": SIZES, "color": COLORS}),
    "jeans": ("Clothing, Shoes & Jewelry", (20, 110),
              ("slim fit", "stretch", "high waist", "button closure", "straight leg", "machine wash"),
              {"size": ("28w x 30l", "30w x 30l", "32w x 32l", "34w x 32l", "36w x 34l"),
               "color": ("light wash", "dark wash", "black", "stone")}),
    "wool socks": ("Clothing, Shoes & Jewelry", (9, 35),
                   ("merino wool", "cushioned", "moisture wicking", "anti blister", "thermal", "seamless toe"),
                   {"size": ("small", "medium", "large"), "pack": ("pack of 3", "pack of 6", "pack of 12")}),
    "hiking backpack": ("Clothing, Shoes & Jewelry", (30, 200),
                        ("water resistant", "padded straps", "laptop sleeve", "lightweight", "rain cover",
                         "hip belt"),
                        {"capacity": ("20l", "30l", "40l", "50l"), "color": COLORS}),
    "shampoo": ("Beauty & Personal Care", (6, 45),
                ("sulfate free", "paraben free", "for dry hair", "natural ingredients", "cruelty free",
                 "color safe"),
                {"size": ("8 fl oz", "12 fl oz", "16 fl oz", "33.8 fl oz"),
                 "scent": ("coconut", "lavender", "tea tree", "unscented")}),
    "face moisturizer": ("Beauty & Personal Care", (9, 80),
                         ("hyaluronic acid", "fragrance free", "for sensitive skin", "spf 30", "oil free",
                          "non comedogenic"),
                         {"size": ("1.7 oz", "2.5 oz", "4 oz")}),
    "lipstick": ("Beauty & Personal Care", (5, 40),
                 ("long lasting", "matte finish", "vegan", "moisturizing", "cruelty free", "waterproof"),
                 {"color": ("ruby red", "nude", "berry", "coral", "mauve", "plum")}),
    "hair extensions": ("Beauty & Personal Care", (15, 150),
                        ("clip in", "human hair", "natural looking", "heat resistant", "straight", "wavy"),
                        {"color": ("natural black", "dark brown", "blonde", "auburn"),
                         "length": ("14 inch", "18 inch", "22 inch")}),
    "green tea": ("Grocery & Gourmet Food", (4, 40),
                  ("organic", "caffeine free", "non gmo", "gluten free", "individually wrapped", "kosher"),
                  {"flavor": ("jasmine", "mint", "lemon", "matcha", "original"),
                   "count": ("20 count", "50 count", "100 count")}),
    "coffee beans": ("Grocery & Gourmet Food", (8, 60),
                     ("whole bean", "fair trade", "organic", "single origin", "low acid", "decaf"),
                     {"roast": ("light roast", "medium roast", "dark roast"),
                      "size": ("12 ounce", "2 pound", "5 pound")}),
    "granola bars": ("Grocery & Gourmet Food", (5, 35),
                     ("gluten free", "high protein", "low sugar", "non gmo", "vegan", "nut free"),
                     {"flavor": ("chocolate chip", "peanut butter", "honey oat", "berry"),
                      "count": ("12 count", "24 count", "48 count")}),
    "olive oil": ("Grocery & Gourmet Food", (8, 70),
                  ("extra virgin", "cold pressed", "organic", "non gmo", "single origin", "glass bottle"),
                  {"size": ("500 ml", "750 ml", "1 liter", "3 liter")}),
    "wireless earbuds": ("Electronics", (15, 250),
                         ("noise cancelling", "bluetooth 5.3", "waterproof", "long battery life",
                          "charging case", "built in microphone"),
                         {"color": ("black", "white", "midnight blue", "rose gold")}),
    "phone case": ("Electronics", (6, 50),
                   ("shockproof", "slim", "wireless charging compatible", "clear", "kickstand", "magnetic"),
                   {"model": ("iphone 14", "iphone 15", "galaxy s23", "pixel 8"),
                    "color": ("black", "clear", "blue", "purple", "green")}),
    "usb c cable": ("Electronics", (5, 30),
                    ("fast charging", "braided", "durable", "data transfer", "right angle", "100w"),
                    {"length": ("3 ft", "6 ft", "10 ft"), "pack": ("1 pack", "2 pack", "3 pack")}),
    "bluetooth speaker": ("Electronics", (20, 300),
                          ("portable", "waterproof", "long battery life", "stereo sound", "wireless",
                           "built in microphone"),
                          {"color": ("black", "blue", "red", "teal", "grey")}),
    "throw pillow covers": ("Home & Kitchen", (8, 45),
                            ("velvet", "hidden zipper", "machine wash", "decorative", "soft", "set of 2"),
                            {"size": ("16x16 inch", "18x18 inch", "20x20 inch"), "color": COLORS}),
    "bed sheets": ("Home & Kitchen", (20, 160),
                   ("deep pocket", "cotton", "breathable", "wrinkle free", "cooling", "easy care"),
                   {"size": ("twin", "full", "queen", "king"), "color": COLORS}),
    "desk lamp": ("Home & Kitchen", (15, 120),
                  ("dimmable", "usb charging port", "eye caring", "touch control", "adjustable arm",
                   "energy efficient"),
                  {"color": ("black", "white", "silver", "wood grain")}),
    "storage bins": ("Home & Kitchen", (10, 70),
                     ("foldable", "fabric", "with handles", "stackable", "lid included", "sturdy"),
                     {"size": ("small", "medium", "large"), "pack": ("2 pack", "4 pack", "6 pack")}),
}
MODELS = ("Classic", "Pro", "Essential", "Plus", "Signature", "Everyday", "Ultra", "Prime", "Select", "Original")
PREFIXES = ("i need", "i am looking for", "i want to buy", "find me", "i would like", "show me")


def _asin(rng: random.Random, taken: set[str]) -> str:
    while True:
        asin = "B0" + "".join(rng.choices(string.ascii_uppercase + string.digits, k=8))
        if asin not in taken:
            taken.add(asin)
            return asin


def generate_product(rng: random.Random, taken: set[str]) -> Product:
    """One product of a random type: brand and model in the title, 2-4 attributes, 2+ values per option, a
    price ending in .99 or .49 within the type's range."""
    kind = rng.choice(sorted(TYPES))
    department, (low, high), pool, option_pool = TYPES[kind]
    category, brands = DEPARTMENTS[department]
    attributes = tuple(rng.sample(pool, rng.randint(2, 4)))
    options = {}
    for option, values in option_pool.items():
        kept = set(rng.sample(values, rng.randint(2, len(values))))
        options[option] = tuple(v for v in values if v in kept)
    name = f"{rng.choice(brands)} {rng.choice(MODELS)} {kind.title()}"
    price = rng.randint(low, high) + rng.choice((0.99, 0.49)) - 1
    return Product(
        asin=_asin(rng, taken),
        name=name,
        category=category,
        query=kind,
        product_category=f"{department} › {kind.title()}",
        price=round(price, 2),
        attributes=attributes,
        options=options,
        features=tuple(f"{a}" for a in attributes),
    )


def goal_for(product: Product, rng: random.Random) -> Goal:
    """A goal drawn from `product`: 1-2 of its attributes, one value per option, WebShop's budget."""
    attributes = tuple(rng.sample(product.attributes, rng.randint(1, min(2, len(product.attributes)))))
    chosen = {name: rng.choice(values) for name, values in product.options.items()}
    price_upper = budget(product.price, rng)
    request = f"{rng.choice(PREFIXES)} {' and '.join(attributes)} {product.query}"
    if chosen:
        request += ", with " + ", and ".join(f"{name}: {value}" for name, value in chosen.items())
    return Goal(
        asin=product.asin,
        instruction=instruction_text(request, price_upper),
        attributes=attributes,
        options=tuple(chosen.values()),
        price_upper=price_upper,
        name=product.name,
        query=product.query,
        category=product.category,
        product_category=product.product_category,
    )


def generate_catalog(seed: int, num_products: int) -> tuple[tuple[Product, ...], tuple[Goal, ...]]:
    """`num_products` products and one goal per product (goal i drawn from product i), all determined by `seed`."""
    rng, taken = random.Random(f"webshop/{seed}"), set()
    products = tuple(generate_product(rng, taken) for _ in range(num_products))
    goals = tuple(goal_for(product, rng) for product in products)
    return products, goals
