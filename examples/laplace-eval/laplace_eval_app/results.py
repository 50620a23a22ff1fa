"""Where the ServerApp writes its run log and its plot (``flwr_dp_experiments.results`` draws it).

``results-file`` (an explicit JSON path) wins; otherwise the log goes to
``<results-dir>/run-<mode>.json`` (``run-laplace.json`` / ``run-not-encrypt.json``,
the names ``run_experiment.py`` uses). The plot lies next to it, with ``.png``.
"""

from __future__ import annotations

import os
from typing import Any

SCORES = (
    ("silhouette", "silhouette (higher = better)"),
    ("davies-bouldin", "Davies-Bouldin (lower = better)"),
    ("calinski-harabasz", "Calinski-Harabasz (higher = better)"),
)


def results_paths(config: dict[str, Any]) -> tuple[str, str]:
    """(JSON path, PNG path) of this run, absolute."""
    mode = str(config["privacy-eval-type"]).lower().replace("_", "-")
    json_path = os.path.abspath(
        str(config["results-file"]) or os.path.join(str(config["results-dir"]), f"run-{mode}.json")
    )
    return json_path, os.path.splitext(json_path)[0] + ".png"
