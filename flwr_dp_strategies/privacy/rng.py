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


class RngSource:
    """The randomness of a long-lived mechanism object (a mod, a data wrapper, a strategy).

    ``rng=None`` gives a **fresh** OS-entropy generator at every call, so copies of
    the object never replay one stream: Flower's simulation pickles the ClientApp
    (mods included) to its workers for every message, and a generator drawn once
    in ``__init__`` would give every client the same noise in every round. An
    ``int`` seed or a Generator gives that one reproducible stream (copies of the
    object then replay it: use explicit seeds for tests and benchmarks only).
    """

    def __init__(self, rng: RngLike = None) -> None:
        self._fixed = None if rng is None else resolve_rng(rng)

    def __call__(self) -> np.random.Generator:
        return self._fixed if self._fixed is not None else resolve_rng(None)
