"""MetaMathQA: a loader for the real records, an offline word-problem generator, answer matching and the env."""

from envs.metamathqa.env import MetaMathQAConfig, MetaMathQAEnv

__all__ = ["MetaMathQAConfig", "MetaMathQAEnv"]
