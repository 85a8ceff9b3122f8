"""Small text helpers shared by the demonstration reasoning of the grid tasks."""

from __future__ import annotations


def at(pos: tuple[int, int]) -> str:
    """A (row, column) position as written in reasoning: '(2, 3)'."""
    return f"({pos[0]}, {pos[1]})"


def plural(n: int, noun: str) -> str:
    """'1 step', '3 steps'."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
