"""The plot of one vertical run: test accuracy and ε against the round (next to its JSON)."""

from __future__ import annotations

from typing import Any


def plot_run(results: dict[str, Any], path: str) -> None:
    """Test accuracy (true test labels) at each evaluation round, and the label ε spent (matplotlib Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows, config = results["rounds"], results["config"]
    rounds = [row["round"] for row in rows]
    fig, (ax_acc, ax_eps) = plt.subplots(1, 2, figsize=(9, 3.5))
    ax_acc.plot(rounds, [row["accuracy"] for row in rows], marker="o")
    ax_acc.axhline(0.1, linestyle=":", color="black", label="chance (10 classes)")
    ax_acc.set(xlabel="round (train step)", ylabel="test accuracy (true labels)", ylim=(0, 1),
               title=f"vertical FL on {config['dataset']}\nlabel eps {results['label_epsilon']}")
    ax_acc.legend(fontsize=8)
    epsilon = results["privacy"]["ledger_epsilon"]
    if epsilon is None:
        ax_eps.text(0.5, 0.5, "no label DP: epsilon = inf", ha="center", va="center", transform=ax_eps.transAxes)
    else:
        ax_eps.step([0] + rounds, [epsilon] * (len(rounds) + 1), where="post", color="tab:red", marker=".")
        ax_eps.set(ylim=(0, 1.2 * epsilon))
    ax_eps.set(xlabel="round (train step)", ylabel="epsilon (label-level, replace-one)",
               title="privacy spent\n(one randomized-response release, round 0)")
    for ax in (ax_acc, ax_eps):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
