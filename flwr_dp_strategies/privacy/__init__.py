"""Privacy core: mechanisms, DpEvents, accountants and the privacy ledger.

Nothing here imports Flower, so the core can be tested and reused alone. The modules are grouped by role:

* :mod:`.mechanisms`: each mechanism returns a :class:`Release` (output + its dp-accounting DpEvent);
* :mod:`.accounting`: the custom events and their rules, neighbouring relations, the accountants and the
  :class:`PrivacyLedger`, which composes the events per client and for the federation, with its signed file;
* :mod:`.analyses`: amplification by shuffling, the textbook comparison bounds and the empirical audit;
* :mod:`.validation` and :mod:`.rng`: argument checks and OS-entropy randomness shared by all three.
"""

from typing import TYPE_CHECKING

from ._logging import route_absl_warnings as _route_absl_warnings

if TYPE_CHECKING:  # static analysers and the docs generator see the real names
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

#: each export is imported from its module on first use (PEP 562): importing this package takes no submodule's
#: import lock (see :func:`flwr_dp_strategies._deprecation.resolve_lazy`)
_LAZY = {
    "ApproxDpEvent": ".accounting.events",
    "ExponentialMechanismDpEvent": ".accounting.events",
    "LedgerFileError": ".accounting.ledger_file",
    "LedgerStore": ".accounting.ledger_file",
    "PrivacyBudgetExceeded": ".accounting.ledger",
    "PrivacyLedger": ".accounting.ledger",
    "PrivacyReport": ".accounting.ledger",
    "PureDpEvent": ".accounting.events",
    "Release": ".mechanisms.release",
    "binary_randomized_response": ".mechanisms.randomized_response",
    "exponential_mechanism": ".mechanisms.exponential",
    "flip_probability": ".mechanisms.randomized_response",
    "gaussian_mechanism": ".mechanisms.gaussian",
    "gaussian_sigma": ".mechanisms.gaussian",
    "kary_randomized_response": ".mechanisms.randomized_response",
    "keep_probability": ".mechanisms.randomized_response",
    "laplace_mechanism": ".mechanisms.laplace",
    "laplace_scale": ".mechanisms.laplace",
    "privacy_metrics": ".accounting.ledger",
    "rr_event": ".mechanisms.randomized_response",
    "shuffle_amplified_epsilon": ".analyses.shuffle",
    "shuffle_amplified_event": ".analyses.shuffle",
}

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
    from .._deprecation import resolve_lazy, resolve_moved

    if name in _LAZY:
        return resolve_lazy(__name__, globals(), name, _LAZY)
    return resolve_moved(__name__, name, _MOVED)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
