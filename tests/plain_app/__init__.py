"""A plain Flower app (FedAvg in its ServerApp), used to check that our strategies are drop-in."""
