"""The process a run lives in: its stop signal, seeds, the folder cache, checkpoints, Hugging Face folder checks."""
