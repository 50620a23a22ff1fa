"""Offline stand-ins for the three things Flower's examples download or cannot import here.

* :mod:`offline_shims.hf` - ``FederatedDataset`` and ``load_dataset`` with the same call
  shape as flwr-datasets / Hugging Face ``datasets``, served from local data (MNIST from
  ``$FLWR_DP_DATA_DIR`` or ``../shared/data``, scikit-learn's embedded iris); the real
  flwr-datasets partitioners still cut the partitions.
* :mod:`offline_shims.transforms` - ``Compose``, ``ToTensor`` and ``Normalize`` as plain torch
  ops (torchvision from PyPI does not import beside torch 2.13 CPU).

Each fixture app changes only its import lines to use these (see ``tests/flower_examples/README.md``).
"""
