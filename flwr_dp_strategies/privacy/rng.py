"""Random generators for mechanisms.

By default every mechanism draws from a fresh :class:`numpy.random.Generator`
seeded with 128 bits of OS entropy (:func:`secrets.randbits`), never from a
fixed or shared seed. Tests and benchmarks pass an ``int`` seed or their own
``Generator`` for reproducibility.

Note: numpy's bit generators (PCG64 by default) are statistically strong but
*not* cryptographically secure: an adversary who sees enough raw outputs of the
same generator could in principle predict later ones. Each call without an
explicit generator gets its own fresh OS-entropy seed, which limits what one
release reveals about another. Pass a Generator wrapping a CSPRNG bit source if
your threat model needs it.
"""

from __future__ import annotations

import secrets
from typing import Union

import numpy as np

RngLike = Union[None, int, np.random.Generator]


def resolve_rng(rng: RngLike = None) -> np.random.Generator:
    """Return a Generator: ``None`` → OS-entropy seeded, ``int`` → seeded, Generator → itself."""
    if rng is None:
        return np.random.Generator(np.random.PCG64(secrets.randbits(128)))
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        if rng < 0:
            raise ValueError(f"rng seed must be an integer in [0, inf), got {rng}")
        return np.random.default_rng(int(rng))
    raise ValueError(f"rng must be None, a non-negative int seed or a numpy.random.Generator, got {type(rng).__name__}")
