"""Screening of client replies before aggregation: reject what is malformed, keep the round going.

Flower's FedAvg aborts a whole round's aggregation (``InconsistentMessageReplies``)
when one reply has two ArrayRecords or different keys, and it averages NaN
into the global model without a word. Every accounted strategy instead screens
each reply on its own, drops the bad ones with a named reason and reports the
counts in the round's metrics (``rejected/<reason>``), then aggregates the rest.

Checks on a train reply, in order (the first failing one is the reason):

* ``structure`` - not exactly one ArrayRecord and one MetricRecord;
* ``weight`` - the MetricRecord lacks ``weighted_by_key`` or its value is not a
  finite number > 0;
* ``keys`` - the ArrayRecord's keys differ from those the server sent;
* ``oversized`` - an array's payload exceeds what the server sent for it
  (or ``max_reply_bytes`` in total);
* ``shape`` - an array's shape or dtype differs from the one the server sent
  (both the ``Array``'s metadata and its ``.npy`` header are compared), or its
  payload is not a readable numeric ``.npy``;
* ``non-finite`` - an array holds NaN or ±inf (skipped with
  ``check_values=False`` by a strategy whose streaming aggregation detects
  non-finite replies itself, at no extra pass over the values).

Payloads are read zero-copy (:func:`.streaming_aggregation.npy_view`): screening
never decodes a copy of a well-formed reply.

The privacy declaration (``declaration``) is checked by the accounting mixin.
Replies with an error (a SuperNode that died mid-round) are not screened: the
mixin counts them as ``replies/failed``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Optional, TypeVar

from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from .streaming_aggregation import all_finite, npy_view

REJECTION_REASONS: tuple[str, ...] = (
    "error", "structure", "weight", "keys", "oversized", "shape", "non-finite", "declaration", "metrics",
    "indices", "values",
)

ArraySpec = Mapping[str, tuple[tuple[int, ...], str, int]]
R = TypeVar("R", ArrayRecord, MetricRecord, ConfigRecord)


def records_of(content: RecordDict, kind: type[R]) -> list[R]:
    """``content``'s records of one type, in order.

    Read directly: Flower's ``content.array_records`` / ``metric_records`` /
    ``config_records`` build and re-validate a synced dict on every access, which
    costs more per reply than adding a small model.
    """
    return [record for record in content.values() if isinstance(record, kind)]


def named_record(content: RecordDict, name: str, kind: type[R]) -> Optional[R]:
    """``content.<kind>_records.get(name)``, without building that view."""
    record = content[name] if name in content else None
    return record if isinstance(record, kind) else None


def has_config_record(content: RecordDict, name: str) -> bool:
    """``name in content.config_records``, without building that view."""
    return named_record(content, name, ConfigRecord) is not None


def array_spec(arrays: ArrayRecord) -> dict[str, tuple[tuple[int, ...], str, int]]:
    """``{key: (shape, dtype, payload bytes)}`` of the arrays the server sends."""
    return {key: (tuple(arr.shape), str(arr.dtype), len(arr.data)) for key, arr in arrays.items()}


def check_weight(content: RecordDict, weighted_by_key: str) -> Optional[str]:
    """``None`` if there is exactly one MetricRecord with a finite positive weight, else the reason."""
    metric_records = records_of(content, MetricRecord)
    if len(metric_records) != 1:
        return "structure"
    value = metric_records[0].get(weighted_by_key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return "weight"
    return None


def screen_train_content(
    content: RecordDict,
    spec: Optional[ArraySpec],
    weighted_by_key: str,
    max_reply_bytes: Optional[int] = None,
    check_values: bool = True,
) -> Optional[str]:
    """``None`` if a train reply's content is well formed for averaging with ``spec``, else the reason.

    ``check_values=False`` skips the NaN/inf scan (the caller's aggregation must detect them).
    """
    array_records = records_of(content, ArrayRecord)
    if len(array_records) != 1:
        return "structure"
    reason = check_weight(content, weighted_by_key)
    if reason is not None:
        return reason
    arrays = array_records[0]
    if spec is not None and set(arrays.keys()) != set(spec.keys()):
        return "keys"
    total = sum(len(arr.data) for arr in arrays.values())
    if max_reply_bytes is not None and total > max_reply_bytes:
        return "oversized"
    for key, arr in arrays.items():
        reason = _check_array(arr, None if spec is None else spec[key], check_values)
        if reason is not None:
            return reason
    return None


def _check_array(
    arr: Array, expected: Optional[tuple[tuple[int, ...], str, int]], check_values: bool = True
) -> Optional[str]:
    if expected is not None:
        shape, dtype, nbytes = expected
        if len(arr.data) > nbytes + 1024:  # same shape and dtype: a larger payload is not our array
            return "oversized"
        if tuple(arr.shape) != shape or str(arr.dtype) != dtype:
            return "shape"
    try:
        values = npy_view(arr)
    except Exception:  # noqa: BLE001 - an undecodable payload is malformed, whatever the error
        return "shape"
    if values.dtype.kind not in "biufc":
        return "shape"
    if expected is not None and (values.shape != expected[0] or values.dtype != expected[1]):
        return "shape"  # the payload's own header disagrees with the metadata
    if check_values and not all_finite(values):
        return "non-finite"
    return None


__all__ = ["REJECTION_REASONS", "array_spec", "check_weight", "has_config_record", "named_record", "records_of",
           "screen_train_content"]
