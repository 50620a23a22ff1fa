"""Unsupervised cluster scores of clients' (noisy) inference results (seed 000; MindSpore §6.3).

Each client contributes one point :math:`x_i \\in \\mathbb R^k` (its mean
softmax output, Laplace-protected or not); its cluster label is
:math:`\\arg\\max_c x_{i,c}` (first maximum). The scores are scikit-learn's:

* silhouette (Rousseeuw 1987): mean of :math:`(b_i - a_i)/\\max(a_i, b_i)`, higher is better;
* Calinski–Harabasz (1974): between/within dispersion ratio, higher is better;
* Davies–Bouldin (1979): mean worst similarity of a cluster to another, lower is better.

As MindSpore does, a score is 0 when the number of distinct labels L is < 2 or > n − 1
(the scores are undefined there); ``points`` and ``labels`` are reported with them.
Unlike MindSpore's Davies–Bouldin, labels need not be contiguous (sklearn relabels).
Scores are computed on the points scaled by their largest absolute value when that
exceeds 1 (silhouette, Calinski–Harabasz and Davies–Bouldin are invariant under a
common scaling, so nothing changes but the range: values like ±1e308 cannot
overflow the squared distances); a score that is still not finite (e.g. a
degenerate clustering) is reported as 0, like an undefined one, never as NaN.
No Flower import: usable on any array of points. scikit-learn is imported when a score is first computed
(the ``clustering`` extra: ``pip install "flwr-dp-strategies[clustering]"``), so importing the strategies does not
need it.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

EVAL_TYPES = ("SILHOUETTE_SCORE", "CALINSKI_HARABASZ_SCORE", "DAVIES_BOULDIN_SCORE")
_SCORER_NAMES = {
    "SILHOUETTE_SCORE": "silhouette_score",
    "CALINSKI_HARABASZ_SCORE": "calinski_harabasz_score",
    "DAVIES_BOULDIN_SCORE": "davies_bouldin_score",
}


def _scorer(eval_type: str):
    """scikit-learn's scorer of ``eval_type`` (ImportError naming the extra when scikit-learn is missing)."""
    try:
        from sklearn import metrics
    except ImportError as err:  # pragma: no cover - exercised in a core-only install (tests/test_packaging.py)
        raise ImportError('cluster scores need scikit-learn: pip install "flwr-dp-strategies[clustering]"') from err
    return getattr(metrics, _SCORER_NAMES[eval_type])


METRIC_NAMES = {
    "SILHOUETTE_SCORE": "silhouette",
    "CALINSKI_HARABASZ_SCORE": "calinski-harabasz",
    "DAVIES_BOULDIN_SCORE": "davies-bouldin",
}


def check_eval_type(eval_type: str) -> str:
    """The eval type in upper case; ValueError naming the allowed values otherwise."""
    value = str(eval_type).upper()
    if value not in EVAL_TYPES:
        raise ValueError(f"eval_type must be one of {EVAL_TYPES}, got {eval_type!r}")
    return value


def argmax_labels(points: np.ndarray) -> np.ndarray:
    """Cluster label of each point: the index of its first maximum."""
    return np.argmax(points, axis=1)


def cluster_scores(points: np.ndarray, eval_types: Optional[tuple[str, ...]] = None) -> dict[str, float]:
    """``{silhouette, calinski-harabasz, davies-bouldin, points, labels}`` of the argmax clustering.

    Args:
        points: (n, k) finite array, one row per client.
        eval_types: the scores to compute (default: all three).
    """
    x = np.asarray(points, dtype=np.float64)
    if x.ndim != 2 or not np.isfinite(x).all():
        raise ValueError(f"points must be a finite (n, k) array, got shape {x.shape}")
    labels = argmax_labels(x) if len(x) else np.zeros(0, dtype=int)
    n, num_labels = len(x), len(np.unique(labels))
    out = {"points": float(n), "labels": float(num_labels)}
    defined = 2 <= num_labels <= n - 1
    scale = float(np.abs(x).max()) if x.size else 0.0
    scaled = x / scale if scale > 1.0 else x
    for eval_type in eval_types or EVAL_TYPES:
        eval_type = check_eval_type(eval_type)
        name = METRIC_NAMES[eval_type]
        value = float(_scorer(eval_type)(scaled, labels)) if defined else 0.0
        out[name] = value if math.isfinite(value) else 0.0
    return out


__all__ = ["EVAL_TYPES", "METRIC_NAMES", "argmax_labels", "check_eval_type", "cluster_scores"]
