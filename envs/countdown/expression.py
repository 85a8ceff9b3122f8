"""A safe arithmetic expression language for Countdown answers (recursive descent, exact rationals, no eval).

    expression := term (("+" | "-") term)*
    term       := factor (("*" | "/") factor)*
    factor     := NUMBER | "(" expression ")"
    NUMBER     := one to MAX_DIGITS ASCII digits

Spaces and tabs may separate tokens. Everything else (unary minus, decimals, '=', '^', names, unicode
operators) is rejected with `ExpressionError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

MAX_LENGTH = 200  # characters
MAX_DIGITS = 6
MAX_DEPTH = 20  # nested parentheses

_TOKEN = re.compile(r"[ \t]*(?:([0-9]+)|([-+*/()]))")


class ExpressionError(ValueError):
    """The text is not an expression of the grammar."""


@dataclass(frozen=True)
class Number:
    value: int


@dataclass(frozen=True)
class BinaryOp:
    op: str  # one of + - * /
    left: Expr
    right: Expr


Expr = Number | BinaryOp


def _tokenize(text: str) -> list[str]:
    if len(text) > MAX_LENGTH:
        raise ExpressionError(f"longer than {MAX_LENGTH} characters")
    tokens, pos = [], 0
    text = text.rstrip(" \t")
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            bad = text[pos:].lstrip(" \t")[:1]
            raise ExpressionError(f"unexpected character {bad!r}")
        number, symbol = match.groups()
        if number is not None and len(number) > MAX_DIGITS:
            raise ExpressionError(f"number longer than {MAX_DIGITS} digits")
        tokens.append(number if number is not None else symbol)
        pos = match.end()
    return tokens


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise ExpressionError("unexpected end of expression")
        self.pos += 1
        return token

    def expression(self, depth: int) -> Expr:
        node = self.term(depth)
        while self.peek() in ("+", "-"):
            node = BinaryOp(self.take(), node, self.term(depth))
        return node

    def term(self, depth: int) -> Expr:
        node = self.factor(depth)
        while self.peek() in ("*", "/"):
            node = BinaryOp(self.take(), node, self.factor(depth))
        return node

    def factor(self, depth: int) -> Expr:
        token = self.take()
        if token.isdigit():
            return Number(int(token))
        if token != "(":
            raise ExpressionError(f"expected a number or '(', got {token!r}")
        if depth >= MAX_DEPTH:
            raise ExpressionError(f"parentheses nested deeper than {MAX_DEPTH}")
        node = self.expression(depth + 1)
        if self.take() != ")":
            raise ExpressionError("missing ')'")
        return node


def parse_expression(text: str) -> Expr:
    """Parse `text` into an expression tree; ExpressionError if it is not in the grammar."""
    parser = _Parser(_tokenize(text))
    if not parser.tokens:
        raise ExpressionError("empty expression")
    node = parser.expression(0)
    if parser.peek() is not None:
        raise ExpressionError(f"unexpected {parser.peek()!r} after the expression")
    return node


def numbers_used(node: Expr) -> list[int]:
    """The number literals of the expression, left to right."""
    if isinstance(node, Number):
        return [node.value]
    return numbers_used(node.left) + numbers_used(node.right)


def evaluate(node: Expr) -> Fraction | None:
    """Exact value of the expression, or None if it divides by zero."""
    if isinstance(node, Number):
        return Fraction(node.value)
    left, right = evaluate(node.left), evaluate(node.right)
    if left is None or right is None:
        return None
    if node.op == "+":
        return left + right
    if node.op == "-":
        return left - right
    if node.op == "*":
        return left * right
    return None if right == 0 else left / right
