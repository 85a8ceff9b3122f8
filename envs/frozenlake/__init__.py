"""FrozenLake: random solvable maps, slip dynamics matching gymnasium, a shortest-path solver and the env."""

from envs.frozenlake.env import FrozenLakeConfig, FrozenLakeEnv

__all__ = ["FrozenLakeConfig", "FrozenLakeEnv"]
