r"""Layer-wise Split & Shuffle (DELM §3.4): recombine n reports layer by layer at random.

Protocol (DELM §3.4, after LDP-FL's Split & Shuffle). Each of n clients sends a
report split into the same m segments (one per network layer, a layer being
e.g. ``fc1.weight`` + ``fc1.bias``). Layer j forms the group
G_j = {x_1^j, ..., x_n^j}. For every layer an independent uniform permutation
π_j of [n] is drawn and recombined report r is

.. math:: \tilde x_r = (x^1_{\pi_1(r)}, \dots, x^m_{\pi_m(r)}),
          \qquad \tilde w^j_r = w_{\pi_j(r)},

the weight w_i of client i travelling with each of its segments. Each layer's
multiset (segment, weight) is unchanged, so the weighted per-layer mean
Σ_r w̃^j_r x̃^j_r / Σ_r w̃^j_r equals Σ_i w_i x_i^j / Σ_i w_i: FedAvg's aggregate.

Trust assumption. The shuffler is a separate party that does not collude with
the analyst (the server that aggregates). It sees every client's report in full
(in this in-process simulation it is an object inside the server's strategy);
any amplification below holds only against parties that see nothing but its
output, and only for what passes through it (the clients' train metrics,
evaluate replies and any other message reach the server directly).

Privacy analysis.

1. *The paper's ε/m claim is not a DP bound.* The appendix (eqs. 21-25) writes
   the output distribution of one *position* as the mixture
   A^{(i)} = (1/m)·A|_{z_i = z_k} + (1 − 1/m)·A|_{z_i ≠ z_k}, applies the mixture
   lemma (eq. 23) to get ln(1 + (e^ε − 1)/m) per position, approximates it by
   ε/m (eq. 24, Taylor at ε → 0) and then takes a max over positions as if they
   were disjoint ("parallel composition", eq. 25). But every layer of every
   client reaches the analyst: the changed layer d_k is always present in the
   output, only its position is hidden. The mixture argument bounds the
   marginal of one position, not the joint output, and the positions are not
   independent releases of disjoint data, so eq. 25 does not follow. E.g. with
   n = 1 nothing is shuffled and the output is exactly M(D), which is ε-DP and
   no better, whatever m. ε/m is available only as an explicitly labelled,
   non-DP figure (``amplification="paper"`` in the strategy).
2. *Sound bound: whole-report shuffling.* The layer-wise output is a
   post-processing of the uniformly shuffled n whole reports: from their
   multiset draw σ uniform and independent uniform π'_j, and output
   x̃_r^j = x^j_{σ(π'_j(r))}; σ∘π'_j are independent uniform permutations, which
   is exactly the layer-wise shuffle's distribution. So layer-wise shuffling is
   at least as private as whole-report shuffling, and Feldman-McMillan-Talwar
   amplification by shuffling (FOCS 2021; :mod:`flwr_dp_strategies.privacy.analyses.shuffle`)
   applies: if every report (the weight included) is the output of the same
   ε₀-LDP randomizer on the client's *whole local data*, the shuffled output is
   (ε, δ)-DP under replacement of one client's whole data, with
   ε = ``shuffle_amplified_epsilon(ε₀, n, δ)``. n must be the number of reports
   actually shuffled. FMT's closed form needs ε₀ ≤ ln(n / (16 ln(2/δ)))
   (the implementation uses the stricter ln(4/δ) of Apple's reference code and
   otherwise a numerical bound that holds for every ε₀ and n).
3. *What it does not cover.* Releases that are only record-level DP with respect
   to a client's dataset (functional mechanism, DP-SGD, noise calibrated to one
   record) are not ε₀-LDP reports: FMT needs the randomizer's output on *any*
   input to be e^{ε₀}-close to its output on any other input. Nor does it cover
   reports that identify their sender (different mechanisms or parameters per
   client, or a data-dependent or client-specific weight travelling with the
   segments): FMT assumes one common randomizer. Layer-wise splitting adds no
   provable amplification beyond whole-report shuffling here.

Layer grouping (:func:`layer_groups`, :func:`default_layer_of`) is the wire contract of
:mod:`flwr_dp_strategies.wire`, shared with the strategies that split replies by layer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

import numpy as np

from .privacy.rng import RngLike, RngSource
from .wire import default_layer_of, layer_groups

Segment = TypeVar("Segment")


class LayerShuffler:
    """Split & Shuffle per layer: an independent uniform permutation for each layer.

    Args:
        rng: ``None`` (a fresh OS-entropy generator at every call), an ``int``
            seed or a :class:`numpy.random.Generator` (reproducible; tests only).

    See the module docstring for the trust assumption and the privacy analysis.
    """

    def __init__(self, rng: RngLike = None) -> None:
        self._rng = RngSource(rng)

    def permutations(self, n: int, m: int) -> np.ndarray:
        """An (m, n) array: row j is π_j, and π_j[r] is the client whose layer j goes to report r."""
        if n < 1 or m < 1:
            raise ValueError(f"need at least one report and one layer, got n={n}, m={m}")
        gen = self._rng()
        return np.stack([gen.permutation(n) for _ in range(m)])

    def shuffle(
        self, reports: Sequence[Sequence[Segment]], weights: Sequence[float]
    ) -> tuple[list[list[Segment]], list[list[float]]]:
        """Recombined reports and their per-segment weights: report r, layer j ← client π_j(r).

        ``reports[i][j]`` is client i's segment of layer j (an ndarray, or any
        object: segments are moved, never read); ``weights[i]`` is client i's
        weight, which travels with each of its segments.
        """
        n, m = _check_reports(reports, weights)
        perms = self.permutations(n, m)
        shuffled = [[reports[perms[j, r]][j] for j in range(m)] for r in range(n)]
        shuffled_weights = [[float(weights[perms[j, r]]) for j in range(m)] for r in range(n)]
        return shuffled, shuffled_weights


def _check_reports(reports: Sequence[Sequence[object]], weights: Sequence[float]) -> tuple[int, int]:
    n = len(reports)
    if n == 0 or len(weights) != n:
        raise ValueError(f"need n >= 1 reports and one weight per report, got {n} reports, {len(weights)} weights")
    m = len(reports[0])
    if m == 0 or any(len(report) != m for report in reports):
        raise ValueError("every report must have the same number m >= 1 of segments")
    if any(not math.isfinite(float(w)) or float(w) < 0 for w in weights):
        raise ValueError("weights must be finite and non-negative")
    return n, m


__all__ = ["LayerShuffler", "default_layer_of", "layer_groups"]
