"""DeepCoder: code problems (shipped generated set, or PrimeIntellect / TACO / LiveCodeBench files), the sandbox
that runs untrusted answers, and the env."""

from envs.deepcoder.env import DeepCoderConfig, DeepCoderEnv

__all__ = ["DeepCoderConfig", "DeepCoderEnv"]
