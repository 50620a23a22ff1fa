"""DP-FTRL with banded matrix factorisation, as a Flower app (``flwr run examples/bandmf``)."""
