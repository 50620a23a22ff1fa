"""Zero-copy reading and single-copy writing of Flower ``Array`` payloads (``.npy`` bytes).

Flower's ``Array.numpy()`` decodes through ``np.load`` (``ast.literal_eval`` of
the header, then a copy) and ``Array(ndarray)`` encodes through ``np.save``:
about 0.1 ms per array whatever its size, which dominates a small model's
message. Strategies and client mods that touch every reply use these instead:

* :func:`npy_view` - a read-only ``np.frombuffer`` view of the payload (header
  parsed once per distinct header and cached); anything unusual falls back to
  ``Array.numpy()``, which decodes it or raises exactly as Flower would;
* :func:`to_array` - ``Array(values)`` with a byte-identical payload, built with
  one copy of the values and a cached header per (dtype, shape).

No privacy logic here: this is transport.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from io import BytesIO
from typing import Optional, Union

import numpy as np
from flwr.app import Array
from flwr.common.constant import SType
from numpy.lib import format as npy_format

NPY_MAGIC = b"\x93NUMPY"
_HEADER_CACHE: dict[bytes, "_Header"] = {}
_HEADER_CACHE_MAX = 4096
_WRITE_HEADER_CACHE: dict[tuple[str, tuple[int, ...]], bytes] = {}

ArrayLike = Union[Array, np.ndarray]


@dataclass(frozen=True)
class _Header:
    """What a ``.npy`` header says: dtype, shape, memory order, payload offset and element count."""

    dtype: np.dtype
    shape: tuple[int, ...]
    fortran_order: bool
    offset: int
    count: int


def npy_view(array: ArrayLike) -> np.ndarray:
    """The values of a Flower ``Array`` without copying its payload (read-only), or ``array`` itself.

    The ``.npy`` header is the truth (not the ``Array``'s ``shape``/``dtype``
    metadata, which a client sets independently); it is parsed by numpy's own
    ``read_array_header_1_0/2_0`` once per distinct header. Every other case is
    handed to ``Array.numpy()`` (a decoding copy, or Flower's own error).
    """
    if isinstance(array, np.ndarray):
        return array
    data = array.data
    header = _header(data) if array.stype == SType.NUMPY else None
    if header is None or len(data) < header.offset + header.count * header.dtype.itemsize:
        return array.numpy()
    flat = np.frombuffer(data, dtype=header.dtype, count=header.count, offset=header.offset)
    return flat.reshape(header.shape, order="F" if header.fortran_order else "C")


def _header(data: bytes) -> Optional[_Header]:
    """The cached parse of ``data``'s ``.npy`` header, or None if it is not a plain numeric one."""
    if len(data) < 10 or data[:6] != NPY_MAGIC or data[6] not in (1, 2):
        return None
    size_bytes = 2 if data[6] == 1 else 4
    offset = 8 + size_bytes + int.from_bytes(data[8 : 8 + size_bytes], "little")
    raw = data[:offset]
    cached = _HEADER_CACHE.get(raw)
    if cached is None:
        cached = _parse_header(raw, offset)
        if cached is None:
            return None
        if len(_HEADER_CACHE) >= _HEADER_CACHE_MAX:
            _HEADER_CACHE.clear()
        _HEADER_CACHE[raw] = cached
    return cached


def _parse_header(raw: bytes, offset: int) -> Optional[_Header]:
    stream = BytesIO(raw)
    try:
        version = npy_format.read_magic(stream)
        read = npy_format.read_array_header_1_0 if version == (1, 0) else npy_format.read_array_header_2_0
        shape, fortran_order, dtype = read(stream)
    except Exception:  # noqa: BLE001 - anything unreadable goes to Array.numpy(), which reports it
        return None
    if dtype.hasobject or dtype.kind not in "biufc" or dtype.subdtype is not None:
        return None
    return _Header(dtype, tuple(int(s) for s in shape), bool(fortran_order), offset, math.prod(shape))


def to_array(values: np.ndarray) -> Array:
    """``Array(values)`` (byte-identical ``.npy`` payload) built with a single copy of the values.

    The ``.npy`` header depends only on dtype and shape; it is written once per
    distinct pair and cached (a model's few shapes recur every message).
    """
    values = np.asarray(values)
    if not values.flags.c_contiguous:
        values = np.ascontiguousarray(values).reshape(values.shape)  # (ascontiguousarray makes 0-d 1-d)
    if values.dtype.hasobject:
        return Array(values)
    header = _npy_header(values.dtype, values.shape)
    if header is None:  # a header too long for version 1.0: let np.save choose
        return Array(values)
    data = b"".join((header, values.reshape(-1).view(np.uint8)))
    return Array(dtype=str(values.dtype), shape=tuple(values.shape), stype=SType.NUMPY, data=data)


def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> Optional[bytes]:
    """The version-1.0 ``.npy`` header of a C-contiguous array (cached), or None if it does not fit 1.0."""
    key = (dtype.str, shape)
    cached = _WRITE_HEADER_CACHE.get(key)
    if cached is None:
        stream = BytesIO()
        try:
            npy_format.write_array_header_1_0(
                stream, {"descr": npy_format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
            )
        except ValueError:
            return None
        if len(_WRITE_HEADER_CACHE) >= _HEADER_CACHE_MAX:
            _WRITE_HEADER_CACHE.clear()
        cached = _WRITE_HEADER_CACHE[key] = stream.getvalue()
    return cached


__all__ = ["ArrayLike", "NPY_MAGIC", "npy_view", "to_array"]
