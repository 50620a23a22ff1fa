"""flwr-dp-strategies: differentially private strategies, client mods and a privacy ledger for Flower.

``flwr_dp_strategies.privacy`` is the Flower-free privacy core (mechanisms,
DpEvents, accountants, :class:`~flwr_dp_strategies.privacy.PrivacyLedger`).
``flwr_dp_strategies.strategy`` holds the Message-API strategies.
"""

from .declarations import declare_release, read_declarations
from .federated_pca import LdpFederatedPCA
from .layer_shuffler import LayerShuffler
from .privacy import PrivacyLedger
from .strategy import (
    AccountedAdaptiveClipping,
    AccountedClientSideAdaptiveClipping,
    AccountedFedAvg,
    AccountedPoissonFixedClipping,
    AccountedServerSideFixedClipping,
    ClusterEvaluation,
    DistributedDpFedAvg,
    MinDivergenceExpSampling,
    NoisyObjectiveSum,
    SecureObjectiveSum,
    ShuffleAmplifiedFedAvg,
    SignDS,
)

__version__ = "0.1.0"

__all__ = [
    "LdpFederatedPCA",
    "AccountedAdaptiveClipping",
    "AccountedClientSideAdaptiveClipping",
    "AccountedFedAvg",
    "AccountedPoissonFixedClipping",
    "AccountedServerSideFixedClipping",
    "ClusterEvaluation",
    "DistributedDpFedAvg",
    "LayerShuffler",
    "MinDivergenceExpSampling",
    "NoisyObjectiveSum",
    "SecureObjectiveSum",
    "ShuffleAmplifiedFedAvg",
    "SignDS",
    "PrivacyLedger",
    "__version__",
    "declare_release",
    "read_declarations",
]
