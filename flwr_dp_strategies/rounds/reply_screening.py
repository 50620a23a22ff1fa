"""Screening of client replies before aggregation: reject what is malformed, keep the round going.

Flower's FedAvg aborts a whole round's aggregation (``InconsistentMessageReplies``)
when one reply has two ArrayRecords or different keys, and it averages NaN
into the global model without a word. Every strategy of this package instead
puts each train *and* evaluate reply through this one screening path (driven by
:meth:`.client_accounting.ClientAccountingMixin.screen`), drops the bad
ones with a named reason, counts them per reason on the server (log and
``rejections``, never the round's metrics: :mod:`.client_accounting`), then aggregates the
rest. Whether a reply is accepted depends on that reply alone (and on what the
server sent), never on the other replies of the round: one added client cannot
change which others are aggregated.

Reasons (:data:`REJECTION_REASONS`; the first failing check names the rejection):

* ``error`` - a failed reply (a SuperNode that died mid-round); nothing is booked
  for it;
* ``identity`` - the reply's source node was sent no instruction of this phase in
  this round (checked against the node ids and message ids of the messages the
  strategy's ``configure_train`` / ``configure_evaluate`` returned), or the node
  already replied in this round: the *first* reply of a node is screened
  normally, every later one is rejected (Flower's SuperLink accepts one reply
  per instruction, so a second one is never legitimate). Identity rejections are
  dropped unread: nothing is booked for them (see :mod:`.client_accounting`);
* ``declaration`` - an unreadable or unaccountable privacy declaration (checked by
  the mixin, :mod:`flwr_dp_strategies.declarations` bounds its size and depth);
* ``structure`` - not exactly one MetricRecord (train: and exactly one ArrayRecord);
* ``weight`` - the MetricRecord's ``weighted_by_key`` is missing, not a single
  int/float (a list, a bool), not finite, ``<= 0`` or above ``max_weight``
  (default :data:`DEFAULT_MAX_WEIGHT` = 1e9 examples: large enough for any real
  client, small enough that a sum of 10^6 such weights, and a weight times a
  float32 value, stays finite);
* ``metrics`` - a metric value (scalar or list element) is NaN or ±inf: the whole
  reply is rejected (its update came from a diverged or corrupted run), so NaN
  never reaches the round's aggregated metrics;
* ``keys`` - the ArrayRecord's keys differ from those the server sent;
* ``oversized`` - an array's payload exceeds what the server sent for it, or the
  reply's *payload* bytes (array data without the ``.npy`` headers) exceed
  ``max_reply_bytes`` (an accounting option of every strategy, checked by the template
  before the strategy's own check): a limit equal to the model's size accepts a valid reply;
* ``shape`` - an array's shape or dtype differs from the one the server sent
  (both the ``Array``'s metadata and its ``.npy`` header are compared), or its
  payload is not a readable numeric ``.npy`` (complex, string, object dtypes are
  refused wherever a real vector is expected);
* ``non-finite`` - an array holds NaN or ±inf (skipped with
  ``check_values=False`` by a strategy whose streaming aggregation detects
  non-finite replies itself, at no extra pass over the values);
* ``indices`` - SignDS: indices not integers in [0, d), strictly increasing
  (checked in int64 after a range check in the upload's own dtype: no wrap-around);
* ``values`` - SignDS: a sign other than exactly ±1 or a b-hat other than exactly
  0/1 (NaN, inf, 1.99 are refused); ClusterEvaluation: an inference value beyond
  :data:`MAX_INFERENCE_ABS`;
* ``secure-aggregation`` - DistributedDpFedAvg: a reply to a secure-aggregation stage
  that does not follow the protocol (:mod:`flwr_dp_strategies.secure_aggregation`:
  wrong field types, keys that do not parse, a masked vector of the wrong size); its
  sender is treated as a dropout.

Payloads are read zero-copy (:func:`.streaming_aggregation.npy_view`): screening
never decodes a copy of a well-formed reply.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Optional, TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from .streaming_aggregation import all_finite, npy_view

REJECTION_REASONS: tuple[str, ...] = (
    "error",
    "structure",
    "weight",
    "keys",
    "oversized",
    "shape",
    "non-finite",
    "declaration",
    "metrics",
    "indices",
    "values",
    "identity",
    "secure-aggregation",
)
DEFAULT_MAX_WEIGHT = 1e9
"""Default bound of a reply's weight (``num-examples``): see ``weight`` in the module docstring."""
MAX_INFERENCE_ABS = 1e6
"""Default bound of |value| in an inference vector scored by ClusterEvaluation (probabilities plus
Laplace noise of scale Δ₁/ε: 50 scales at ε = 1e-4 and Δ₁ = 2 stay below it; a Laplace draw exceeds
50 scales with probability e^-50)."""

ArraySpec = Mapping[str, tuple[tuple[int, ...], str, int]]
R = TypeVar("R", ArrayRecord, MetricRecord, ConfigRecord)


def records_of(content: RecordDict, kind: type[R]) -> list[R]:
    """``content``'s records of one type, in order.

    Read directly: Flower's ``content.array_records`` / ``metric_records`` /
    ``config_records`` build and re-validate a synced dict on every access, which
    costs more per reply than adding a small model.
    """
    return [record for record in content.values() if isinstance(record, kind)]


