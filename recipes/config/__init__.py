"""What a run is: the typed training config, composing `conf/` with Hydra, the one resolve (settings -> config and
identity, `recipes.config.resolve`), and the trainer-backend registry."""
