"""Distributed DP (SecAgg+ and Skellam noise) with Flower: the server only ever sees the noisy sum."""
