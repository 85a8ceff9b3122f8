"""orch's part of a training step, written once for every trainer: the torch loop (`recipes.torch_trainer.trainer`)
and veRL's two trainers (`recipes.verl.orch_base.filtered_step`, `OrchTrainerBase.stop_at_step_end`) call the same
functions (`recipes.step.phases`)."""
