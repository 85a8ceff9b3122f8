"""DAPO's dynamic sampling (the "refill"): the single rule every backend runs (`algorithm.dynamic_sampling`).

The rule is veRL's DAPO recipe ("filter_groups": verl-project/verl-recipe at 48ea0a7, `dapo/dapo_ray_trainer.py`,
the recipe that veRL 0.9.1's `algorithm.filter_groups` config serves, verl/trainer/config/algorithm.py:43-59; veRL's
docs/algo/dapo.md:69-107 at v0.9.0 describes it), *gather and cut*:

* generate a batch of G prompts x K samples (`dapo/dapo_ray_trainer.py:152-154`: `num_gen_batches += 1`);
* keep its groups whose episode returns have a non-zero spread (`:251-264`: per prompt `np.std(metric) > 0`; orch
  tests it as the filter does, `recipes.stats.filtering.group_stats`' `zero_variance`: std within 1e-10 of 0) and
  add them to what earlier batches gathered (`:266-274`: `num_prompt_in_batch += ...`, `DataProto.concat`);
* stop once G groups are gathered and cut to exactly G, the first gathered first (`:276-294`:
  `num_prompt_in_batch >= train_batch_size`, then `batch[:train_batch_size * n]`); otherwise generate another
  batch, up to a cap on the batches (`:279-280`: `max_num_gen_batches`).

Where orch differs from the recipe, and why:

* the cap: orch's `algorithm.max_extra_gen_batches` counts the batches *after* the first, so veRL's
  `max_num_gen_batches` is `1 + max_extra_gen_batches` (orch has no "no limit": a step's extra prompts are fixed
  seeds, `recipes.runtime.seeds.train_prompt_seeds`, written ahead of the run for the veRL backend);
* the cap reached with fewer than G groups: the recipe raises (`:284-290`, "Generated too many"); orch trains on
  what was gathered (a smaller update batch, every group of it with reward variance: the recipe's invariant that
  the update never holds a zero-variance group), because a tiny model on a hard task reaches the cap routinely and
  a sweep cell must not die of it. Gathered nothing at all: the update batch is the first generation batch as it
  is (every group zero-variance), so the step's hooks, filter, rollout table and empty-step count run on a real
  rollout as on any step (under group-relative advantages its groups carry no task gradient);
* a group of one sample: the recipe keeps it (`:264`); orch's groups have >= 2 samples
  (`recipes.stats.filtering.group_stats` refuses fewer), so the case does not arise.

Why this rule for every backend: it is the reference's, and of the two orch ran before it is the one that keeps
DAPO's point, an update whose every group has a gradient. The veRL backends' "swap" (zero-variance groups of the
first batch replaced, in order, by groups with variance of the extra batches) chose the same groups with variance,
but left the ones it could not replace in the update batch, diluting a token-mean loss with groups of zero
advantage; the torch backend gathered and cut as here, but counted the groups before the cut.

The metrics, one meaning on every backend: `rollout/gen_batches` the generation batches the step drew (the
recipe's `train/num_gen_batches`, `:418`; 1 without dynamic sampling) and `rollout/dynamic_sampling_groups` the
groups with reward variance in the update batch (at most G; 0 when nothing was gathered).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

GEN_BATCHES = "rollout/gen_batches"
GROUPS = "rollout/dynamic_sampling_groups"


@dataclass(frozen=True)
class Gathered:
    """The update batch gather-and-cut chose: `parts` pairs each generation batch drawn (the caller's object, in
    order) with the keep-mask over its rows; `groups` the groups with reward variance among the kept rows."""

    parts: list[tuple[Any, np.ndarray]] = field(default_factory=list)
    groups: int = 0

    @property
    def gen_batches(self) -> int:
        return len(self.parts)

    def metrics(self) -> dict[str, float]:
        return {GEN_BATCHES: float(self.gen_batches), GROUPS: float(self.groups)}


def gather_groups(batches: Iterable[tuple[Any, Any, Any]], groups: int, max_gen_batches: int) -> Gathered:
    """DAPO's gather and cut (the module's docstring) over `batches`, drawn lazily: each item is `(batch, returns,
    group_ids)`, a generation batch (any object: it is handed back in `parts`), its rows' episode returns and group
    keys (a group's rows need not be consecutive). Draws until `groups` groups with reward variance are gathered or
    `max_gen_batches` batches are drawn (or `batches` ends), so a batch that is not needed is never generated."""
    from recipes.stats.filtering import group_stats

    if groups < 1 or max_gen_batches < 1:
        raise ValueError(f"groups ({groups}) and max_gen_batches ({max_gen_batches}) must be >= 1")
    parts: list[tuple[Any, np.ndarray]] = []
    gathered = 0
    for batch, returns, group_ids in batches:
        ids = np.asarray(group_ids)
        stats = group_stats(returns, ids)
        chosen = [key for key, zero in zip(stats.keys, stats.zero_variance, strict=True) if not zero]
        chosen = chosen[: groups - gathered]  # the cut: the first gathered first, exactly `groups` in all
        parts.append((batch, np.isin(ids, chosen)))
        gathered += len(chosen)
        if gathered >= groups or len(parts) >= max_gen_batches:
            break
    if not parts:
        raise ValueError("no generation batch: `batches` is empty")
    if not gathered:  # nothing with variance up to the cap: the first batch as it is
        first = parts[0]
        parts = [(first[0], np.ones_like(first[1]))] + [(batch, np.zeros_like(keep)) for batch, keep in parts[1:]]
    return Gathered(parts, gathered)
