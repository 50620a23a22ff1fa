r"""Shamir secret sharing over the prime field GF(p), p = 2^521 − 1, vectorised over secrets and holders.

Why not Flower's ``crypto.shamir``: it shares 16-byte chunks over GF(2^128) with pycryptodome,
one polynomial per chunk and per secret, evaluated and interpolated in pure Python (0.43 s for one
reconstruction at t = 51). Here every secret of a client is one field element (the 32-byte mask
seed and the 48-byte SECP384R1 scalar are both below p, so no chunking); the polynomials of all
secrets are evaluated at all holders' points in one Horner pass over Python integers
(:func:`split`, coefficients from ``secrets.randbelow``); reconstruction is Lagrange interpolation
at 0, whose coefficients depend only on the x-coordinates: :func:`lagrange_at_zero` computes them
once per set of x-coordinates (cached; one modular inversion for the whole set) and
:func:`reconstruct_many` applies them to every secret rebuilt from the same set.

Why not a library: ``mpyc`` (``mpyc.thresha``: the same ``random_split`` / ``recombine`` with cached
recombination vectors) parses the host process's command line and calls ``logging.basicConfig`` on
the root logger at import, which a ClientApp or ServerApp cannot accept; what we need of it is the
thirty lines below, textbook Shamir (1979) in a prime field. Nothing here is a new primitive.

Secrecy: a polynomial of degree t − 1 with uniform coefficients over GF(p), so any t − 1 shares
are uniform and independent of the secret (perfect secrecy); any t determine it.

Wire format of one share: the x-coordinate (2 bytes, big-endian, 1..65535: the holder's position
in the owner's sorted neighbourhood, plus one) followed by the y-coordinate (66 bytes, big-endian).
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Sequence

PRIME = (1 << 521) - 1
"""The Mersenne prime 2^521 − 1: every secret of the protocol (≤ 48 bytes) is one element."""
X_BYTES = 2
Y_BYTES = (PRIME.bit_length() + 7) // 8
SHARE_BYTES = X_BYTES + Y_BYTES
MAX_HOLDERS = (1 << (8 * X_BYTES)) - 1
MAX_SECRET_BYTES = (PRIME.bit_length() - 1) // 8


def _as_int(secret: bytes) -> int:
    if not isinstance(secret, (bytes, bytearray)) or not 0 < len(secret) <= MAX_SECRET_BYTES:
        raise ValueError(f"a secret must be 1 to {MAX_SECRET_BYTES} bytes")
    return int.from_bytes(secret, "big")


def split(secrets_: Sequence[bytes], threshold: int, holders: int) -> list[list[bytes]]:
    """Shares of every secret for ``holders`` holders, any ``threshold`` of which rebuild it:
    ``out[i][j]`` is holder i's share (x = i + 1) of ``secrets_[j]``. One fresh polynomial per secret."""
    t, n = int(threshold), int(holders)
    if not 1 <= t <= n <= MAX_HOLDERS:
        raise ValueError(f"need 1 <= threshold <= holders <= {MAX_HOLDERS}, got threshold {t}, holders {n}")
    values = [_as_int(s) for s in secrets_]
    # f_j(X) = s_j + c_j1 X + ... + c_j,t-1 X^(t-1), all coefficients uniform on GF(p)
    polys = [[secrets.randbelow(PRIME) for _ in range(t - 1)] for _ in values]
    out = []
    for i in range(1, n + 1):
        prefix = i.to_bytes(X_BYTES, "big")
        row = []
        for value, coefficients in zip(values, polys):
            y = 0
            for c in reversed(coefficients):  # Horner: ((c_{t-1} X + c_{t-2}) X + ...) X + s
                y = (y + c) * i
            row.append(prefix + ((y + value) % PRIME).to_bytes(Y_BYTES, "big"))
        out.append(row)
    return out


@functools.lru_cache(maxsize=4096)
def lagrange_at_zero(xs: tuple[int, ...]) -> tuple[int, ...]:
    r"""The Lagrange coefficients :math:`\lambda_i = \prod_{j \ne i} x_j / (x_j - x_i)` of the distinct
    nonzero ``xs`` at 0 (so that :math:`f(0) = \sum_i \lambda_i f(x_i)` for deg f < len(xs)); cached:
    one computation per set of holders, whatever the number of secrets rebuilt from it."""
    numerator = 1
    for x in xs:
        numerator = numerator * x % PRIME
    denominators = []
    for i, x_i in enumerate(xs):
        d = x_i
        for j, x_j in enumerate(xs):
            if j != i:
                d = d * (x_j - x_i) % PRIME
        denominators.append(d)
    # one inversion for all (Montgomery's trick): prefix products, invert the total, walk back
    prefix = [1]
    for d in denominators:
        prefix.append(prefix[-1] * d % PRIME)
    inverse = pow(prefix[-1], -1, PRIME)
    out = [0] * len(xs)
    for i in range(len(xs) - 1, -1, -1):
        out[i] = numerator * inverse * prefix[i] % PRIME
        inverse = inverse * denominators[i] % PRIME
    return tuple(out)


