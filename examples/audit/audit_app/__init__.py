"""A Flower app: a canary audit of a central-DP run on sklearn digits (``flwr run .``)."""
