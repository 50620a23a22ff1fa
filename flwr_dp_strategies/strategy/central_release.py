r"""The release both central-DP strategies make: a clipped sum over a public denominator, plus noise.

.. math:: \tilde w = w + \frac1m \sum_{i \in S} \bar\Delta_i + \mathcal N\!\big(0, \sigma^2 I\big),
          \qquad \bar\Delta_i = \Delta_i \min(1, C/\lVert\Delta_i\rVert_2), \qquad \sigma = zC/m .

``m`` is public and fixed before the round (the configured number of clients),
never the number of replies nor a sum of client-reported weights: adding or
removing one client's whole data changes the sum by one clipped update, at most
C in L2, so the L2 sensitivity is exactly C/m and the noise multiplier is z
whatever arrives (McMahan et al. 2018, the fixed-denominator estimator). A
data-dependent denominator (FedAvg's Σn over the replies) moves every other
client's weight too, and client-reported weights make even that bound
data-dependent, so neither is used.

Noise comes from a :class:`numpy.random.Generator` seeded from OS entropy (or a
seed / Generator passed for tests), drawn in float64 chunks and added in place
(:func:`~.streaming_aggregation.add_gaussian_noise`); never from NumPy's global
generator. Floating-point attacks on the sampler are out of scope.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord

from .streaming_aggregation import ClippedSum, add_gaussian_noise, to_array

#: Label of the clients' (un-noised) train metrics when a strategy is told to publish them anyway.
NON_PRIVATE_METRICS_LABEL = "client train metrics (published un-noised: non-private)"


def fixed_denominator_release(summed: ClippedSum, denominator: int, sigma: float,
                              generator: np.random.Generator) -> ArrayRecord:
    r""":math:`w + S/m + \mathcal N(0, \sigma^2 I)` per key, in each array's dtype (consumes ``summed``)."""
    out = {}
    for key, total in summed.result().items():
        np.divide(total, denominator, out=total)
        add_gaussian_noise(total, sigma, generator)
        reference = summed.reference[key]
        np.add(total, reference, out=total, casting="same_kind")
        out[key] = to_array(total.astype(reference.dtype, copy=False))
    return ArrayRecord(out)


__all__ = ["NON_PRIVATE_METRICS_LABEL", "fixed_denominator_release"]
