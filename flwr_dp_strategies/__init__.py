"""flwr-dp-strategies: differentially private strategies, client mods and a privacy ledger for Flower.

``flwr_dp_strategies.privacy`` is the Flower-free privacy core (mechanisms,
DpEvents, accountants, :class:`~flwr_dp_strategies.privacy.PrivacyLedger`).
``flwr_dp_strategies.strategy`` holds the Message-API strategies.

The top level exports the strategies, :class:`PrivacyLedger` and the declaration API
(:func:`declare_release`, :func:`read_declarations`) only. Everything else is imported from
its own module: ``flwr_dp_strategies.federated_pca.LdpFederatedPCA``,
``flwr_dp_strategies.layer_shuffler.LayerShuffler``, the mechanisms from
``flwr_dp_strategies.privacy``, the client side from ``client_mods``.
"""

from .declarations import declare_release, read_declarations
from .privacy import PrivacyLedger
from .strategy import (
    AccountedAdaptiveClipping,
    AccountedBandedMatrixFactorization,
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
    "AccountedAdaptiveClipping",
    "AccountedBandedMatrixFactorization",
    "AccountedClientSideAdaptiveClipping",
    "AccountedFedAvg",
    "AccountedPoissonFixedClipping",
    "AccountedServerSideFixedClipping",
    "ClusterEvaluation",
    "DistributedDpFedAvg",
    "MinDivergenceExpSampling",
    "NoisyObjectiveSum",
    "SecureObjectiveSum",
    "ShuffleAmplifiedFedAvg",
    "SignDS",
    "PrivacyLedger",
    "declare_release",
    "read_declarations",
]

#: names that left the top level -> "module:name" (they resolve, with a DeprecationWarning; PEP 562)
_MOVED = {
    "LdpFederatedPCA": "flwr_dp_strategies.federated_pca:LdpFederatedPCA",
    "LayerShuffler": "flwr_dp_strategies.layer_shuffler:LayerShuffler",
}


def __getattr__(name: str):
    from ._deprecation import resolve_moved

    return resolve_moved(__name__, name, _MOVED)
