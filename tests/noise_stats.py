"""Statistics the noise tests share."""

from __future__ import annotations

import numpy as np


def covariance_z_scores(samples: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """(Σ̂ − Σ)/se entrywise, Σ̂ = W Wᵀ/n (mean 0 known): for Gaussian rows Var(Σ̂_ij) = (Σ_ii Σ_jj + Σ_ij²)/n."""
    n = samples.shape[1]
    empirical = samples @ samples.T / n
    se = np.sqrt((np.outer(np.diag(expected), np.diag(expected)) + expected**2) / n)
    return (empirical - expected) / se
