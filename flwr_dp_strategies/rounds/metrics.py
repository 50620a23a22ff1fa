"""Flower-side helpers that put the privacy ledger's figures into MetricRecords.

Every accounted strategy calls :func:`privacy_metric_record` (or
:func:`with_privacy_metrics`) after it records a release, so that each round's
train metrics carry ``privacy/epsilon`` and ``privacy/delta`` of the worst
client so far (see :meth:`PrivacyLedger.metrics`).

Failed replies. When a SuperNode dies mid-round Flower hands the strategy an
error reply (``reply.has_error()``). Every strategy of this package then goes on
with the valid replies, logs each failed one (:func:`log_failed_reply`) and counts
it with the rejected ones on the server (reason ``error``, see
:mod:`.client_accounting`), never in the round's metrics: a training run that fails
on its data is a data-dependent event. A failed reply carries no content, so
nothing is booked for it.
"""

from __future__ import annotations

import math

from collections.abc import Callable, Iterable, Sequence
from logging import WARNING
from typing import Any, Optional, cast

from flwr.app import Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from ..privacy import PrivacyLedger, privacy_metrics
from .reply_screening import records_of


def privacy_metric_record(ledger: PrivacyLedger, *, central_covers_replies: bool = False) -> MetricRecord:
    """The ledger's round metrics as a :class:`MetricRecord` (all values ``float``).

    Keys: ``privacy/epsilon``, ``privacy/delta``, ``privacy/epsilon-rdp``,
    ``privacy/clients`` and, when available, ``privacy/epsilon-pld`` and
    ``privacy/max-epsilon``; with record-level bookings also ``privacy/epsilon-record-level`` and
    ``privacy/epsilon-client-level`` (``central_covers_replies``: see
    :meth:`PrivacyLedger.client_level_report`). MetricRecord rejects ``bool``, so every value is
    cast to ``float``.
    """
    figures = privacy_metrics(ledger, central_covers_replies=central_covers_replies)
    return MetricRecord({key: float(value) for key, value in figures.items()})


def with_privacy_metrics(
    metrics: MetricRecord | None, ledger: PrivacyLedger, *, central_covers_replies: bool = False
) -> MetricRecord:
    """A new MetricRecord: ``metrics`` (may be None) updated with the ledger's privacy metrics.

    Privacy keys overwrite client-reported keys of the same name, so a client
    cannot report its own ``privacy/epsilon``.
    """
    merged = MetricRecord(dict(metrics) if metrics is not None else {})
    for key, value in privacy_metric_record(ledger, central_covers_replies=central_covers_replies).items():
        merged[key] = value
    return merged


MetricsAggregation = Callable[[list[RecordDict], str], MetricRecord]


def aggregate_reply_metrics(
    fn: MetricsAggregation, contents: Sequence[RecordDict], weighted_by_key: str
) -> MetricRecord:
    r"""``fn(contents, weighted_by_key)``, a strategy's ``train_metrics_aggr_fn`` / ``evaluate_metrics_aggr_fn``.

    For Flower's default ``aggregate_metricrecords`` the weighted mean is computed
    here, per key over the replies that carry it, and it never raises:

    .. math:: \bar m_k = \sum_{i \in S_k} \frac{n_i}{\sum_{j \in S_k} n_j}\, m_{i,k},

    S_k = the replies whose MetricRecord holds key k (the weight key left out).
    Lists are averaged element-wise per index over the replies whose list is long
    enough (per-class lists of different lengths give a list as long as the longest);
    a scalar beside lists under the same key counts as a one-element list. When every
    reply carries the same keys with the same lengths (the normal case) this is
    Flower's arithmetic in Flower's order, bit for bit: factor :math:`n_i/\sum_j n_j`
    then a running sum. A non-finite result from finite inputs (values near the
    float range overflowing the running sum) is recomputed scaled by the largest
    :math:`|m_{i,k}|`, which cannot overflow (a weighted mean lies within the values'
    range). Replies are screened first (one MetricRecord, finite values, finite
    positive bounded weights: :mod:`.reply_screening`).
    """
    if fn is not aggregate_metricrecords:
        return fn(list(contents), weighted_by_key)
    columns: dict[str, list[tuple[float, Any]]] = {}
    for content in contents:
        for record in records_of(content, MetricRecord):
            weight = cast(float, record[weighted_by_key])  # screened: a finite positive number
            for key, value in record.items():
                if key != weighted_by_key:
                    columns.setdefault(key, []).append((weight, value))
    means: dict[str, Any] = {key: _mean_of_column(column) for key, column in columns.items()}
    return MetricRecord(means)


def _mean_of_column(column: list[tuple[float, Any]]) -> Any:
    """The weighted mean of one key's values: a scalar if all are scalars, else element-wise per index."""
    if not any(isinstance(value, list) for _, value in column):
        return _weighted_mean(column)
    lists = [(w, v if isinstance(v, list) else [v]) for w, v in column]
    length = max(len(v) for _, v in lists)
    return [_weighted_mean([(w, v[j]) for w, v in lists if len(v) > j]) for j in range(length)]


def _weighted_mean(pairs: list[tuple[float, float]]) -> float:
    """Σ (w_i/Σw) v_i as Flower computes it; rescaled by max |v| if that overflows."""
    total = sum(w for w, _ in pairs)
    acc: Optional[float] = None
    for weight, value in pairs:
        term = value * (weight / total)
        acc = term if acc is None else acc + term
    if acc is not None and not math.isfinite(acc) and all(math.isfinite(v) for _, v in pairs):
        scale = max(abs(float(v)) for _, v in pairs)
        acc = scale * math.fsum((w / total) * (float(v) / scale) for w, v in pairs)
    assert acc is not None  # a column holds at least one value
    return acc


def failed_replies(replies: Iterable[Message], server_round: Optional[int] = None) -> int:
    """How many replies carry an error instead of content; each is logged (WARNING) with its reason."""
    failed = 0
    for reply in replies:
        if reply.has_error():
            failed += 1
            if server_round is not None:
                log_failed_reply(server_round, reply)
    return failed


def log_failed_reply(server_round: int, reply: Message) -> None:
    """Log one failed reply: Flower's error code and reason, and the message it answers.

    When a SuperNode dies, the SuperLink itself answers for it (``NODE_UNAVAILABLE``),
    so the reply's source is the SuperLink, not the lost node: the log names the
    message the error replies to instead of guessing the node.
    """
    log(
        WARNING,
        "Round %d: a reply failed (error %s: %s; sent by node %s in reply to message %s); not aggregated",
        server_round,
        reply.error.code,
        reply.error.reason,
        reply.metadata.src_node_id,
        reply.metadata.reply_to_message_id,
    )


__all__ = [
    "aggregate_reply_metrics",
    "failed_replies",
    "log_failed_reply",
    "privacy_metric_record",
    "with_privacy_metrics",
]
