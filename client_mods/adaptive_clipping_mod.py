r"""Client side of adaptive clipping (central DP): clip the update to the server's C_t, report the bit.

Use with :class:`flwr_dp_strategies.strategy.AccountedClientSideAdaptiveClipping`
(``@app.train(mods=[adaptive_clipping_mod])``, or ``ClientApp(mods=[...])``: other
message types pass through untouched). For a train message whose config holds
:math:`C_t` under Flower's key ``"clipping_norm"``, with :math:`w` the weights
received and :math:`w'` those trained, the reply's weights become

.. math:: w + \Delta\,\min(1, C_t/\lVert\Delta\rVert_2), \qquad \Delta = w' - w,

over all arrays of the reply's single ArrayRecord flattened together (one L2
norm, computed in float64), and its single MetricRecord gets the bit
:math:`b = \mathbb 1[\lVert\Delta\rVert_2 \le C_t]` under ``"unclipped_bit"``
and, for Flower's server wrappers, Flower's ``"norm_bit"`` :math:`= 1 - b`
(Flower's ``adaptiveclipping_mod`` sends that one: 1 when clipped). A zero update
gives :math:`b = 1` (no division by its zero norm).

The server rejects an update whose norm exceeds :math:`C_t(1 + 10^{-6})`, so the
mod checks the norm of what it actually sends, after the cast back to each
array's dtype (float32 rounding of :math:`w + \bar\Delta` can add more than that
for a small :math:`C_t`), and shrinks the update until it fits (at worst it sends
:math:`w`, the zero update).

Nothing is noised here: this is central DP, the server noises the sum and the
count and books the round (no declaration is sent). The reply's other train metrics
(``train-loss``, the exact ``num-examples``, ...) are computed from the client's data
and nothing would noise them, so by default they never leave the client: the reply's
one MetricRecord holds the public weight ``{weighted_by_key: 1.0}`` (central DP
averages over the public m anyway) and the two bits
(:func:`client_mods.reply_metrics.withhold_metrics`). ``make_adaptive_clipping_mod(
release_metrics=True)`` sends them as they are and declares a ``NonPrivateDpEvent``
(the ledger then reports ε = ∞ for that client: the truth about an un-noised release).
Evaluate messages pass through untouched.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.clientapp.typing import ClientAppCallable
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM, KEY_NORM_BIT

from flwr_dp_strategies.npy_codec import npy_view, to_array
from flwr_dp_strategies.privacy.validation import check_bool, check_positive
from flwr_dp_strategies.wire import KEY_UNCLIPPED_BIT, flat_update

from .reply_metrics import settle_metrics

_SHRINK_ATTEMPTS = 8


def clip_to_norm(
    received: list[np.ndarray], trained: list[np.ndarray], clipping_norm: float
) -> tuple[list[np.ndarray], int]:
    """(arrays to send, unclipped bit): :math:`w + \\Delta\\min(1, C/\\lVert\\Delta\\rVert_2)` in the received
    dtypes, whose distance to ``received`` (after the cast) is at most C, and :math:`1[\\lVert\\Delta\\rVert_2 \\le C]`."""
    delta = flat_update(received, trained)
    reference = [np.asarray(r, np.float64) for r in received]
    deltas, start = [], 0
    for r in reference:
        deltas.append(delta[start : start + r.size].reshape(r.shape))
        start += r.size
    norm = math.sqrt(float(np.dot(delta, delta)))
    bit = int(norm <= clipping_norm)
    scale = 1.0 if bit else clipping_norm / norm
    for _ in range(_SHRINK_ATTEMPTS):
        out = [_cast(r + scale * d, original.dtype) for r, d, original in zip(reference, deltas, received)]
        sent = float(np.linalg.norm(flat_update(reference, out)))
        if sent <= clipping_norm:
            return out, bit
        scale *= clipping_norm / sent * (1.0 - 1e-9)
    return [np.array(r, copy=True) for r in received], bit


def _cast(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``values`` in ``dtype`` (integers rounded to nearest)."""
    if np.issubdtype(dtype, np.integer):
        values = np.rint(values)
    return values.astype(dtype)


def _clipping_norm(msg: Message) -> float:
    """C_t from the train message's config (Flower's key), validated."""
    configs = [r for r in msg.content.values() if isinstance(r, ConfigRecord) and KEY_CLIPPING_NORM in r]
    if len(configs) != 1:
        raise ValueError(
            f"adaptive_clipping_mod expects '{KEY_CLIPPING_NORM}' in exactly one ConfigRecord of the "
            "train message (sent by AccountedClientSideAdaptiveClipping)"
        )
    return check_positive("clipping_norm", configs[0][KEY_CLIPPING_NORM])


_R = TypeVar("_R", ArrayRecord, MetricRecord)


def _single(msg: Message, kind: type[_R], what: str) -> tuple[str, _R]:
    items = [(name, record) for name, record in msg.content.items() if isinstance(record, kind)]
    if len(items) != 1:
        raise ValueError(f"adaptive_clipping_mod expects exactly one {kind.__name__} in the {what}, got {len(items)}")
    return items[0]


def make_adaptive_clipping_mod(
    *, release_metrics: bool = False, weighted_by_key: str = "num-examples"
) -> Callable[[Message, Context, ClientAppCallable], Message]:
    """The mod (module docstring); ``release_metrics``: send the client's own train metrics, declared non-private
    (default: withheld, only the public weight and the bits are sent); ``weighted_by_key``: the strategy's weight
    key, under which the public weight is sent."""
    release_metrics = check_bool("release_metrics", release_metrics)
    if not isinstance(weighted_by_key, str) or not weighted_by_key:
        raise TypeError(f"weighted_by_key must be a non-empty str, got {weighted_by_key!r}")

    def mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        """Flower mod: clip the train update to the server's C_t, add the unclipped bit (module docstring)."""
        return _clip_reply(msg, context, call_next, release_metrics=release_metrics, weighted_by_key=weighted_by_key)

    return mod


def adaptive_clipping_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Flower mod: clip the train update to the server's C_t and add the unclipped bit; the client's own train
    metrics are withheld (module docstring; :func:`make_adaptive_clipping_mod` for the options)."""
    return _clip_reply(msg, context, call_next, release_metrics=False, weighted_by_key="num-examples")


def _clip_reply(
    msg: Message, context: Context, call_next: ClientAppCallable, *, release_metrics: bool, weighted_by_key: str
) -> Message:
    if msg.metadata.message_type.split(".")[0] != "train":
        return call_next(msg, context)
    clipping_norm = _clipping_norm(msg)
    _, sent = _single(msg, ArrayRecord, "train message")
    keys = list(sent.keys())
    received = [npy_view(sent[k]) for k in keys]
    reply = call_next(msg, context)
    if reply.has_error():
        return reply
    name, trained = _single(reply, ArrayRecord, "reply")
    _, metrics = _single(reply, MetricRecord, "reply")
    if list(trained.keys()) != keys:
        raise ValueError("the reply's ArrayRecord must have the keys of the received one")
    out, bit = clip_to_norm(received, [npy_view(trained[k]) for k in keys], clipping_norm)
    reply.content[name] = ArrayRecord({k: to_array(v) for k, v in zip(keys, out)})
    settle_metrics(reply.content, release_metrics=release_metrics, weighted_by_key=weighted_by_key)
    _, metrics = _single(reply, MetricRecord, "reply")
    metrics[KEY_UNCLIPPED_BIT] = bit
    metrics[KEY_NORM_BIT] = 1 - bit
    return reply


__all__ = ["adaptive_clipping_mod", "clip_to_norm", "make_adaptive_clipping_mod"]