def reply_arrays(reply: Message) -> ArrayRecord:
    """The reply's (single, screened) ArrayRecord."""
    return records_of(reply.content, ArrayRecord)[0]


def reply_weight(reply: Message, weighted_by_key: str) -> float:
    """The reply's weight as FedAvg reads it: the first MetricRecord's ``weighted_by_key``."""
    return metric_scalar(records_of(reply.content, MetricRecord)[0][weighted_by_key])


def metric_scalar(value: object) -> float:
    """A MetricRecord value that screening found to be a finite number, as a float (ValueError otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"a metric scalar must be an int or a float, got {type(value).__name__}")
    return float(value)


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


def check_max_weight(max_weight: float) -> float:
    """``max_weight`` as a float in (0, 1e300]; ValueError naming it otherwise."""
    if (
        isinstance(max_weight, bool)
        or not isinstance(max_weight, (int, float))
        or not math.isfinite(max_weight)
        or not 0 < max_weight <= 1e300
    ):
        raise ValueError(f"max_weight must be a finite number in (0, 1e300], got {max_weight!r}")
    return float(max_weight)


def valid_weight(value: object, max_weight: float = DEFAULT_MAX_WEIGHT) -> bool:
    """True iff ``value`` is an int/float (not bool), finite, in (0, max_weight]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):  # no float conversion: a Python int may exceed the float range
        return 0 < value <= max_weight
    return math.isfinite(value) and 0 < value <= max_weight


def finite_metric(value: object) -> bool:
    """True iff a MetricRecord value (int, float or list of them) is finite everywhere."""
    if isinstance(value, list):
        return all(finite_metric(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):  # int64 is MetricRecord's wire domain; larger ints cannot be averaged as floats
        return -(2**63) <= value < 2**63
    return math.isfinite(value)


def check_weight(content: RecordDict, weighted_by_key: str, max_weight: float = DEFAULT_MAX_WEIGHT) -> Optional[str]:
    """``None`` if there is exactly one MetricRecord with a valid weight and finite metrics, else the reason.

    The evaluate-phase screen (and the metric part of the train-phase one): ``structure``,
    ``weight`` or ``metrics`` (see the module docstring).
    """
    metric_records = records_of(content, MetricRecord)
    if len(metric_records) != 1:
        return "structure"
    record = metric_records[0]
    if not valid_weight(record.get(weighted_by_key), max_weight):
        return "weight"
    if not all(finite_metric(value) for value in record.values()):
        return "metrics"
    return None


screen_evaluate_content = check_weight


def screen_train_content(
    content: RecordDict,
    spec: Optional[ArraySpec],
    weighted_by_key: str,
    check_values: bool = True,
    *,
    max_weight: float = DEFAULT_MAX_WEIGHT,
) -> Optional[str]:
    """``None`` if a train reply's content is well formed for averaging with ``spec``, else the reason.

    ``check_values=False`` skips the NaN/inf scan (the caller's aggregation must detect them). The size limit
    (``max_reply_bytes``, :func:`oversized`) is the template's, checked before this.
    """
    array_records = records_of(content, ArrayRecord)
    if len(array_records) != 1:
        return "structure"
    reason = check_weight(content, weighted_by_key, max_weight)
    if reason is not None:
        return reason
    arrays = array_records[0]
    if spec is not None and set(arrays.keys()) != set(spec.keys()):
        return "keys"
    for key, arr in arrays.items():
        reason = _check_array(arr, None if spec is None else spec[key], check_values)
        if reason is not None:
            return reason
    return None


def oversized(content: RecordDict, max_reply_bytes: int) -> bool:
    """True when the arrays of ``content`` (every ArrayRecord) carry more than ``max_reply_bytes`` of payload
    (``.npy`` headers not counted; an array that does not parse counts its raw bytes). Raw bytes beyond the limit
    plus 1 KiB of header per array are refused before anything is parsed."""
    arrays = [arr for record in records_of(content, ArrayRecord) for arr in record.values()]
    if sum(len(arr.data) for arr in arrays) > max_reply_bytes + 1024 * len(arrays):
        return True
    payload = 0
    for arr in arrays:
        try:
            payload += npy_view(arr).nbytes
        except Exception:  # noqa: BLE001 - malformed: its raw size counts; the strategy's check rejects it
            payload += len(arr.data)
    return payload > max_reply_bytes


def decode_real(arr: Array) -> Optional[np.ndarray]:
    """The array's values (zero-copy) if it is a readable ``.npy`` of a real numeric dtype, else None.

    Bool, integer and floating dtypes are real; complex, string, object and structured ones are not.
    """
    try:
        values = npy_view(arr)
    except Exception:  # noqa: BLE001 - an undecodable payload is malformed, whatever the error
        return None
    return values if values.dtype.kind in "biuf" else None


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


__all__ = [
    "DEFAULT_MAX_WEIGHT",
    "MAX_INFERENCE_ABS",
    "REJECTION_REASONS",
    "array_spec",
    "check_max_weight",
    "check_weight",
    "decode_real",
    "finite_metric",
    "has_config_record",
    "named_record",
    "records_of",
    "reply_arrays",
    "reply_weight",
    "screen_evaluate_content",
    "screen_train_content",
    "valid_weight",
]
