"""One writer for every example's per-run results: a JSON file and a PNG of accuracy and ε per round.

Each example's ServerApp collects one row per round (``{"round": r,
"accuracy": a, "epsilon": e, ...}``; ``epsilon`` None means no DP, ε = ∞) and
calls :func:`write_run_results`, which writes ``<out_dir>/<json_name>`` (the
rows plus whatever the example adds under ``extra``) and ``<out_dir>/<png_name>``:
accuracy per round on the left, ε per round on the right (one line per
ε series), optional extra panels after them. Matplotlib runs on the Agg backend
(no display needed).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, Optional

RESULTS_JSON = "results.json"
RESULTS_PNG = "results.png"


def finite(value: Optional[float]) -> Optional[float]:
    """JSON-safe float: None for missing or non-finite values."""
    return None if value is None or not math.isfinite(value) else float(value)


def _series(rows: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    """``row[key]`` per row, NaN where missing or None (a gap in the plot)."""
    return [float("nan") if row.get(key) is None else float(row[key]) for row in rows]


def write_run_results(
    out_dir: str | os.PathLike,
    method: str,
    rounds: Sequence[Mapping[str, Any]],
    *,
    extra: Optional[Mapping[str, Any]] = None,
    initial_accuracy: Optional[float] = None,
    delta: Optional[float] = None,
    title: Optional[str] = None,
    accuracy_label: str = "central test accuracy",
    accuracy_series: Optional[Mapping[str, str]] = None,
    epsilon_label: str = "epsilon",
    epsilon_series: Optional[Mapping[str, str]] = None,
    epsilon_title: Optional[str] = None,
    no_dp_text: str = "no DP: epsilon = inf",
    panels: Sequence[Mapping[str, Any]] = (),
    json_name: str = RESULTS_JSON,
    png_name: Optional[str] = RESULTS_PNG,
    json_indent: Optional[int] = 2,
) -> str:
    """Write ``out_dir/json_name`` and its plot ``out_dir/png_name``; return the JSON path.

    The JSON is ``extra`` (the example's own fields: config, privacy summary,
    ...) with ``rounds`` and, unless ``extra`` has them, ``method`` and
    ``initial_accuracy``. The plot has:

    * accuracy (``row["accuracy"]``, or the ``accuracy_series`` {label: key})
      per round, starting at round 0 with ``initial_accuracy`` when given;
    * ε per round (``row["epsilon"]``, or several ``epsilon_series`` {label:
      key}); where no row has an ε, the panel says ``no_dp_text`` instead;
    * one more panel per entry of ``panels``: ``{"title": ..., "ylabel": ...,
      "series": {label: key}}``.

    ``png_name=None`` writes the JSON only.
    """
    os.makedirs(out_dir, exist_ok=True)
    data: dict[str, Any] = {"method": method}
    if initial_accuracy is not None:
        data["initial_accuracy"] = initial_accuracy
    data.update(extra or {})
    data["rounds"] = [dict(row) for row in rounds]
    path = os.path.join(os.fspath(out_dir), json_name)
    with open(path, "w") as handle:
        json.dump(data, handle, indent=json_indent)
        handle.write("\n")
    if png_name:
        plot_run(
            data["rounds"],
            os.path.join(os.fspath(out_dir), png_name),
            method=method,
            initial_accuracy=initial_accuracy,
            delta=delta,
            title=title,
            accuracy_label=accuracy_label,
            accuracy_series=accuracy_series,
            epsilon_label=epsilon_label,
            epsilon_series=epsilon_series,
            epsilon_title=epsilon_title,
            no_dp_text=no_dp_text,
            panels=panels,
        )
    return path


def plot_run(
    rows: Sequence[Mapping[str, Any]],
    path: str | os.PathLike,
    *,
    method: str,
    initial_accuracy: Optional[float] = None,
    delta: Optional[float] = None,
    title: Optional[str] = None,
    accuracy_label: str = "central test accuracy",
    accuracy_series: Optional[Mapping[str, str]] = None,
    epsilon_label: str = "epsilon",
    epsilon_series: Optional[Mapping[str, str]] = None,
    epsilon_title: Optional[str] = None,
    no_dp_text: str = "no DP: epsilon = inf",
    panels: Sequence[Mapping[str, Any]] = (),
) -> None:
    """The PNG of :func:`write_run_results` (see there)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rounds = [row["round"] for row in rows]
    fig, axes = plt.subplots(1, 2 + len(panels), figsize=(4.5 * (2 + len(panels)), 3.6), squeeze=False)
    ax_acc, ax_eps, *ax_more = axes[0]

    accuracy_series = dict(accuracy_series or {"": "accuracy"})
    for number, (label, key) in enumerate(accuracy_series.items()):
        xs, ys = list(rounds), _series(rows, key)
        if number == 0 and initial_accuracy is not None:
            xs, ys = [0] + xs, [float(initial_accuracy)] + ys
        ax_acc.plot(xs, ys, marker="o", label=label or None)
    if len(accuracy_series) > 1:
        ax_acc.legend(fontsize=7)
    ax_acc.set(xlabel="round", ylabel=accuracy_label, ylim=(0, 1), title=title or f"accuracy ({method})")

    epsilon_series = dict(epsilon_series or {"": "epsilon"})
    private = any(row.get(key) is not None for row in rows for key in epsilon_series.values())
    if private:
        for label, key in epsilon_series.items():
            ax_eps.plot(
                rounds,
                _series(rows, key),
                marker="o",
                label=label or None,
                color="tab:red" if len(epsilon_series) == 1 else None,
            )
        if len(epsilon_series) > 1:
            ax_eps.legend(fontsize=7)
        ax_eps.set(ylabel=epsilon_label, ylim=(0, None))
    else:
        ax_eps.text(0.5, 0.5, no_dp_text, ha="center", va="center", transform=ax_eps.transAxes)
        ax_eps.set(xticks=[], yticks=[])
    suffix = "" if delta is None or not private else f" (delta={delta:g})"
    ax_eps.set(xlabel="round", title=epsilon_title or f"privacy spent{suffix}")

    for ax, panel in zip(ax_more, panels):
        for label, key in panel["series"].items():
            ax.plot(rounds, _series(rows, key), marker=".", label=label)
        if len(panel["series"]) > 1:
            ax.legend(fontsize=7)
        ax.set(xlabel="round", ylabel=panel.get("ylabel", ""), title=panel.get("title", ""))
    for ax in axes[0]:
        if private or ax is not ax_eps:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


__all__ = ["RESULTS_JSON", "RESULTS_PNG", "finite", "plot_run", "write_run_results"]
