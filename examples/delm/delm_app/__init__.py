"""DELM as a Flower app: LDP federated PCA, then functional-mechanism heads aggregated by a DELM strategy."""
