"""The shipped problem set: `SHIPPED_SIZE` small synthetic problems generated from templates, deterministic per
index (problem i is drawn from `random.Random(i)`). Each has a reference solution (the demonstrations' answer)
and six tests whose expected outputs are computed by running that reference in-process when the problem is
generated (it is orch's own code; submissions only ever run in the sandbox)."""

from __future__ import annotations

import contextlib
import io
import random
import sys
from collections.abc import Callable
from functools import cache
from typing import Any

from envs.deepcoder.problem import CodeProblem

SHIPPED_SIZE = 300
TESTS_PER_PROBLEM = 6

# A template draws its parameters and returns (statement, mode, fn_name, solution, explanation, inputs).
Draft = tuple[str, str, str | None, str, str, list[Any]]
TEMPLATES: list[Callable[[random.Random], Draft]] = []


def template(fn: Callable[[random.Random], Draft]) -> Callable[[random.Random], Draft]:
    TEMPLATES.append(fn)
    return fn


def _ints(rng: random.Random, low: int = -20, high: int = 20, most: int = 8) -> list[int]:
    return [rng.randint(low, high) for _ in range(rng.randint(0, most))]


def _word(rng: random.Random, letters: str = "abcde", most: int = 6) -> str:
    return "".join(rng.choice(letters) for _ in range(rng.randint(1, most)))


@template
def scaled_sum(rng: random.Random) -> Draft:
    k = rng.randint(2, 9)
    code = f"def scaled_sum(nums):\n    return sum(x * {k} for x in nums)\n"
    return (f"Write a function `scaled_sum(nums)` that returns the sum of the integers in the list `nums`, each "
            f"multiplied by {k} (0 for an empty list).", "call", "scaled_sum", code,
            f"Multiply every element by {k} and add the products up.", [[_ints(rng)] for _ in range(TESTS_PER_PROBLEM)])


@template
def count_multiples(rng: random.Random) -> Draft:
    k = rng.randint(2, 7)
    code = f"def count_multiples(nums):\n    return sum(1 for x in nums if x % {k} == 0)\n"
    return (f"Write a function `count_multiples(nums)` that returns how many integers in the list `nums` are "
            f"divisible by {k}.", "call", "count_multiples", code,
            f"Count the elements whose remainder modulo {k} is 0.", [[_ints(rng, -30, 30, 10)] for _ in range(TESTS_PER_PROBLEM)])


@template
def rotate_left(rng: random.Random) -> Draft:
    k = rng.randint(1, 5)
    code = (f"def rotate_left(items):\n    if not items:\n        return []\n    k = {k} % len(items)\n"
            "    return items[k:] + items[:k]\n")
    return (f"Write a function `rotate_left(items)` that returns the list `items` rotated left by {k} positions "
            "(the first element moves to the end, and so on; an empty list stays empty).", "call", "rotate_left",
            code, f"Reduce the shift {k} modulo the length, then join the tail after the head.",
            [[_ints(rng, 0, 9)] for _ in range(TESTS_PER_PROBLEM)])


@template
def count_char(rng: random.Random) -> Draft:
    char = rng.choice("abcde")
    code = f"def count_char(text):\n    return text.count({char!r})\n"
    return (f"Write a function `count_char(text)` that returns how many times the letter '{char}' occurs in the "
            "string `text`.", "call", "count_char", code, f"str.count of '{char}' gives the number of occurrences.",
            [[_word(rng, most=10)] for _ in range(TESTS_PER_PROBLEM)])


@template
def caesar(rng: random.Random) -> Draft:
    k = rng.randint(1, 25)
    code = (f"def caesar(text):\n    return ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) for c in text)\n")
    return (f"Write a function `caesar(text)` that shifts every letter of the lowercase string `text` forward "
            f"by {k} places in the alphabet, wrapping from 'z' to 'a'.", "call", "caesar", code,
            f"Map each letter to its index 0-25, add {k} modulo 26, and map back.",
            [[_word(rng, "abcdefghijklmnopqrstuvwxyz", 8)] for _ in range(TESTS_PER_PROBLEM)])


