"""orch's own trainer: one process, CPU or one GPU (the `torch` backend: its entry `backend`, its loop `trainer`, its
run state `state`), and the warm start both backends use."""
