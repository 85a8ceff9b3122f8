"""What is done with a trained policy: evaluation runs (torch or vLLM sampling) and Hugging Face exports."""
