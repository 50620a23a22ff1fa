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
* ``shape`` - an array's shape or dtype differs from the one the server sent;
* ``non-finite`` - an array holds NaN or ±inf.

The privacy declaration (``declaration``) is checked by the accounting mixin.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Optional

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict

REJECTION_REASONS: tuple[str, ...] = (
    "error", "structure", "weight", "keys", "oversized", "shape", "non-finite", "declaration", "metrics",
    "indices", "values",
)

ArraySpec = Mapping[str, tuple[tuple[int, ...], str, int]]


def array_spec(arrays: ArrayRecord) -> dict[str, tuple[tuple[int, ...], str, int]]:
    """``{key: (shape, dtype, payload bytes)}`` of the arrays the server sends."""
    return {key: (tuple(arr.shape), str(arr.dtype), len(arr.data)) for key, arr in arrays.items()}


def check_weight(content: RecordDict, weighted_by_key: str) -> Optional[str]:
    """``None`` if there is exactly one MetricRecord with a finite positive weight, else the reason."""
    if len(content.metric_records) != 1:
        return "structure"
    metrics = next(iter(content.metric_records.values()))
    value = metrics.get(weighted_by_key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return "weight"
    return None


def screen_train_content(
    content: RecordDict,
    spec: Optional[ArraySpec],
    weighted_by_key: str,
    max_reply_bytes: Optional[int] = None,
) -> Optional[str]:
    """``None`` if a train reply's content is well formed for averaging with ``spec``, else the reason."""
    if len(content.array_records) != 1:
        return "structure"
    reason = check_weight(content, weighted_by_key)
    if reason is not None:
        return reason
    arrays = next(iter(content.array_records.values()))
    if spec is not None and set(arrays.keys()) != set(spec.keys()):
        return "keys"
    total = sum(len(arr.data) for arr in arrays.values())
    if max_reply_bytes is not None and total > max_reply_bytes:
        return "oversized"
    for key, arr in arrays.items():
        reason = _check_array(arr, None if spec is None else spec[key])
        if reason is not None:
            return reason
    return None


def _check_array(arr: Array, expected: Optional[tuple[tuple[int, ...], str, int]]) -> Optional[str]:
    if expected is not None:
        shape, dtype, nbytes = expected
        if len(arr.data) > nbytes + 1024:  # same shape and dtype: a larger payload is not our array
            return "oversized"
        if tuple(arr.shape) != shape or str(arr.dtype) != dtype:
            return "shape"
    try:
        values = arr.numpy()
    except Exception:  # noqa: BLE001 - an undecodable payload is malformed, whatever the error
        return "shape"
    if np.issubdtype(values.dtype, np.inexact) and not np.isfinite(values).all():
        return "non-finite"
    return None


__all__ = ["REJECTION_REASONS", "array_spec", "check_weight", "screen_train_content"]
