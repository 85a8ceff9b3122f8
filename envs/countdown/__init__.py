"""Countdown: a safe expression grammar, solvable puzzle generation, a solver and the env."""

from envs.countdown.env import CountdownConfig, CountdownEnv

__all__ = ["CountdownConfig", "CountdownEnv"]
