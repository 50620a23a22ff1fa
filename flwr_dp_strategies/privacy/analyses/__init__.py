"""Analyses: privacy amplification by shuffling, comparison bounds and the empirical audit."""
