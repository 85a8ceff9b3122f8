"""Sokoban: reverse-play room generation, an optimal BFS solver and the environment."""

from envs.sokoban.env import LargeSokobanEnv, SokobanConfig, SokobanEnv

__all__ = ["LargeSokobanEnv", "SokobanConfig", "SokobanEnv"]
