"""Benchmarks: our engine (and optionally llama.cpp) on the same GGUF, prompt, lengths and threads."""
