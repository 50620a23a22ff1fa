r"""SignDS client encoding of one flat update vector (MindSpore spec §1, §3.2).

1. One fair random sign s ∈ {+1, −1} (data independent: free).
2. Top-k set S: the K = ⌊sign_k·d⌋ largest entries of s·Δ (by *signed* value,
   not |Δ|), found with one ``np.argpartition`` (O(d)).
3. h = ``sign_dim_out`` or :func:`optimal_output_dim`; threshold ν
   (:func:`optimal_threshold`); v ~ P(v) ∝ ω_v e^{ε·1[v ≥ ν]} (exact, log space).
4. v indices uniformly without replacement from S and h − v from the rest,
   returned sorted ascending and unique (MindSpore sorts; its server needs it).
5. MagRR bit: r = |mean of Δ over S|, b by the phase rule, b̂ = binary RR(ε_rr).

Only (indices, sign, b̂) leave the client: no float of the update.
Privacy of one round: the index set is ε-LDP (``PureDpEvent(sign_eps)``, see
:mod:`.selection`), b̂ is ε_rr-LDP (``RandomizedResponseDpEvent``), composed:
:func:`round_event`. Neighbouring relation: any two updates (replace-one, LDP).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from dp_accounting import dp_event

from ..privacy import binary_randomized_response, rr_event
from ..privacy.accounting.events import PureDpEvent
from ..privacy.rng import RngLike, resolve_rng
from ..privacy.validation import as_finite_float_array, check_int
from .magrr import MagRRConfig, magnitude_bit
from .params import SignDSParams
from .selection import (
    MAX_DIM_OUT,
    optimal_output_dim,
    optimal_threshold,
    overlap_log_probabilities,
    sample_overlap,
    topk_size,
)


@dataclass(frozen=True)
class SignDSUpload:
    """What one client sends: sorted unique indices, the sign, the MagRR bit."""

    indices: np.ndarray
    sign: int
    b_hat: int


def round_event(sign_eps: float, rr_epsilon: float) -> dp_event.DpEvent:
    """One round's release: ε-LDP index set composed with the ε_rr randomized-response bit."""
    return dp_event.ComposedDpEvent([PureDpEvent(float(sign_eps)), rr_event(rr_epsilon, 2)])


def output_dim(d: int, params: SignDSParams, max_dim_out: int = MAX_DIM_OUT) -> int:
    """h: ``sign_dim_out`` if > 0, else the optimal one (capped at ``max_dim_out``)."""
    if params.sign_dim_out > 0:
        return min(params.sign_dim_out, max_dim_out)
    return optimal_output_dim(d, params.sign_k, params.sign_eps, params.sign_thr_ratio, max_dim_out)


def encode_update(
    update: object,
    *,
    sign_k: float,
    sign_eps: float,
    sign_thr_ratio: float = 0.6,
    sign_dim_out: int = 0,
    r_est: float,
    is_reached: int,
    rng: RngLike = None,
    max_dim_out: int = MAX_DIM_OUT,
    magrr: MagRRConfig = MagRRConfig(),
) -> SignDSUpload:
    """Encode a flat update Δ (length d) into a SignDS upload. See the module docstring."""
    params = SignDSParams(sign_k=sign_k, sign_eps=sign_eps, sign_thr_ratio=sign_thr_ratio, sign_dim_out=sign_dim_out)
    delta = as_finite_float_array("update", update).ravel()  # float32 stays float32: only ranked
    d = delta.size
    k_top = topk_size(d, params.sign_k)
    if k_top < 1:
        raise ValueError(f"sign_k·d = {params.sign_k}·{d} < 1: the top-k set is empty")
    gen = resolve_rng(rng)
    sign = 1 if gen.random() < 0.5 else -1
    top = _signed_top_k(delta, k_top, sign)
    h = min(output_dim(d, params, check_int("max_dim_out", max_dim_out, minimum=1)), d)
    nu, _ = optimal_threshold(d, k_top, h, params.sign_eps)
    v = min(sample_overlap(overlap_log_probabilities(d, k_top, h, nu, params.sign_eps), gen), k_top, h)
    indices = _choose_indices(top, d, v, h - v, gen)
    r = abs(float(delta[top].mean(dtype=np.float64)))
    bit = magnitude_bit(r, r_est, is_reached, magrr)
    b_hat = int(binary_randomized_response(np.array([bit]), epsilon=magrr.rr_epsilon, rng=gen).value[0])
    return SignDSUpload(indices=indices, sign=sign, b_hat=b_hat)


def _signed_top_k(delta: np.ndarray, k_top: int, sign: int) -> np.ndarray:
    """Indices of the K largest entries of sign·Δ (one ``argpartition``, no negated copy)."""
    d = delta.size
    if sign > 0:
        return np.argpartition(delta, d - k_top)[d - k_top :]
    return np.argpartition(delta, k_top - 1)[:k_top]


def _choose_indices(top: np.ndarray, d: int, from_top: int, from_rest: int, gen: np.random.Generator) -> np.ndarray:
    """``from_top`` uniform distinct indices of ``top`` and ``from_rest`` of its complement, sorted."""
    chosen_top = top[gen.choice(top.size, size=from_top, replace=False)] if from_top else np.empty(0, np.int64)
    rest = _sample_complement(top, d, from_rest, gen)
    return np.sort(np.concatenate([chosen_top, rest]).astype(np.int64))


def _sample_complement(top: np.ndarray, d: int, count: int, gen: np.random.Generator) -> np.ndarray:
    """``count`` distinct uniform indices of [0, d) outside ``top`` (rejection; |top| ≤ d/4 keeps it cheap)."""
    if count == 0:
        return np.empty(0, np.int64)
    if d - top.size < count:
        raise ValueError(f"cannot choose {count} indices outside a top-k set of {top.size} among {d}")
    top_sorted = np.sort(top)
    picked: list[int] = []
    seen: set[int] = set()
    while len(picked) < count:
        candidates = gen.integers(0, d, size=2 * (count - len(picked)) + 8)
        pos = np.minimum(np.searchsorted(top_sorted, candidates), top_sorted.size - 1)
        for idx in candidates[top_sorted[pos] != candidates]:
            idx = int(idx)
            if idx not in seen:
                seen.add(idx)
                picked.append(idx)
                if len(picked) == count:
                    break
    return np.asarray(picked, dtype=np.int64)


__all__ = ["SignDSUpload", "encode_update", "output_dim", "round_event"]
