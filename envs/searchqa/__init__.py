"""SearchQA: HotpotQA-style multi-hop questions answered with `search[query]` (BM25 over the question's corpus) and
`finish[answer]`; a loader for HotpotQA records and a generated encyclopedia with two-hop questions."""

from envs.searchqa.env import SearchQAConfig, SearchQAEnv

__all__ = ["SearchQAConfig", "SearchQAEnv"]
