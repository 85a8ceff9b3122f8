"""The trainers and the paper's statistics, in rooms by concern. A room imports from its own modules and from the
rooms before it in this order (tests/test_layers.py checks it, the modules named in strings included):

    runtime        the process a run lives in: stop signal, time limit, update undo, seeds, folder cache, checkpoints,
                   HF folder checks
    policy         chat and image tokens, tokenizer, models, the training batch, sampling, actor losses, algorithms
    stats          the paper's statistics: SNR-Aware Filtering, MI proxies, cross-scoring, the collapse alert,
                   rollout statistics and the rollout-batch format
    diagnostics    the step-hook contract and the collapse hook
    config         the typed training config, Hydra composition of conf/, the one resolve (settings -> config
                   and identity), the trainer-backend registry
    run            one training run: its start on its backend as the checkpoint folder's one writer
                   (`run_training`), its MLflow record, progress
    step           orch's phases of a training step, once for every trainer: hooks, the filter, the rollout table,
                   the empty step and its stop, the stop at a step's end
    torch_trainer  the `torch` backend (one process: entry, loop, run state) and the warm start both backends use
    verl           the `verl` backend: veRL's trainer with orch's plug-in
    trained        evaluating and exporting a trained policy
    train_cli      `orch train`
"""
