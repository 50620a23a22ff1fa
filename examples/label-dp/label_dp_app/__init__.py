"""Vertical (split) federated learning with label differential privacy (seed 003), Flower Message API.

The ServerApp is the *label party* (it holds the labels and the top model); each
ClientApp is a *feature party* holding a disjoint slice of the features of the
same samples and a bottom model. See the example's README.md.
"""
