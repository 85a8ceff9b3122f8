"""A generated encyclopedia and two-hop questions over it, as HotpotQA records (synthetic; nothing downloaded).

`generate_records(seed, n)` draws a world of countries, cities, people, companies and books with invented names,
writes one article per entity, and asks bridge questions whose answer needs two articles, e.g. "In which city was
the founder of Kestrel Works born?" (company -> founder -> birth city). Each record's context holds the two
supporting articles and `DISTRACTORS` others, shuffled, like HotpotQA's distractor setting. Same seed, same set."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

GENERATED_SEED = 0
GENERATED_QUESTIONS = 300
DISTRACTORS = 8

_SYLLABLES = (
    "ka", "lo", "mi", "ra", "ven", "tor", "sel", "an", "dri", "mo", "zel", "qua", "bri", "nor", "fen", "ul",
    "tas", "ori", "pel", "gan", "vi", "ser", "ho", "lun", "da", "mer", "ith", "cor", "em", "sa",
)
_FIRST_NAMES = (
    "Aldo", "Berta", "Caspar", "Dalia", "Emil", "Freya", "Gideon", "Hanna", "Ivo", "Juna", "Konrad", "Lise",
    "Milo", "Nadia", "Oskar", "Petra", "Rasmus", "Selma", "Tobias", "Vera",
)
_OCCUPATIONS = ("engineer", "painter", "chemist", "architect", "composer", "physician", "merchant", "astronomer")
_INDUSTRIES = ("shipping", "textile", "software", "mining", "publishing", "brewing", "aviation", "pharmaceutical")
_COMPANY_SUFFIXES = ("Works", "Industries", "Holdings", "Trading Company", "Group", "Laboratories")
_GENRES = ("novel", "poetry collection", "travel memoir", "historical novel", "short story collection")
_BOOK_TITLES = ("The {} Letters", "Nights in {}", "The Lantern of {}", "{} and the Sea", "A Winter in {}")
_LANGUAGES = ("Velmic", "Ostran", "Pellish", "Quarese", "Dorvan", "Ithic")


@dataclass
class World:
    rng: random.Random
    used: set[str] = field(default_factory=set)
    countries: list[dict[str, Any]] = field(default_factory=list)
    cities: list[dict[str, Any]] = field(default_factory=list)
    people: list[dict[str, Any]] = field(default_factory=list)
    companies: list[dict[str, Any]] = field(default_factory=list)
    books: list[dict[str, Any]] = field(default_factory=list)

    def word(self) -> str:
        """A new invented word (never returned twice)."""
        while True:
            word = "".join(self.rng.choice(_SYLLABLES) for _ in range(self.rng.randint(2, 3))).capitalize()
            if word not in self.used:
                self.used.add(word)
                return word


def _build_world(rng: random.Random) -> World:
    world = World(rng)
    rivers = [f"{world.word()} River" for _ in range(15)]
    for _ in range(10):
        world.countries.append({"name": world.word(), "language": rng.choice(_LANGUAGES)})
    for i in range(70):
        country = world.countries[i % len(world.countries)]
        world.cities.append({
            "name": world.word(), "country": country["name"], "river": rng.choice(rivers),
            "population": rng.randrange(20, 900) * 1000,
        })
    for country in world.countries:
        country["capital"] = next(c["name"] for c in world.cities if c["country"] == country["name"])
    for _ in range(120):
        world.people.append({
            "name": f"{rng.choice(_FIRST_NAMES)} {world.word()}", "born": rng.randint(1850, 1990),
            "city": rng.choice(world.cities)["name"], "occupation": rng.choice(_OCCUPATIONS),
        })
    for _ in range(80):
        founder = rng.choice(world.people)
        world.companies.append({
            "name": f"{world.word()} {rng.choice(_COMPANY_SUFFIXES)}", "founder": founder["name"],
            "founded": founder["born"] + rng.randint(20, 50), "city": rng.choice(world.cities)["name"],
            "industry": rng.choice(_INDUSTRIES),
        })
    for _ in range(80):
        author = rng.choice(world.people)
        world.books.append({
            "name": rng.choice(_BOOK_TITLES).format(world.word()), "author": author["name"],
            "year": author["born"] + rng.randint(20, 60), "genre": rng.choice(_GENRES),
        })
    return world


def _a(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def _articles(world: World) -> dict[str, list[str]]:
    """Title -> sentences. Sentence 0 or 1 of each article states the fact a hop reads."""
    articles: dict[str, list[str]] = {}
    for c in world.countries:
        articles[c["name"]] = [f"{c['name']} is a country whose capital is {c['capital']}.",
                               f"Its official language is {c['language']}."]
    for c in world.cities:
        articles[c["name"]] = [f"{c['name']} is a city in {c['country']}.", f"It lies on the {c['river']}.",
                               f"{c['name']} has about {c['population']:,} inhabitants."]
    for p in world.people:
        articles[p["name"]] = [f"{p['name']} (born {p['born']}) is {_a(p['occupation'])}.",
                               f"{p['name']} was born in the city of {p['city']}."]
    for c in world.companies:
        articles[c["name"]] = [f"{c['name']} is {_a(c['industry'])} company founded in {c['founded']} by "
                               f"{c['founder']}.", f"Its headquarters are in {c['city']}."]
    for b in world.books:
        articles[b["name"]] = [f"{b['name']} is {_a(b['genre'])} published in {b['year']}.",
                               f"It was written by {b['author']}."]
    return articles


# A template: (entities it starts from, question, first-hop sentence, bridge key, second-hop sentence, answer key).
Template = tuple[Callable[[World], list[dict[str, Any]]], str, int, str, int, Callable[[dict[str, Any]], str]]


def _templates(world: World) -> list[Template]:
    by_name = {e["name"]: e for e in world.people + world.cities + world.countries}
    return [
        (lambda w: w.companies, "In which city was the founder of {} born?", 0, "founder", 1,
         lambda e: by_name[e["founder"]]["city"]),
        (lambda w: w.companies, "In what year was the founder of {} born?", 0, "founder", 0,
         lambda e: str(by_name[e["founder"]]["born"])),
        (lambda w: w.companies, "In which country is the city where {} has its headquarters?", 1, "city", 0,
         lambda e: by_name[e["city"]]["country"]),
        (lambda w: w.books, "In what year was the author of {} born?", 1, "author", 0,
         lambda e: str(by_name[e["author"]]["born"])),
        (lambda w: w.people, "On which river lies the city where {} was born?", 1, "city", 1,
         lambda e: by_name[e["city"]]["river"]),
        (lambda w: [c for c in w.cities if c["name"] != by_name[c["country"]]["capital"]],
         "What is the capital of the country in which {} lies?", 0, "country", 0,
         lambda e: by_name[e["country"]]["capital"]),
    ]


def generate_records(seed: int = GENERATED_SEED, n: int = GENERATED_QUESTIONS) -> list[dict[str, Any]]:
    """`n` two-hop questions as HotpotQA records (`_id`, `question`, `answer`, `type`, `level`,
    `supporting_facts`, `context`), deterministic in `seed`."""
    rng = random.Random(seed)
    world = _build_world(rng)
    articles = _articles(world)
    titles = list(articles)
    templates = _templates(world)
    per_template = -(-n // len(templates))
    records = []
    for t, (entities, text, first_sentence, bridge_key, second_sentence, answer) in enumerate(templates):
        for entity in rng.sample(entities(world), per_template):
            bridge = entity[bridge_key]
            gold = [entity["name"], bridge]
            context = gold + rng.sample([x for x in titles if x not in gold], DISTRACTORS)
            rng.shuffle(context)
            records.append({
                "_id": f"gen-{t}-{len(records):04d}",
                "question": text.format(entity["name"]),
                "answer": answer(entity),
                "type": "bridge",
                "level": "easy",
                "supporting_facts": [[entity["name"], first_sentence], [bridge, second_sentence]],
                "context": [[title, articles[title]] for title in context],
            })
    rng.shuffle(records)
    return records[:n]