def parse_share(share: bytes) -> tuple[int, int]:
    """(x, y) of one share (ValueError unless it is :data:`SHARE_BYTES` bytes with 0 < x and y < p)."""
    if not isinstance(share, (bytes, bytearray)) or len(share) != SHARE_BYTES:
        raise ValueError(f"a share must be {SHARE_BYTES} bytes")
    x = int.from_bytes(share[:X_BYTES], "big")
    y = int.from_bytes(share[X_BYTES:], "big")
    if x == 0 or y >= PRIME:
        raise ValueError("a share's x must be nonzero and its y below the prime")
    return x, y


def share_x(share: bytes) -> int:
    """The x-coordinate of a share (ValueError if malformed)."""
    return parse_share(share)[0]


def reconstruct_many(xs: Sequence[int], ys: Sequence[Sequence[int]], length: int) -> list[bytes]:
    """The secrets ``ys[j]`` (the y-coordinates at the distinct ``xs``, one list per secret) interpolated at 0,
    each as ``length`` big-endian bytes; the Lagrange coefficients of ``xs`` are computed once for all
    (and cached across calls). ValueError if the xs repeat or a secret does not fit in ``length`` bytes
    (shares of another secret, or corrupt ones)."""
    xs = tuple(int(x) for x in xs)
    if len(set(xs)) != len(xs) or any(not 0 < x < PRIME for x in xs):
        raise ValueError("the x-coordinates must be distinct and nonzero")
    if not ys:
        return []
    if any(len(row) != len(xs) for row in ys):
        raise ValueError("every secret needs one y per x-coordinate")
    coefficients = lagrange_at_zero(xs)
    out = []
    for row in ys:
        v = sum(c * y for c, y in zip(coefficients, row)) % PRIME
        if v >= 1 << (8 * length):
            raise ValueError(f"the rebuilt secret does not fit in {length} bytes")
        out.append(v.to_bytes(length, "big"))
    return out


def reconstruct(shares: Sequence[bytes], length: int) -> bytes:
    """One secret of ``length`` bytes from its shares (all used: pass exactly t)."""
    points = [parse_share(s) for s in shares]
    return reconstruct_many([x for x, _ in points], [[y for _, y in points]], length)[0]


class PrimeFieldShamir:
    """The sharing scheme the protocol calls (:data:`SCHEME`): shares are :data:`SHARE_BYTES` bytes,
    holder i (0-based position in the owner's sorted neighbourhood) gets x = i + 1."""

    name = "prime field GF(2^521 - 1)"

    @staticmethod
    def split(secrets_: Sequence[bytes], threshold: int, holders: int) -> list[list[bytes]]:
        """:func:`split`."""
        return split(secrets_, threshold, holders)

    @staticmethod
    def x_of(share: bytes) -> int:
        """The share's x-coordinate (ValueError if malformed)."""
        return parse_share(share)[0]

    @staticmethod
    def reconstruct(xs: Sequence[int], shares: Sequence[Sequence[bytes]], length: int) -> list[bytes]:
        """The secrets whose shares at ``xs`` are ``shares[j]`` (same order as ``xs``), ``length`` bytes each;
        one set of Lagrange coefficients for all (:func:`reconstruct_many`)."""
        ys = []
        for row in shares:
            points = [parse_share(s) for s in row]
            if [x for x, _ in points] != [int(x) for x in xs]:
                raise ValueError("a share's x-coordinate is not its holder's")
            ys.append([y for _, y in points])
        return reconstruct_many(xs, ys, length)


SCHEME = PrimeFieldShamir()
"""The scheme :mod:`.client_protocol` and :mod:`.server_protocol` use (looked up at each call)."""


__all__ = [
    "SCHEME",
    "MAX_HOLDERS",
    "MAX_SECRET_BYTES",
    "PRIME",
    "lagrange_at_zero",
    "SHARE_BYTES",
    "PrimeFieldShamir",
    "parse_share",
    "reconstruct",
    "reconstruct_many",
    "share_x",
    "split",
]