@template
def prefix_sums(rng: random.Random) -> Draft:
    m = rng.choice([7, 10, 13, 100])
    code = (f"def prefix_sums(nums):\n    out, total = [], 0\n    for x in nums:\n        total = (total + x) % {m}\n"
            "        out.append(total)\n    return out\n")
    return (f"Write a function `prefix_sums(nums)` that returns the list of running sums of `nums`, each taken "
            f"modulo {m} (Python's %, so results lie in 0..{m - 1}).", "call", "prefix_sums", code,
            f"Keep a running total modulo {m} and record it after every element.",
            [[_ints(rng, -50, 50)] for _ in range(TESTS_PER_PROBLEM)])


@template
def longest_run(rng: random.Random) -> Draft:
    code = ("def longest_run(nums):\n    best = run = 0\n    for i, x in enumerate(nums):\n"
            "        run = run + 1 if i and nums[i - 1] == x else 1\n        best = max(best, run)\n    return best\n")
    return ("Write a function `longest_run(nums)` that returns the length of the longest block of consecutive "
            "equal elements in the list `nums` (0 for an empty list).", "call", "longest_run", code,
            "Scan once, extending the current run while the element repeats and keeping the maximum.",
            [[_ints(rng, 0, 2, 10)] for _ in range(TESTS_PER_PROBLEM)])


@template
def digit_power_sum(rng: random.Random) -> Draft:
    p = rng.randint(1, 3)
    code = f"def digit_power_sum(n):\n    return sum(int(d) ** {p} for d in str(abs(n)))\n"
    return (f"Write a function `digit_power_sum(n)` that returns the sum of the decimal digits of the integer "
            f"`n`, each raised to the power {p} (the sign is ignored).", "call", "digit_power_sum", code,
            f"Take the digits of |n| as text and add up each digit to the power {p}.",
            [[rng.randint(-99999, 99999)] for _ in range(TESTS_PER_PROBLEM)])


@template
def fizz(rng: random.Random) -> Draft:
    a, b = rng.sample([2, 3, 4, 5, 7], 2)
    code = (f"def fizz(n):\n    out = []\n    for i in range(1, n + 1):\n        word = ''\n"
            f"        if i % {a} == 0:\n            word += 'Fizz'\n        if i % {b} == 0:\n"
            "            word += 'Buzz'\n        out.append(word or str(i))\n    return out\n")
    return (f"Write a function `fizz(n)` that returns a list of strings for the numbers 1..n: 'Fizz' for "
            f"multiples of {a}, 'Buzz' for multiples of {b}, 'FizzBuzz' for multiples of both, else the number "
            "itself as a string.", "call", "fizz", code,
            f"For each i build the word from the two divisibility tests ({a} then {b}) or fall back to str(i).",
            [[rng.randint(0, 20)] for _ in range(TESTS_PER_PROBLEM)])


@template
def sum_above(rng: random.Random) -> Draft:
    t = rng.randint(-5, 10)
    code = (f"n = int(input())\nnums = list(map(int, input().split())) if n else []\n"
            f"print(sum(x for x in nums if x > {t}))\n")
    inputs = []
    for _ in range(TESTS_PER_PROBLEM):
        nums = _ints(rng, -20, 30)
        inputs.append(f"{len(nums)}\n{' '.join(map(str, nums))}\n")
    return (f"Write a program that reads an integer n on the first line and n integers on the second line (the "
            f"line may be empty when n is 0), and prints the sum of those greater than {t}.", "stdio", None, code,
            f"Read the numbers, keep those above {t}, and print their sum.", inputs)


@template
def reverse_words(rng: random.Random) -> Draft:
    sep = rng.choice(["-", ",", " ", "+"])
    code = f"print({sep!r}.join(reversed(input().split())))\n"
    inputs = [" ".join(_word(rng) for _ in range(rng.randint(1, 6))) + "\n" for _ in range(TESTS_PER_PROBLEM)]
    return (f"Write a program that reads one line of space-separated words and prints the words in reverse order "
            f"joined by '{sep}'.", "stdio", None, code,
            f"Split the line on whitespace, reverse the list, and join it with '{sep}'.", inputs)


