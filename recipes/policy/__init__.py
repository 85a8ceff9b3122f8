"""The policy and its tensors: chat transcripts and image frames to tokens, the tiny tokenizer and models, the training
batch, sampling, and the update math (actor losses, advantage estimators)."""
