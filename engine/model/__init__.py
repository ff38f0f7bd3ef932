"""Llama-family models: config, weights loaders (HF directory, GGUF import), tokenizer."""
