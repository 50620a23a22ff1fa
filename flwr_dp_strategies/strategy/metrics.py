"""Flower-side helpers that put the privacy ledger's figures into MetricRecords.

Every accounted strategy calls :func:`privacy_metric_record` (or
:func:`with_privacy_metrics`) after it records a release, so that each round's
train metrics carry ``privacy/epsilon`` and ``privacy/delta`` of the worst
client so far (see :meth:`PrivacyLedger.metrics`).
"""

from __future__ import annotations

from flwr.app import MetricRecord

from ..privacy import PrivacyLedger, privacy_metrics


def privacy_metric_record(ledger: PrivacyLedger) -> MetricRecord:
    """The ledger's round metrics as a :class:`MetricRecord` (all values ``float``).

    Keys: ``privacy/epsilon``, ``privacy/delta``, ``privacy/epsilon-rdp``,
    ``privacy/clients`` and, when available, ``privacy/epsilon-pld`` and
    ``privacy/max-epsilon``. MetricRecord rejects ``bool``, so every value is
    cast to ``float``.
    """
    return MetricRecord({key: float(value) for key, value in privacy_metrics(ledger).items()})


def with_privacy_metrics(metrics: MetricRecord | None, ledger: PrivacyLedger) -> MetricRecord:
    """A new MetricRecord: ``metrics`` (may be None) updated with the ledger's privacy metrics.

    Privacy keys overwrite client-reported keys of the same name, so a client
    cannot report its own ``privacy/epsilon``.
    """
    merged = MetricRecord(dict(metrics) if metrics is not None else {})
    for key, value in privacy_metric_record(ledger).items():
        merged[key] = value
    return merged


__all__ = ["privacy_metric_record", "with_privacy_metrics"]
