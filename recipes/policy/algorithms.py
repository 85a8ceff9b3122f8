"""RL algorithms by name: how advantages are computed and whether a value model is trained.

The math is veRL's (`verl.trainer.ppo.core_algos`); this module only picks the estimator and passes our tensors.
What else distinguishes the algorithms is configuration (conf/algorithm/*.yaml): loss aggregation mode, clip
range, std normalisation, dynamic sampling. Tensors are (T, L) aligned with `input_ids` (see `recipes.policy.batch`);
non-loss positions (prompt, observations, padding) are skipped by veRL's masked recursions.

    algorithm = get_algorithm("ppo")
    advantages, returns = algorithm.advantages(batch, cfg.algorithm)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchlib.registry import Registry

if TYPE_CHECKING:
    import torch

    from recipes.policy.batch import TrainBatch

ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm", where="config key algorithm.name")
register_algorithm = ALGORITHMS.register  # class decorator, one or more names: `@register_algorithm("grpo", ...)`


def algorithm_names() -> list[str]:
    return ALGORITHMS.names()


def get_algorithm(name: str) -> Algorithm:
    """The algorithm registered as `name`; OrchError listing the valid names otherwise."""
    return ALGORITHMS.get(name)()


class Algorithm:
    """Advantage estimation of one algorithm family, and what it needs from a backend (its capabilities: the
    torch backend reads `uses_critic`; the verl backend maps `verl_estimator`; validation and preflight read all)."""

    uses_critic: bool = False  # trains a value model (a critic beside the actor)
    group_relative: bool = False  # advantages from a group of samples of one prompt: needs samples_per_prompt >= 2
    verl_estimator: str | None = None  # veRL's `algorithm.adv_estimator` computing the same advantages; None: the
    #                                    algorithm runs on the torch backend only (refused on backend=verl)

    def advantages(self, batch: TrainBatch, cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages, returns), each (T, L), zero outside `batch.loss_mask`."""
        raise NotImplementedError


@register_algorithm("ppo", "dapo")
class PPO(Algorithm):
    """GAE over the generated tokens of the whole trajectory with a learned value model (veRL's GAE skips the
    observation tokens between turns, so credit flows across turns), advantages whitened over the batch.

    `dapo` is RAGEN-2's DAPO, the one its Table 4 ran: "PPO + higher clip + no KL + token-level loss", a GAE critic
    and no dynamic sampling (RAGEN scripts/runs/run_main_table_diff_algo.sh:232-233); the rest is config."""

    uses_critic = True
    verl_estimator = "gae"

    def advantages(self, batch: TrainBatch, cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
        from verl.trainer.ppo.core_algos import compute_gae_advantage_return

        return compute_gae_advantage_return(
            token_level_rewards=batch.token_rewards,
            values=batch.values,
            response_mask=batch.loss_mask,
            gamma=cfg.gamma,
            lam=cfg.lam,
        )


@register_algorithm("grpo", "drgrpo", "dapo_dynamic")
class GroupRelative(Algorithm):
    """GRPO-family outcome advantages: the episode return minus its group's mean, divided by the group's std unless
    `norm_adv_by_std` is false (Dr.GRPO), broadcast to every generated token. Dr.GRPO drops the std and sums each
    sequence's token losses (seq-mean-token-sum, RAGEN scripts/runs/run_main_table_diff_algo.sh:239); `dapo_dynamic`
    is DAPO as its own paper defines it (Yu et al. 2025: group-relative advantages, clip-higher, token-mean loss,
    dynamic sampling of zero-variance groups), which RAGEN-2 did not run (config)."""

    group_relative = True
    verl_estimator = "grpo"  # with norm_adv_by_std_in_grpo carrying Dr.GRPO's choice

    def advantages(self, batch: TrainBatch, cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

        return compute_grpo_outcome_advantage(
            token_level_rewards=batch.token_rewards,
            response_mask=batch.loss_mask,
            index=batch.group_ids,
            norm_adv_by_std_in_grpo=bool(cfg.norm_adv_by_std),
        )
