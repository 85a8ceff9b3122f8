"""orch's own trainer: one process, CPU or one GPU (the `torch` backend), and the warm start both backends use."""
