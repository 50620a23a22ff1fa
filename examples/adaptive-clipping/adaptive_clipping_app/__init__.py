"""A Flower app: user-level central DP with adaptive clipping on sklearn digits (``flwr run .``)."""