@template
def linear_sequence(rng: random.Random) -> Draft:
    k, c, m = rng.randint(2, 5), rng.randint(0, 9), rng.choice([11, 97, 1000])
    code = (f"n, a = map(int, input().split())\nout = []\nfor _ in range(n):\n    out.append(a)\n"
            f"    a = (a * {k} + {c}) % {m}\nprint(*out)\n")
    inputs = [f"{rng.randint(1, 8)} {rng.randint(0, 50)}\n" for _ in range(TESTS_PER_PROBLEM)]
    return (f"Write a program that reads two integers n and a and prints, space-separated on one line, the first "
            f"n terms of the sequence that starts at a where each next term is (previous * {k} + {c}) mod {m}.",
            "stdio", None, code, f"Iterate n times: print the term, then apply x -> (x * {k} + {c}) % {m}.", inputs)


@template
def run_length(rng: random.Random) -> Draft:
    code = ("s = input().strip()\nout, i = [], 0\nwhile i < len(s):\n    j = i\n    while j < len(s) and s[j] == s[i]:\n"
            "        j += 1\n    out.append(s[i] + str(j - i))\n    i = j\nprint(''.join(out))\n")
    inputs = ["".join(rng.choice("ab") * rng.randint(1, 3) for _ in range(rng.randint(1, 5))) + "\n"
              for _ in range(TESTS_PER_PROBLEM)]
    return ("Write a program that reads a string of letters and prints its run-length encoding: each maximal "
            "block of one repeated letter becomes the letter followed by the block's length (e.g. aaab -> a3b1).",
            "stdio", None, code, "Walk the string, measure each block of equal letters, and emit letter + count.",
            inputs)


@template
def sort_words(rng: random.Random) -> Draft:
    descending = rng.random() < 0.5
    order = "longest first" if descending else "shortest first"
    key = "(-len(w), w)" if descending else "(len(w), w)"
    code = (f"n = int(input())\nwords = [input().strip() for _ in range(n)]\n"
            f"for w in sorted(words, key=lambda w: {key}):\n    print(w)\n")
    inputs = []
    for _ in range(TESTS_PER_PROBLEM):
        words = [_word(rng) for _ in range(rng.randint(1, 5))]
        inputs.append(f"{len(words)}\n" + "".join(w + "\n" for w in words))
    return (f"Write a program that reads n and then n words, one per line, and prints the words one per line "
            f"sorted by length ({order}), breaking ties alphabetically.", "stdio", None, code,
            f"Sort with the key {key} and print each word.", inputs)


def _run_reference(mode: str, fn_name: str | None, code: str, test_input: Any) -> Any:
    """The reference's output on one input, run in-process (trusted, orch's own code)."""
    namespace: dict[str, Any] = {"__name__": "__main__" if mode == "stdio" else "reference"}
    if mode == "call":
        exec(code, namespace)  # noqa: S102 - orch's own reference solution
        return namespace[fn_name](*test_input)
    stdout, saved = io.StringIO(), sys.stdin
    sys.stdin = io.StringIO(test_input)
    try:
        with contextlib.redirect_stdout(stdout):
            exec(code, namespace)  # noqa: S102 - orch's own reference solution
    finally:
        sys.stdin = saved
    return stdout.getvalue()


def generate_problem(index: int) -> CodeProblem:
    """Shipped problem `index` (any int; the same index always gives the same problem)."""
    rng = random.Random(index)
    make = rng.choice(TEMPLATES)
    statement, mode, fn_name, code, explanation, inputs = make(rng)
    example_in = inputs[0]
    example_out = _run_reference(mode, fn_name, code, example_in)
    if mode == "call":
        example = f"Example: {fn_name}({', '.join(map(repr, example_in))}) returns {example_out!r}."
    else:
        example = f"Example input:\n{example_in}Example output:\n{example_out}"
    return CodeProblem(
        prompt=f"{statement}\n{example}".rstrip("\n"),
        mode=mode,
        tests=tuple((i, _run_reference(mode, fn_name, code, i)) for i in inputs),
        fn_name=fn_name,
        solution=code,
        source=f"generated/{make.__name__}",
        explanation=explanation,
        solution_defines_outputs=True,
    )


@cache
def shipped_problems() -> tuple[CodeProblem, ...]:
    return tuple(generate_problem(i) for i in range(SHIPPED_SIZE))
