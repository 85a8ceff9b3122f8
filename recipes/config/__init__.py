"""What a run is: the typed training config, composing `conf/` with Hydra, and the trainer-backend registry."""
