"""Accuracy of a model variant against the unmodified model: perplexity, KL, top-1 and greedy agreement."""
