"""What client mods and server strategies share on the wire: record keys, the flat update, layer grouping.

A client mod and the strategy that reads its reply must agree on these names and
layouts; both import them from here, so neither side depends on the other's module.
This module imports no strategy: only numpy and the ``Array`` payload codec.

* Record and metric keys: :data:`KEY_UNCLIPPED_BIT` (client-side adaptive
  clipping), :data:`LINEAR_KEY` / :data:`QUADRATIC_KEY` (the functional
  mechanism's objective), :data:`SIGNDS_CONFIG_KEYS` / :data:`SIGNDS_EVENT_LABEL`
  (SignDS), :data:`DISTRIBUTED_DP_FIELDS` / :data:`SECURE_OBJECTIVE_FIELDS` (the
  public parameters of the secure-aggregation collect stage),
  :data:`CONFIG_PRIVACY_EVAL_TYPE` / :data:`CONFIG_LAPLACE_EVAL_EPS` (cluster
  evaluation).
* :func:`flat_update`: the update Δ = w' − w as one float64 vector.
* :func:`default_layer_of` / :func:`layer_groups`: which arrays form a layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Union, cast

import numpy as np

from .npy_codec import ArrayLike, npy_view

#: MetricRecord key of the client's bit: 1 if its update's norm was <= the clipping norm (unclipped), else 0.
KEY_UNCLIPPED_BIT = "unclipped_bit"

#: ArrayRecord key of the linear coefficients of a functional-mechanism objective (shape (d, k)).
LINEAR_KEY = "fm.linear"
#: ArrayRecord key of the quadratic coefficients of a functional-mechanism objective (shape (d, d)).
QUADRATIC_KEY = "fm.quadratic"

#: SignDS train-config keys, by parameter name: the server sets every one, the client mod reads them.
SIGNDS_CONFIG_KEYS = {
    "sign_k": "signds-sign-k",
    "sign_eps": "signds-sign-eps",
    "sign_thr_ratio": "signds-sign-thr-ratio",
    "sign_dim_out": "signds-sign-dim-out",
    "max_dim_out": "signds-max-dim-out",
    "r_est": "signds-r-est",
    "is_reached": "signds-is-reached",
    "rr_epsilon": "signds-rr-eps",
    "growth_margin": "signds-growth-margin",
    "shrink_margin": "signds-shrink-margin",
}
#: Declaration label of a SignDS upload (the selected indices and the MagRR bit).
SIGNDS_EVENT_LABEL = "signds/indices+magrr-bit"

#: Public distributed-DP parameters of the collect stage (server → client), with their types.
DISTRIBUTED_DP_FIELDS = {
    "dp-dim": int,
    "dp-clip-norm": float,
    "dp-scale": float,
    "dp-rotation-seed": int,
    "dp-beta": float,
    "dp-noise-share": float,
}
#: Public secure-objective parameters of the collect stage (server → client), with their types.
SECURE_OBJECTIVE_FIELDS = {
    "fm-dim": int,
    "fm-num-classes": int,
    "fm-loss": str,
    "fm-scale": float,
    "fm-noise-share": float,
}

#: Evaluate-config key of the privacy mode of an evaluation result (``NOT_ENCRYPT`` or ``LAPLACE``).
CONFIG_PRIVACY_EVAL_TYPE = "privacy-eval-type"
#: Evaluate-config key of the ε the server asks for in ``LAPLACE`` mode.
CONFIG_LAPLACE_EVAL_EPS = "laplace-eval-eps"

Arrays = Union[Mapping[str, ArrayLike], Sequence[ArrayLike]]


def flat_update(received: Arrays, trained: Arrays) -> np.ndarray:
    """Δ = w' − w: ``trained`` minus ``received``, array by array, flattened and concatenated in order.

    Both are mappings (an ``ArrayRecord`` or a dict of arrays, taken in ``received``'s key order;
    ``trained`` must have the same keys in the same order) or sequences of arrays (by position).
    Each difference is computed in float64 (integer and low-precision inputs are exact up to
    float64 rounding, no wrap-around); the result is the only copy: ``Array`` payloads are read
    zero-copy. ValueError if the keys, the number of arrays or a shape differ.
    """
    if isinstance(received, Mapping) != isinstance(trained, Mapping):
        raise ValueError("received and trained must both be mappings or both be sequences of arrays")
    if isinstance(received, Mapping) and isinstance(trained, Mapping):
        keys: list[Any] = list(received.keys())
        if list(trained.keys()) != keys:
            raise ValueError("the trained arrays must have the received keys, in the received order")
        before = [npy_view(received[k]) for k in keys]
        after = [npy_view(trained[k]) for k in keys]
    else:
        received_list, trained_list = list(cast(Sequence[Any], received)), list(cast(Sequence[Any], trained))
        if len(trained_list) != len(received_list):
            raise ValueError(f"got {len(trained_list)} trained arrays for {len(received_list)} received ones")
        keys = list(range(len(received_list)))
        before = [npy_view(a) for a in received_list]
        after = [npy_view(a) for a in trained_list]
    out = np.empty(sum(b.size for b in before), dtype=np.float64)
    start = 0
    for key, b, a in zip(keys, before, after):
        if a.shape != b.shape:
            raise ValueError(f"array {key!r}: trained shape {a.shape} differs from the received {b.shape}")
        np.subtract(a.reshape(-1), b.reshape(-1), out=out[start : start + b.size], dtype=np.float64)
        start += b.size
    return out


def default_layer_of(key: str) -> str:
    """The layer of an array key: the part before its last '.' ("fc1.weight" → "fc1"), never empty.

    A key without '.', or whose only '.' is its first character, is its own layer.
    """
    return key.rpartition(".")[0] or key


def layer_groups(keys: Iterable[str], layer_of: Callable[[str], str] | None = None) -> dict[str, list[str]]:
    """``{layer: [keys]}``: layers in order of first appearance, keys in their original order.

    ``layer_of`` maps a key to its layer name (default :func:`default_layer_of`: ``fc1.weight``
    and ``fc1.bias`` form ``fc1``); its result is taken as a string.
    """
    of = default_layer_of if layer_of is None else layer_of
    groups: dict[str, list[str]] = {}
    for key in keys:
        groups.setdefault(str(of(key)), []).append(key)
    return groups


__all__ = [
    "CONFIG_LAPLACE_EVAL_EPS",
    "CONFIG_PRIVACY_EVAL_TYPE",
    "DISTRIBUTED_DP_FIELDS",
    "KEY_UNCLIPPED_BIT",
    "LINEAR_KEY",
    "QUADRATIC_KEY",
    "SECURE_OBJECTIVE_FIELDS",
    "SIGNDS_CONFIG_KEYS",
    "SIGNDS_EVENT_LABEL",
    "default_layer_of",
    "flat_update",
    "layer_groups",
]
