"""Privacy core: mechanisms, DpEvents, accountants and the privacy ledger.

Nothing here imports Flower, so the core can be tested and reused alone.
Every mechanism returns a :class:`Release` (output + dp-accounting DpEvent);
:class:`PrivacyLedger` composes the events per client and for the federation.
"""

from ._logging import route_absl_warnings as _route_absl_warnings
from .accountants import LedgerPldAccountant, LedgerRdpAccountant
from .bounds import amplify_by_subsampling, basic_composition, strong_composition, textbook_bounds
from .events import ApproxDpEvent, ExponentialMechanismDpEvent, PureDpEvent, event_from_dict, event_to_dict
from .exponential import exponential_mechanism, gumbel_top_k
from .gaussian import classical_gaussian_sigma, gaussian_mechanism, gaussian_sigma
from .laplace import laplace_mechanism, laplace_scale
from .ledger import PrivacyBudgetExceeded, PrivacyLedger, PrivacyReport, privacy_metrics
from .ledger_file import LedgerFileError, LedgerStore
from .randomized_response import (
    binary_randomized_response,
    flip_probability,
    kary_randomized_response,
    keep_probability,
    rr_event,
)
from .release import Release
from .shuffle import shuffle_amplified_epsilon, shuffle_amplified_event

# dp-accounting's absl warnings must never add a root log handler (every Flower line would print twice)
_route_absl_warnings()

__all__ = [
    "ApproxDpEvent",
    "ExponentialMechanismDpEvent",
    "LedgerFileError",
    "LedgerPldAccountant",
    "LedgerRdpAccountant",
    "LedgerStore",
    "PrivacyBudgetExceeded",
    "PrivacyLedger",
    "PrivacyReport",
    "PureDpEvent",
    "Release",
    "amplify_by_subsampling",
    "basic_composition",
    "binary_randomized_response",
    "classical_gaussian_sigma",
    "event_from_dict",
    "event_to_dict",
    "exponential_mechanism",
    "flip_probability",
    "gaussian_mechanism",
    "gaussian_sigma",
    "gumbel_top_k",
    "kary_randomized_response",
    "keep_probability",
    "laplace_mechanism",
    "laplace_scale",
    "privacy_metrics",
    "rr_event",
    "shuffle_amplified_epsilon",
    "shuffle_amplified_event",
    "strong_composition",
    "textbook_bounds",
]

#: internal helpers that left this package's surface -> "module:name" (DeprecationWarning; PEP 562)
_MOVED = {"resolve_rng": "flwr_dp_strategies.privacy.rng:resolve_rng"}


def __getattr__(name: str):
    from .._deprecation import resolve_moved

    return resolve_moved(__name__, name, _MOVED)
