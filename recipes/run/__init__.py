"""One training run, for every trainer backend: its start on the backend it names, as the one writer of its
checkpoint folder (`training.run_training`), its record in MLflow (`tracking`) and its progress (`progress`).
(`recipes/runtime/` is the process the run lives in: stop signal, time limit, seeds, cache, checkpoint files.)"""
