"""The accounting options every strategy of this package takes, defined once.

Every exported strategy takes its Flower parent's arguments (in the parent's order), its own keyword-only
arguments, and the same accounting options as ``**accounting`` (:class:`AccountingOptions`): where the ledger
lives, how a restart continues it, what is published per client, and the limits of reply screening. The
template (:meth:`.template.AccountedRound.init_accounted_round`) validates them and applies the defaults; a
strategy never lists them again::

    AccountedPoissonFixedClipping(FedAdam(), 1.0, 0.5, num_clients=1000, ledger_path="run.ledger.json", resume=True)

    options: AccountingOptions = {"ledger_path": "run.ledger.json", "per_client_metrics": True}
    AccountedFedAvg(**options)  # a type checker sees each key's type (PEP 692)

An unknown option raises ``TypeError`` naming it, as a misspelt keyword argument does in Python.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional, TypedDict, Union

from ..privacy import PrivacyLedger
from .client_metrics import EvaluateMetrics

PathLike = Union[str, "os.PathLike[str]"]


class AccountingOptions(TypedDict, total=False):
    """The keyword-only accounting options of every strategy (all optional).

    Attributes:
        ledger: the ledger to book into (default: a new ``PrivacyLedger(1e-5)`` under the strategy's relation:
            add/remove-one for central DP, replace-one for client-declared releases).
        ledger_path: JSON file the ledger is saved to after every booking (authenticated with
            ``$FLWR_DP_LEDGER_KEY`` when set), so a restarted ServerApp loses nothing.
        resume: False (default): a new run; a ledger file already at ``ledger_path`` is refused, never
            overwritten. True: continue the run whose ledger is at ``ledger_path``; no file there, or one that is
            not the latest save of that run at that path, is refused (never a fresh start).
        high_water_path: where the ledger's high-water mark is kept (default ``<ledger_path>.hwm``); on storage
            the attacker cannot write, a rollback of the ledger file is refused even together with the default
            location's copy (:mod:`flwr_dp_strategies.privacy.accounting.ledger_file`).
        per_client_metrics: also publish ``privacy/epsilon/node-<id>`` per node (default False).
        max_reply_bytes: reject a train reply whose arrays' payloads (``.npy`` headers not counted) exceed this
            many bytes (``oversized``; default: no limit), checked by the template before the strategy's own
            screening.
        max_weight: reject replies whose ``weighted_by_key`` is not in (0, max_weight] (``weight``; default
            1e9, :data:`.reply_screening.DEFAULT_MAX_WEIGHT`; a wrapper's default is its wrapped strategy's).
        evaluate_metrics: how the clients' evaluate metrics are published (:mod:`.client_metrics`):
            ``AccountedMetrics(ranges, noise_multiplier)`` (default: no declared range, so none) releases each
            declared metric as a noised bounded mean booked in the ledger; ``"flower"`` publishes Flower's mean
            un-noised and books the round non-private.
    """

    ledger: Optional[PrivacyLedger]
    ledger_path: Optional[PathLike]
    resume: bool
    high_water_path: Optional[PathLike]
    per_client_metrics: bool
    max_reply_bytes: Optional[int]
    max_weight: Optional[float]
    evaluate_metrics: EvaluateMetrics


#: the option names, in the order the docs list them
ACCOUNTING_OPTIONS: tuple[str, ...] = tuple(AccountingOptions.__annotations__)


def split_accounting(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(accounting options, the rest)`` of ``kwargs``: for a constructor whose ``**kwargs`` also carry a Flower
    subclass's own arguments (``AccountedFedAvg`` combined with ``FedProx``)."""
    options = {key: value for key, value in kwargs.items() if key in ACCOUNTING_OPTIONS}
    return options, {key: value for key, value in kwargs.items() if key not in ACCOUNTING_OPTIONS}


def check_accounting(accounting: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """``accounting`` as a dict, after refusing a name that is not an option (``TypeError`` naming it, and the
    constructor ``owner``); the values are validated where they are used (:meth:`init_accounted_round`)."""
    unknown = sorted(set(accounting) - set(ACCOUNTING_OPTIONS))
    if unknown:
        raise TypeError(
            f"{owner}() got an unexpected keyword argument {unknown[0]!r} (accounting options: "
            f"{', '.join(ACCOUNTING_OPTIONS)})"
        )
    return dict(accounting)


__all__ = ["ACCOUNTING_OPTIONS", "AccountingOptions", "check_accounting", "split_accounting"]
