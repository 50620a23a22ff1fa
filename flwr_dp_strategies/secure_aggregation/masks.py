r"""Pseudo-random masks modulo 2^b for secure aggregation, expanded from a 32-byte key by ChaCha20.

SecAgg(+) (Bonawitz et al., CCS 2017; Bell et al., CCS 2020) hides each client's
vector :math:`y_u \in \mathbb Z_{2^b}^D` behind masks that cancel in the sum:

.. math:: z_u = y_u + \mathrm{PRG}(b_u)
          + \sum_{v \in N(u),\, v < u} \mathrm{PRG}(s_{u,v})
          - \sum_{v \in N(u),\, v > u} \mathrm{PRG}(s_{u,v}) \pmod{2^b},

where :math:`b_u` is the client's own random seed and :math:`s_{u,v}` the key it
agreed with neighbour :math:`v` (ECDH + HKDF, Flower's
``generate_shared_key``). A mask is uniform on :math:`\mathbb Z_{2^b}^D`, so
:math:`z_u` alone is uniform and independent of :math:`y_u`.

Why not Flower's ``pseudo_rand_gen``: it folds the key into a **32-bit** seed of
NumPy's ``RandomState`` (2^32 candidate masks: a server can brute-force a
client's mask and read its update) and draws ``randint(0, range - 1)``, which
never yields ``range - 1`` (the masked vector is then not uniform). Here the
mask is the ChaCha20 keystream (RFC 7539, from ``cryptography``, the library
Flower's own key agreement uses) under the full 256-bit key, read as
little-endian uint64 words and reduced mod 2^b by keeping the low b bits; as
2^b divides 2^64 this is exactly uniform if the keystream is.

Arithmetic: every vector is uint64; sums and differences wrap mod 2^64, a
multiple of 2^b, so any chain of additions and subtractions reduced by
:func:`reduce_mod` at the end equals the computation mod 2^b.
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from ..privacy.validation import check_int

KEY_BYTES = 32
MAX_BITS = 62
_NONCE = b"\x00" * 16  # every key masks one vector once (fresh keys each round): a fixed nonce is safe


def check_bits(bits: object) -> int:
    """b ∈ [2, 62] (ValueError naming ``bits`` otherwise)."""
    b = check_int("bits", bits, minimum=2)
    if b > MAX_BITS:
        raise ValueError(f"bits must be an integer in [2, {MAX_BITS}], got {bits!r}")
    return b


def prg_mask(key: bytes, length: int, bits: int) -> np.ndarray:
    """``length`` uint64 values uniform on [0, 2^bits), the ChaCha20 keystream of the 32-byte ``key``."""
    if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
        raise ValueError(f"key must be {KEY_BYTES} bytes")
    n = check_int("length", length, minimum=0)
    b = check_bits(bits)
    encryptor = Cipher(algorithms.ChaCha20(bytes(key), _NONCE), mode=None).encryptor()
    words = np.frombuffer(encryptor.update(bytes(8 * n)), dtype="<u8").astype(np.uint64)
    words &= np.uint64((1 << b) - 1)
    return words


_CHUNK_WORDS = 1 << 13  # 64 KiB of keystream at a time: stays in cache, one buffer per call
_ZEROS = bytes(8 * _CHUNK_WORDS)


def add_prg_mask(vector: np.ndarray, key: bytes, sign: int) -> None:
    """``vector`` += sign·``prg_mask(key, len(vector), b)`` (mod 2^64, any b), streamed in place.

    The keystream is written into one 64 KiB buffer at a time (``update_into``) and added to the
    matching slice of ``vector``: no temporary of the vector's size, however many masks are applied.
    The words are not reduced to b bits: 2^b divides 2^64, so :func:`reduce_mod` of the result
    equals the sum with every mask reduced first (what :func:`prg_mask` returns)."""
    if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
        raise ValueError(f"key must be {KEY_BYTES} bytes")
    if sign not in (1, -1):
        raise ValueError(f"sign must be +1 or -1, got {sign!r}")
    if vector.dtype != np.uint64 or vector.ndim != 1:
        raise ValueError("vector must be a 1-D uint64 array")
    encryptor = Cipher(algorithms.ChaCha20(bytes(key), _NONCE), mode=None).encryptor()
    buffer = bytearray(8 * _CHUNK_WORDS)
    words = np.frombuffer(buffer, dtype="<u8")
    for start in range(0, vector.size, _CHUNK_WORDS):
        stop = min(start + _CHUNK_WORDS, vector.size)
        count = stop - start
        encryptor.update_into(_ZEROS[: 8 * count], buffer)
        if sign == 1:
            vector[start:stop] += words[:count]
        else:
            vector[start:stop] -= words[:count]


def reduce_mod(vector: np.ndarray, bits: int) -> np.ndarray:
    """``vector`` (uint64, any wrap mod 2^64 allowed) reduced into [0, 2^bits), in place."""
    vector &= np.uint64((1 << check_bits(bits)) - 1)
    return vector


def pairwise_sign(own: int, other: int) -> int:
    """+1 if ``own`` adds the mask it shares with ``other`` (own > other), −1 if it subtracts it."""
    if own == other:
        raise ValueError("a node shares no pairwise mask with itself")
    return 1 if own > other else -1


def apply_mask(vector: np.ndarray, mask: np.ndarray, sign: int) -> None:
    """``vector`` += sign·``mask`` (mod 2^64), in place; sign ∈ {+1, −1}."""
    if sign == 1:
        vector += mask
    elif sign == -1:
        vector -= mask
    else:
        raise ValueError(f"sign must be +1 or -1, got {sign!r}")


def packed_size(length: int, bits: int) -> int:
    """Bytes of ``length`` values of ``bits`` bits packed back to back: ⌈length·bits/8⌉."""
    return (check_int("length", length, minimum=0) * check_bits(bits) + 7) // 8


_PACK_GROUPS = 1 << 13  # groups of 8 values packed at a time (64 K values: a few hundred KiB of temporaries)


def _pack_groups(groups: np.ndarray, bits: int, out: np.ndarray) -> None:
    """Pack ``groups`` (G, 8) of uint64 into ``out`` (G, bits) of zeros: 8 values of b bits are exactly b bytes,
    value r at bits [r·b, r·b + b) of its group's bytes, read little-endian. Value r shifted left by r·b mod 8
    fits in 64 bits (b ≤ 57), so its bytes are those of one uint64 word OR-ed into ``out`` at byte ⌊r·b/8⌋."""
    mask = np.uint64((1 << bits) - 1)
    for r in range(8):
        first, shift = divmod(r * bits, 8)
        count = (shift + bits + 7) // 8
        word = (groups[:, r] & mask).astype("<u8", copy=False)
        if shift:
            word <<= np.uint64(shift)
        out[:, first : first + count] |= word.view(np.uint8).reshape(-1, 8)[:, :count]


def pack_bits(vector: np.ndarray, bits: int) -> np.ndarray:
    """Values in [0, 2^bits) packed into ⌈D·bits/8⌉ bytes (little-endian bit order): what a client uploads.

    Only the low ``bits`` bits of each value are read. For b ≤ 57 the values are packed 8 at a time (8·b bits
    are b whole bytes) by shifts and ORs over blocks of :data:`_PACK_GROUPS` groups: the temporaries are a few
    hundred KiB whatever D (the output is the only allocation of D's size); above, bit planes per block."""
    b = check_bits(bits)
    v = np.ascontiguousarray(vector, dtype="<u8").ravel()
    size = packed_size(v.size, b)
    if b > 57:
        out = np.empty(size, dtype=np.uint8)
        step = 8 * _PACK_GROUPS  # a multiple of 8 values: every block starts on a byte
        for start in range(0, v.size, step):
            block = v[start : start + step]
            planes = np.unpackbits(block.view(np.uint8).reshape(-1, 8), axis=1, bitorder="little")[:, :b]
            packed = np.packbits(planes.ravel(), bitorder="little")
            out[start * b // 8 : start * b // 8 + packed.size] = packed
        return out
    full = v.size // 8
    out = np.zeros((-(-v.size // 8), b), dtype=np.uint8)
    body = v[: 8 * full].reshape(full, 8)
    for start in range(0, full, _PACK_GROUPS):
        stop = min(start + _PACK_GROUPS, full)
        _pack_groups(body[start:stop], b, out[start:stop])
    if v.size > 8 * full:  # the last, partial group: zero values pad it (as packbits pads the last byte)
        tail = np.zeros((1, 8), dtype=np.uint64)
        tail[0, : v.size - 8 * full] = v[8 * full :]
        _pack_groups(tail, b, out[full:])
    return out.reshape(-1)[:size]


def unpack_bits(data: np.ndarray, bits: int, length: int) -> np.ndarray:
    """The inverse of :func:`pack_bits` (ValueError unless ``data`` is exactly ⌈length·bits/8⌉ bytes)."""
    b = check_bits(bits)
    raw = np.asarray(data)
    if raw.dtype != np.uint8 or raw.ndim != 1 or raw.size != packed_size(length, b):
        raise ValueError(f"packed data must be {packed_size(length, b)} uint8 values, got {raw.dtype} {raw.shape}")
    if b <= 57:  # 8 values are b whole bytes; value r of group g is in the 8 bytes from byte g·b + ⌊r·b/8⌋
        groups = -(-length // 8)
        padded = np.zeros(groups * b + 8, dtype=np.uint8)  # whole groups, and 8 bytes to read the last word
        padded[: raw.size] = raw
        out = np.empty((groups, 8), dtype=np.uint64)
        mask = np.uint64((1 << b) - 1)
        for start in range(0, groups, _PACK_GROUPS):
            stop = min(start + _PACK_GROUPS, groups)
            for r in range(8):
                first, shift = divmod(r * b, 8)
                # an (unaligned) uint64 word per group, read in place: a strided view of the bytes
                words = np.ndarray((stop - start,), dtype="<u8", buffer=padded, offset=start * b + first, strides=(b,))
                value = words >> np.uint64(shift)
                value &= mask
                out[start:stop, r] = value
        return out.reshape(-1)[:length]
    planes = np.unpackbits(raw, bitorder="little", count=length * b).reshape(length, b)
    out = np.zeros(length, dtype=np.uint64)
    for bit in range(b):
        out |= planes[:, bit].astype(np.uint64) << np.uint64(bit)
    return out


__all__ = [
    "KEY_BYTES",
    "add_prg_mask",
    "MAX_BITS",
    "apply_mask",
    "check_bits",
    "pack_bits",
    "packed_size",
    "pairwise_sign",
    "prg_mask",
    "reduce_mod",
    "unpack_bits",
]
