r"""Offline score drift under the client mechanism: clean client vectors -> noisy -> cluster scores.

Given the clean inference vectors the server received in each round of a
``NOT_ENCRYPT`` run (array ``(rounds, n, k)``), :func:`drift_table` replays the
LAPLACE mode at several ε without re-training: each round's vectors go through
the *same* mechanism the clients use (:meth:`client_mods.LaplaceInferenceMod.protect`:
simplex check and projection, then i.i.d. Laplace(Δ₁/ε), Δ₁ = 2) and the *same*
scoring the server uses (:func:`flwr_dp_strategies.cluster_scores.cluster_scores`:
argmax labels, sklearn scores, 0 when fewer than 2 or more than n − 1 labels).
This is exact post-processing of the released data, so the offline noisy scores
have the same distribution as those a Flower run at that ε would report.

Per ε and over ``repetitions`` independent noise draws it reports, per score,
the mean and the median absolute drift :math:`|s_\text{noisy} - s_\text{clean}|`
over rounds and draws (at large ε rare argmax flips of near-tied clients make
the mean much larger than the median), the Spearman rank correlation of the
noisy and clean trajectories over the rounds (mean over draws; draws with a
constant trajectory are left out), and the share of (client, round) argmax
labels the noise left unchanged.

ε here is the true LDP ε of one vector's release (sensitivity 2). MindSpore's
configuration value for the same noise (scale 1/ε_MS) is ε/2.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
from flwr.app import Array, ArrayRecord
from scipy.stats import spearmanr

from client_mods import LaplaceInferenceMod
from flwr_dp_strategies.cluster_scores import argmax_labels, cluster_scores

SCORES = ("silhouette", "calinski-harabasz", "davies-bouldin")


def protect_points(points: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """``points`` (n, k) after the clients' mechanism at true LDP ``epsilon`` (one release per row)."""
    mod = LaplaceInferenceMod(epsilon, rng=rng)
    noisy, _ = mod.protect(ArrayRecord({"points": Array(np.asarray(points, dtype=np.float64))}), epsilon)
    return noisy["points"].numpy()


def score_trajectory(points_by_round: np.ndarray) -> dict[str, np.ndarray]:
    """Each score per round for points of shape (rounds, n, k)."""
    rows = [cluster_scores(points) for points in points_by_round]
    return {name: np.array([row[name] for row in rows]) for name in (*SCORES, "labels")}


def spearman(a: np.ndarray, b: np.ndarray) -> Optional[float]:
    """Spearman's rho of two trajectories; None when undefined (fewer than 3 points or a constant one)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    rho = float(spearmanr(a, b).statistic)
    return rho if np.isfinite(rho) else None


def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    """Mean of the defined values; None if there are none."""
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def drift_row(
    clean: np.ndarray, epsilon: float, repetitions: int, seed: int, clean_scores: Optional[dict[str, np.ndarray]] = None
) -> dict[str, Any]:
    """Drift of the scores at one ε (see module docstring); noise from ``default_rng([seed, rep])``."""
    clean = np.asarray(clean, dtype=np.float64)
    base = clean_scores if clean_scores is not None else score_trajectory(clean)
    clean_labels = argmax_labels(clean.reshape(-1, clean.shape[-1]))
    drift: dict[str, list[np.ndarray]] = {name: [] for name in SCORES}
    rho: dict[str, list[Optional[float]]] = {name: [] for name in SCORES}
    agreement: list[float] = []
    noisy_mean = {name: np.zeros(len(clean)) for name in SCORES}
    for rep in range(repetitions):
        rng = np.random.default_rng([seed, rep])
        noisy = np.stack([protect_points(points, epsilon, rng) for points in clean])
        scores = score_trajectory(noisy)
        for name in SCORES:
            drift[name].append(np.abs(scores[name] - base[name]))
            rho[name].append(spearman(base[name], scores[name]))
            noisy_mean[name] += scores[name] / repetitions
        agreement.append(float(np.mean(argmax_labels(noisy.reshape(-1, noisy.shape[-1])) == clean_labels)))
    return {
        "epsilon": float(epsilon),
        "mindspore_laplace_eval_eps": float(epsilon) / 2.0,
        "noise_scale": 2.0 / float(epsilon),
        "mean_abs_drift": {name: float(np.mean(drift[name])) for name in SCORES},
        "median_abs_drift": {name: float(np.median(drift[name])) for name in SCORES},
        "spearman": {name: _mean(rho[name]) for name in SCORES},
        "spearman_defined_draws": {name: sum(v is not None for v in rho[name]) for name in SCORES},
        "label_agreement": float(np.mean(agreement)),
        "noisy_mean_trajectory": {name: noisy_mean[name].tolist() for name in SCORES},
    }


def drift_table(clean: np.ndarray, epsilons: Sequence[float], repetitions: int, seed: int) -> list[dict[str, Any]]:
    """:func:`drift_row` for every ε in ``epsilons`` (clean scores computed once)."""
    clean = np.asarray(clean, dtype=np.float64)
    if clean.ndim != 3:
        raise ValueError(f"clean points must have shape (rounds, n, k), got {clean.shape}")
    base = score_trajectory(clean)
    return [drift_row(clean, eps, repetitions, seed, base) for eps in epsilons]
