"""A stop inside an update, undone (`UpdateUndo`): the models and optimisers kept as the previous step left them.

The phases of a step that leave the model as it was end on a stop and the step is dropped (`recipes.runtime.stop`);
the update changes the model, so the torch trainer (`recipes.torch_trainer.trainer.train_step`) keeps this copy while
its update runs and puts it back when a stop ends the update. The veRL trainer's update runs in its Ray workers to its
end.
"""

from __future__ import annotations

import copy

import torch


class UpdateUndo:
    """The models and optimisers as the previous step left them, kept while the update runs so that a stop inside
    it can put them back (the step is then dropped, as a stop before the update drops it). A copy per step of the
    parameters and the optimiser's state: kept only while that is at most `LIMIT_BYTES` (the tiny model's is about
    24 MB, copied in 25-40 ms: benchmarks/bench_update_undo.py); above it `kept` is false and the update runs to
    its end, as it did before."""

    LIMIT_BYTES = 1 << 30

    def __init__(self, trained: list[tuple[torch.nn.Module, torch.optim.Optimizer]]) -> None:
        self.trained = trained
        self.kept: list[tuple[dict, dict]] | None = None
        if self.size_bytes(trained) <= self.LIMIT_BYTES:
            self.kept = [(copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict()))
                         for model, optimizer in trained]

    @staticmethod
    def size_bytes(trained: list[tuple[torch.nn.Module, torch.optim.Optimizer]]) -> int:
        """Bytes of the parameters and of the optimiser state (Adam's two moments: twice the parameters, counted
        before the first step creates them)."""
        return sum(3 * p.numel() * p.element_size() for model, _ in trained for p in model.parameters())

    def restore(self) -> None:
        """Put the kept models and optimisers back (a no-op when nothing was kept)."""
        if self.kept is None:
            return
        for (model, optimizer), (weights, state) in zip(self.trained, self.kept, strict=True):
            model.load_state_dict(weights)
            optimizer.load_state_dict(state)
