"""Where the ServerApp writes its run log, and the run's plot (scores, accuracy and ε against the round).

``results-file`` (an explicit JSON path) wins; otherwise the log goes to
``<results-dir>/run-<mode>.json`` (``run-laplace.json`` / ``run-not-encrypt.json``,
the names ``run_experiment.py`` uses). The plot lies next to it, with ``.png``.
"""

from __future__ import annotations

import os
from typing import Any

SCORES = (("silhouette", "silhouette (higher = better)"), ("davies-bouldin", "Davies-Bouldin (lower = better)"),
          ("calinski-harabasz", "Calinski-Harabasz (higher = better)"))


def results_paths(config: dict[str, Any]) -> tuple[str, str]:
    """(JSON path, PNG path) of this run, absolute."""
    mode = str(config["privacy-eval-type"]).lower().replace("_", "-")
    json_path = os.path.abspath(str(config["results-file"]) or
                                os.path.join(str(config["results-dir"]), f"run-{mode}.json"))
    return json_path, os.path.splitext(json_path)[0] + ".png"


def plot_run(data: dict[str, Any], path: str) -> None:
    """Accuracy, the three cluster scores and the composed ε against the round (matplotlib Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = data["rounds"]
    rounds = [row["round"] for row in rows]

    def series(key: str) -> list[float]:
        return [float("nan") if row[key] is None else row[key] for row in rows]

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
    axes[0].plot([0] + rounds, [data["initial_accuracy"]] + series("accuracy"), marker=".", label="central test")
    axes[0].plot(rounds, series("client_accuracy"), marker=".", label="clients (local eval)")
    axes[0].set(ylabel="accuracy", ylim=(0, 1), title="training progress")
    axes[0].legend(fontsize=8)
    for ax, (key, title) in zip(axes[1:3], SCORES[:2]):
        ax.plot(rounds, series(key), marker=".", color="black")
        ax.set(title=title)
    ch = axes[2].twinx()
    ch.plot(rounds, series(SCORES[2][0]), marker="s", linestyle="--", color="tab:green")
    ch.set_ylabel(SCORES[2][1], color="tab:green")
    axes[2].set(title=f"{SCORES[1][1]}; CH in green")
    if data["privacy_eval_type"] == "LAPLACE":
        axes[3].plot(rounds, series("epsilon"), marker=".", color="tab:red")
        axes[3].set(ylabel="epsilon per client (LDP, composed)",
                    title=f"privacy spent (LAPLACE, {data['laplace_eval_eps']:g} per round)")
    else:
        axes[3].text(0.5, 0.5, "NOT_ENCRYPT: sent without noise,\nepsilon = inf", ha="center", va="center",
                     transform=axes[3].transAxes)
        axes[3].set(title="privacy spent")
    for ax in axes:
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(f"{data['config']['dataset']}: cluster scores of the clients' mean softmax vectors", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
