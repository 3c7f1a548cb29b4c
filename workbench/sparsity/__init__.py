"""Sparsity as a research dimension: FFN activation sparsity, N:M weight pruning, attention windows."""
