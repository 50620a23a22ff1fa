"""Flower-side helpers that put the privacy ledger's figures into MetricRecords.

Every accounted strategy calls :func:`privacy_metric_record` (or
:func:`with_privacy_metrics`) after it records a release, so that each round's
train metrics carry ``privacy/epsilon`` and ``privacy/delta`` of the worst
client so far (see :meth:`PrivacyLedger.metrics`).

Failed replies. When a SuperNode dies mid-round Flower hands the strategy an
error reply (``reply.has_error()``). Every strategy of this package then goes on
with the valid replies and reports the count of failed ones as the int
``replies/failed`` (:data:`FAILED_REPLIES_KEY`) in the round's train and evaluate
MetricRecords; a failed reply carries no content, so nothing is booked for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from logging import WARNING
from typing import Optional

from flwr.app import Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from ..privacy import PrivacyLedger, privacy_metrics
from .reply_screening import records_of


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


FAILED_REPLIES_KEY = "replies/failed"
MetricsAggregation = Callable[[list[RecordDict], str], MetricRecord]


def aggregate_reply_metrics(fn: MetricsAggregation, contents: Sequence[RecordDict], weighted_by_key: str) -> MetricRecord:
    r"""``fn(contents, weighted_by_key)``, a strategy's ``train_metrics_aggr_fn``.

    Flower's default ``aggregate_metricrecords`` (per key
    :math:`\sum_i (n_i / \sum_j n_j)\, m_i`, lists element-wise, the weight key
    left out) is computed here with the same arithmetic in the same order, reading
    the MetricRecords directly instead of rebuilding each reply's record views.
    """
    if fn is not aggregate_metricrecords:
        return fn(list(contents), weighted_by_key)
    records = [records_of(content, MetricRecord) for content in contents]
    weights = [recs[0][weighted_by_key] for recs in records]
    total = sum(weights)  # type: ignore[arg-type]
    out: dict = {}
    for recs, weight in zip(records, weights, strict=True):
        factor = weight / total  # type: ignore[operator]
        for record in recs:
            for key, value in record.items():
                if key != weighted_by_key:
                    out[key] = _weighted_add(out.get(key), value, factor)
    return MetricRecord(out)


def _weighted_add(current: object, value: object, factor: float) -> object:
    """``current + value·factor`` (``value·factor`` if current is None), element-wise for lists."""
    if isinstance(value, list):
        if current is None:
            return [v * factor for v in value]
        return [c + v * factor for c, v in zip(current, value, strict=True)]  # type: ignore[call-overload]
    return value * factor if current is None else current + value * factor  # type: ignore[operator]


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
    log(WARNING, "Round %d: a reply failed (error %s: %s; sent by node %s in reply to message %s); "
        "counted in replies/failed", server_round, reply.error.code, reply.error.reason,
        reply.metadata.src_node_id, reply.metadata.reply_to_message_id)


def with_failed_replies(metrics: Optional[MetricRecord], failed: int) -> MetricRecord:
    """A new MetricRecord: ``metrics`` (may be None) plus ``replies/failed`` = ``failed`` (an int)."""
    merged = MetricRecord(dict(metrics) if metrics is not None else {})
    merged[FAILED_REPLIES_KEY] = int(failed)
    return merged


__all__ = ["FAILED_REPLIES_KEY", "aggregate_reply_metrics", "failed_replies", "log_failed_reply", "privacy_metric_record",
           "with_failed_replies", "with_privacy_metrics"]
