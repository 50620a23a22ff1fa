"""Experiment scaffolding for the examples, benchmarks and tests: **not the library**.

Data loaders (:mod:`.datasets`), partition scenarios (:mod:`.scenarios`), the
seeds' non-federated baselines (:mod:`.baselines`), plain training loops
(:mod:`.training`), random feature maps for the DELM experiments
(:mod:`.feature_maps`) and the in-process Flower runner the example demos share
(:mod:`.simulation`). Nothing in :mod:`flwr_dp_strategies` or :mod:`client_mods`
imports this package; its API may change with the experiments it serves.
"""
