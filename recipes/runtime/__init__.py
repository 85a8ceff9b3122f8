"""The process a run lives in: its stop signal, time limit and update undo, seeds, the folder cache, checkpoints,
Hugging Face folder checks."""
