"""The paper's statistics, each in one place: SNR-Aware Filtering and reward-variance statistics, the MI proxies from
in-batch cross-scoring, the collapse alert, rollout statistics and the rollout-batch format."""
