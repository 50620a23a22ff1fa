"""Privacy core: mechanisms, DpEvents, accountants and the privacy ledger.

Nothing here imports Flower, so the core can be tested and reused alone. The modules are grouped by role:

* :mod:`.mechanisms`: each mechanism returns a :class:`Release` (output + its dp-accounting DpEvent);
* :mod:`.accounting`: the custom events and their rules, neighbouring relations, the accountants and the
  :class:`PrivacyLedger`, which composes the events per client and for the federation, with its signed file;
* :mod:`.analyses`: amplification by shuffling, the textbook comparison bounds and the empirical audit;
* :mod:`.validation` and :mod:`.rng`: argument checks and OS-entropy randomness shared by all three.
"""

from ._logging import route_absl_warnings as _route_absl_warnings
from .accounting.events import ApproxDpEvent, ExponentialMechanismDpEvent, PureDpEvent
from .mechanisms.exponential import exponential_mechanism
from .mechanisms.gaussian import gaussian_mechanism, gaussian_sigma
from .mechanisms.laplace import laplace_mechanism, laplace_scale
from .accounting.ledger import PrivacyBudgetExceeded, PrivacyLedger, PrivacyReport, privacy_metrics
from .accounting.ledger_file import LedgerFileError, LedgerStore
from .mechanisms.randomized_response import (
    binary_randomized_response,
    flip_probability,
    kary_randomized_response,
    keep_probability,
    rr_event,
)
from .mechanisms.release import Release
from .analyses.shuffle import shuffle_amplified_epsilon, shuffle_amplified_event

# dp-accounting's absl warnings must never add a root log handler (every Flower line would print twice)
_route_absl_warnings()

__all__ = [
    "ApproxDpEvent",
    "ExponentialMechanismDpEvent",
    "LedgerFileError",
    "LedgerStore",
    "PrivacyBudgetExceeded",
    "PrivacyLedger",
    "PrivacyReport",
    "PureDpEvent",
    "Release",
    "binary_randomized_response",
    "exponential_mechanism",
    "flip_probability",
    "gaussian_mechanism",
    "gaussian_sigma",
    "kary_randomized_response",
    "keep_probability",
    "laplace_mechanism",
    "laplace_scale",
    "privacy_metrics",
    "rr_event",
    "shuffle_amplified_epsilon",
    "shuffle_amplified_event",
]

#: names that left this package's surface (internal helpers, the comparison bounds, the accountants behind the
#: ledger, the event codec) -> "module:name" (DeprecationWarning; PEP 562)
_MOVED = {
    "resolve_rng": "flwr_dp_strategies.privacy.rng:resolve_rng",
    "LedgerPldAccountant": "flwr_dp_strategies.privacy.accounting.accountants:LedgerPldAccountant",
    "LedgerRdpAccountant": "flwr_dp_strategies.privacy.accounting.accountants:LedgerRdpAccountant",
    "amplify_by_subsampling": "flwr_dp_strategies.privacy.analyses.bounds:amplify_by_subsampling",
    "basic_composition": "flwr_dp_strategies.privacy.analyses.bounds:basic_composition",
    "strong_composition": "flwr_dp_strategies.privacy.analyses.bounds:strong_composition",
    "textbook_bounds": "flwr_dp_strategies.privacy.analyses.bounds:textbook_bounds",
    "event_from_dict": "flwr_dp_strategies.privacy.accounting.events:event_from_dict",
    "event_to_dict": "flwr_dp_strategies.privacy.accounting.events:event_to_dict",
    "gumbel_top_k": "flwr_dp_strategies.privacy.mechanisms.exponential:gumbel_top_k",
    "classical_gaussian_sigma": "flwr_dp_strategies.privacy.mechanisms.gaussian:classical_gaussian_sigma",
}


def __getattr__(name: str):
    from .._deprecation import resolve_moved

    return resolve_moved(__name__, name, _MOVED)
