"""Offline generator of arithmetic word problems with exact answers and worked solutions, so that the math
task runs without downloading MetaMathQA. Each template draws its numbers from the rng and computes the answer
with exact rationals. `PROBLEM_SETS` names the generators a config chooses from (`problems`): the word problems of
the templates below, and one-digit sums, a set small enough for a micro model to answer some of
(tests/analysis/test_rehearsal.py's MetaMathQA cells)."""

from __future__ import annotations

import random
from collections.abc import Callable
from fractions import Fraction

from envs.metamathqa.answers import format_number
from envs.metamathqa.problem import MathProblem

NAMES = ("Ava", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemi", "Liam")
ITEMS = ("apples", "stickers", "marbles", "pencils", "stamps", "cards", "shells", "books")

Template = Callable[[random.Random], MathProblem]
TEMPLATES: list[Template] = []


def template(fn: Template) -> Template:
    """Register a word-problem template."""
    TEMPLATES.append(fn)
    return fn


def _n(value: Fraction | int) -> str:
    return format_number(Fraction(value))


@template
def change_after_shopping(rng: random.Random) -> MathProblem:
    name, count, price = rng.choice(NAMES), rng.randint(2, 9), rng.randint(2, 15)
    cost = count * price
    bill = next(b for b in (10, 20, 50, 100, 200) if b > cost)
    return MathProblem(
        f"{name} buys {count} notebooks at ${price} each and pays with a ${bill} bill. "
        "How many dollars of change does " + name + " get?",
        _n(bill - cost),
        f"The notebooks cost {count} × {price} = {cost} dollars. The change is {bill} − {cost} = {bill - cost} dollars.",
    )


@template
def collection_growth(rng: random.Random) -> MathProblem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    start, per_day, days = rng.randint(5, 60), rng.randint(2, 12), rng.randint(2, 7)
    gained = per_day * days
    given = rng.randint(1, start + gained - 1)
    left = start + gained - given
    return MathProblem(
        f"{name} has {start} {item}. {name} collects {per_day} more every day for {days} days, then gives "
        f"{given} to a friend. How many {item} does {name} have now?",
        _n(left),
        f"Over {days} days {name} collects {per_day} × {days} = {gained}. That makes {start} + {gained} = "
        f"{start + gained}. After giving away {given}, {start + gained} − {given} = {left} remain.",
    )


@template
def equal_sharing(rng: random.Random) -> MathProblem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    boxes, per_box = rng.randint(2, 9), rng.randint(3, 12)
    total, eaten = boxes * per_box, rng.randint(1, per_box - 1)
    return MathProblem(
        f"{name} packs {total} {item} equally into {boxes} boxes and then takes {eaten} out of one box. "
        f"How many {item} are left in that box?",
        _n(per_box - eaten),
        f"Each box gets {total} ÷ {boxes} = {per_box}. That box then holds {per_box} − {eaten} = {per_box - eaten}.",
    )


@template
def travel_distance(rng: random.Random) -> MathProblem:
    speed, hours, extra = rng.randint(3, 12) * 10, rng.randint(2, 6), rng.randint(5, 95)
    first = speed * hours
    return MathProblem(
        f"A train travels at {speed} km per hour for {hours} hours and then {extra} km more. "
        "How many kilometres does it travel in total?",
        _n(first + extra),
        f"At {speed} km/h for {hours} hours it covers {speed} × {hours} = {first} km. "
        f"Adding {extra} km gives {first} + {extra} = {first + extra} km.",
    )


@template
def garden_area(rng: random.Random) -> MathProblem:
    length, width = rng.randint(4, 20), rng.randint(3, 15)
    area = length * width
    path = rng.randint(1, area // 2)
    return MathProblem(
        f"A garden is {length} m long and {width} m wide. A path covers {path} square metres of it. "
        "How many square metres are left for planting?",
        _n(area - path),
        f"The garden's area is {length} × {width} = {area} square metres. "
        f"Without the path, {area} − {path} = {area - path} square metres remain.",
    )


@template
def sale_price(rng: random.Random) -> MathProblem:
    price, percent = rng.randint(8, 120), rng.choice((10, 15, 20, 25, 30, 40, 50))
    discount = Fraction(price * percent, 100)
    final = price - discount
    return MathProblem(
        f"A jacket costs ${price}. It is on sale for {percent}% off. What is the sale price in dollars?",
        _n(final),
        f"The discount is {percent}% of {price} = {price} × {percent} ÷ 100 = {_n(discount)} dollars. "
        f"The sale price is {price} − {_n(discount)} = {_n(final)} dollars.",
    )


@template
def average_score(rng: random.Random) -> MathProblem:
    name = rng.choice(NAMES)
    scores = [rng.randint(50, 100) for _ in range(rng.choice((2, 4, 5)))]
    total = sum(scores)
    mean = Fraction(total, len(scores))
    listing = ", ".join(map(str, scores[:-1])) + f" and {scores[-1]}"
    return MathProblem(
        f"{name} scored {listing} on {len(scores)} tests. What is {name}'s average score?",
        _n(mean),
        f"The scores add up to {' + '.join(map(str, scores))} = {total}. "
        f"Dividing by {len(scores)} tests gives {total} ÷ {len(scores)} = {_n(mean)}.",
    )


@template
def future_age(rng: random.Random) -> MathProblem:
    child, parent = rng.sample(NAMES, 2)
    age, times, years = rng.randint(3, 12), rng.randint(2, 5), rng.randint(2, 15)
    now = age * times
    return MathProblem(
        f"{child} is {age} years old. {parent} is {times} times as old as {child}. "
        f"How old will {parent} be in {years} years?",
        _n(now + years),
        f"{parent} is now {age} × {times} = {now}. In {years} years {parent} will be {now} + {years} = {now + years}.",
    )


@template
def fraction_of_group(rng: random.Random) -> MathProblem:
    denominator = rng.choice((3, 4, 5, 6, 8))
    numerator = rng.randint(1, denominator - 1)
    students = denominator * rng.randint(3, 8)
    part = students * numerator // denominator
    return MathProblem(
        f"A club has {students} members and {numerator}/{denominator} of them play chess. "
        "How many members do not play chess?",
        _n(students - part),
        f"Chess players: {students} × {numerator}/{denominator} = {part}. "
        f"The others number {students} − {part} = {students - part}.",
    )


def generate_problem(rng: random.Random) -> MathProblem:
    """One word problem from a template chosen by `rng`."""
    return rng.choice(TEMPLATES)(rng)


SMALL_MAX = 4  # the largest addend of a small sum: answers 2..8


def small_sum(rng: random.Random) -> MathProblem:
    """One addition of two numbers from 1 to `SMALL_MAX` in a one-sentence story."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    first, second = rng.randint(1, SMALL_MAX), rng.randint(1, SMALL_MAX)
    return MathProblem(
        f"{name} has {first} {item} and finds {second} more. How many {item} does {name} have now?",
        _n(first + second),
        f"{first} + {second} = {first + second}.",
    )


# The built-in problem sets by name (`MetaMathQAConfig.problems`): the first is the default
PROBLEM_SETS: dict[str, Callable[[random.Random], MathProblem]] = {"word": generate_problem, "small_sums": small_sum}
