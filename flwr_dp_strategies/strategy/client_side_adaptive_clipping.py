r"""Adaptive clipping with the clipping done by the clients, correct and accounted.

A drop-in for Flower's ``DifferentialPrivacyClientSideAdaptiveClipping`` (same
arguments; new ones keyword-only, as :class:`~.adaptive_clipping.AdaptiveClippingMixin`).
The round, its noise and its accounting are those of
:class:`~.adaptive_clipping.AccountedAdaptiveClipping` (see that module for the
derivation); only where clipping happens differs:

* ``configure_train`` sends :math:`C_t` in the train config under Flower's key
  ``"clipping_norm"`` (``flwr.supercore.differential_privacy.KEY_CLIPPING_NORM``);
* the client (``client_mods.adaptive_clipping_mod``) clips its update to
  :math:`C_t` and returns the bit :math:`b_i = \mathbb 1[\lVert\Delta_i\rVert_2 \le C_t]`
  (*unclipped*) under :data:`KEY_UNCLIPPED_BIT` in its MetricRecord. For
  compatibility with Flower's own ``adaptiveclipping_mod``, a reply carrying only
  Flower's ``"norm_bit"`` (1 when the update *was clipped*) is read as
  :math:`b_i = 1 - \text{norm\_bit}`; a reply carrying both must have them agree;
* the server does not trust either: a bit other than exactly 0 or 1 (or none,
  or two that disagree), and an update whose norm exceeds what an honest client's
  clipping can reach (:func:`clipped_norm_limit`), reject the reply (reason
  ``values``) before any of it is added; every accepted update is clipped to
  :math:`C_t` again on the server, so one client moves the sum by at most
  :math:`C_t` and the centred count by ½ whatever it sends, and the round is the
  same Gaussian mechanism with multiplier z.

Why a limit above :math:`C_t`. A client clips in its model's dtype and returns
:math:`x = \mathrm{fl}(w + \hat\Delta)`: with unit roundoff u (2^-24 for float32),
its norm computation and scaling leave :math:`\lVert\hat\Delta\rVert_2 \le
C_t(1 + (\lceil\log_2 d\rceil + 4)u)` and storing :math:`w + \hat\Delta` moves each
coordinate by at most :math:`u\lvert x_j\rvert`, so :math:`\lVert x - w\rVert_2 \le
C_t(1 + (\lceil\log_2 d\rceil + 5)u) + u\lVert w\rVert_2` up to second-order terms. The limit is
:math:`C_t(1 + 10^{-6}) + 2u((\lceil\log_2 d\rceil + 5)C_t + \lVert w\rVert_2)`: an honest
float32 client (Flower's ``adaptiveclipping_mod`` included) whose update exceeds
:math:`C_t` is re-clipped by the server, never rejected, so no rejection depends on
the client's data. (A limit of :math:`C_t(1 + 10^{-6})` rejected 11 of 40 such
replies when ‖w‖₂ ≫ :math:`C_t`.) The rejection counts stay on the server in any case
(:mod:`flwr_dp_strategies.rounds.client_accounting`).

The server then noises the sum with :math:`z_\Delta C_t/m` (fixed denominator m)
and the centred count with :math:`\sigma_b`, publishes ``dp/clipping-norm`` and
``dp/unclipped-fraction`` and books ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``
(``GaussianDpEvent(z)`` with ``sampling="fixed"``), exactly like the server-side class.
The bit is a client metric: it is never published (only its noised sum is).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Optional

import numpy as np

from flwr.app import MetricRecord, RecordDict
from flwr.serverapp.strategy import DifferentialPrivacyClientSideAdaptiveClipping
from flwr.supercore.differential_privacy import KEY_NORM_BIT

from .adaptive_clipping import AdaptiveClippingMixin
from ..rounds.reply_screening import records_of, reply_arrays
from ..rounds.streaming_aggregation import ClippedSum, squared_norm_float64
from ..rounds.template import Screened
from ..wire import KEY_UNCLIPPED_BIT

#: Relative slack on the norm of an update a client clipped itself, beyond the float rounding of
#: :func:`clipped_norm_limit`.
NORM_TOLERANCE = 1e-6


def clipped_norm_limit(reference: Mapping[str, np.ndarray], clipping_norm: float) -> float:
    """The largest ‖x − w‖₂ an honest client that clipped to ``clipping_norm`` in its model's dtype can
    return, w = ``reference`` (see the module docstring); the unit roundoff u is that of the least
    precise floating dtype among the arrays (integer arrays round nothing)."""
    floats = [np.dtype(a.dtype) for a in reference.values() if np.dtype(a.dtype).kind == "f"]
    u = max((float(np.finfo(dtype).eps) / 2 for dtype in floats), default=0.0)
    dim = sum(int(np.size(a)) for a in reference.values())
    w_norm = math.sqrt(math.fsum(squared_norm_float64(a) for a in reference.values()))  # float64, blockwise
    log_d = math.ceil(math.log2(max(dim, 2)))
    return clipping_norm * (1.0 + NORM_TOLERANCE) + 2.0 * u * ((log_d + 5) * clipping_norm + w_norm)


EVENT_LABEL = "central-gaussian/client-side-adaptive-clipping"


def _as_bit(value: object) -> Optional[int]:
    """0 or 1 if ``value`` is exactly that number (int or float, not bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value not in (0, 1):
        return None
    return int(value)


def read_unclipped_bit(content: RecordDict) -> Optional[int]:
    """The reply's unclipped bit (see the module docstring), or None if absent, malformed or inconsistent."""
    records = records_of(content, MetricRecord)
    if len(records) != 1:
        return None
    record = records[0]
    ours = _as_bit(record[KEY_UNCLIPPED_BIT]) if KEY_UNCLIPPED_BIT in record else None
    flowers = _as_bit(record[KEY_NORM_BIT]) if KEY_NORM_BIT in record else None
    if (KEY_UNCLIPPED_BIT in record and ours is None) or (KEY_NORM_BIT in record and flowers is None):
        return None  # present but not exactly 0 or 1
    if ours is not None and flowers is not None and ours != 1 - flowers:
        return None
    if ours is not None:
        return ours
    return None if flowers is None else 1 - flowers


class AccountedClientSideAdaptiveClipping(AdaptiveClippingMixin, DifferentialPrivacyClientSideAdaptiveClipping):
    """Client-side adaptive clipping (Andrew et al. 2021), correct and accounted: see the module docstring.

    Drop-in for Flower's ``DifferentialPrivacyClientSideAdaptiveClipping``; arguments as
    :class:`~.adaptive_clipping.AdaptiveClippingMixin`. Use ``client_mods.adaptive_clipping_mod``
    (or Flower's ``adaptiveclipping_mod``) on the clients.
    """

    event_label = EVENT_LABEL
    clipping_side = "client"  # C_t goes to the clients in the train config under Flower's key

    def add_updates(self, server_round: int, summed: ClippedSum, screened: Screened) -> int:
        """Add (clipped to C) every reply with a valid bit and an update of norm <= :func:`clipped_norm_limit`;
        the others are rejected (``values``; NaN/inf: ``non-finite``) before any of their update is added.
        Returns the number of unclipped bits of the replies added."""
        keys = list(summed.reference)
        limit = clipped_norm_limit(summed.reference, summed.clipping_norm)
        unclipped, rejections = 0, []
        for reply in screened.accepted:
            bit = read_unclipped_bit(reply.content)
            if bit is None:
                rejections.append((reply, "values"))
                continue
            record = reply_arrays(reply)
            norm = summed.add([record[key] for key in keys], limit=limit)
            if norm is None or norm > limit:
                rejections.append((reply, "non-finite" if norm is None else "values"))
            else:
                unclipped += bit
        screened.reject_each(rejections)
        return unclipped

    def __repr__(self) -> str:
        return (
            f"AccountedClientSideAdaptiveClipping(z={self.noise_multiplier}, C={self.clipping_norm:.6g}, "
            f"m={self.num_sampled_clients}, gamma={self.target_unclipped_quantile}, sampling={self.sampling!r})"
        )


__all__ = [
    "AccountedClientSideAdaptiveClipping",
    "EVENT_LABEL",
    "KEY_UNCLIPPED_BIT",
    "NORM_TOLERANCE",
    "clipped_norm_limit",
    "read_unclipped_bit",
]
