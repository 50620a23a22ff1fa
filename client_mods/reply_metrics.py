"""What a local-DP mod does with the metrics beside its release: withhold them, or declare them.

A local-DP mod (:class:`~client_mods.LocalUpdateNoiseMod`, :func:`~client_mods.signds_mod`,
:class:`~client_mods.LaplaceInferenceMod`) privatises its ArrayRecord. The
reply's MetricRecords are computed from the same private data (``train-loss``,
``eval-acc``) and the exact ``num-examples`` is a count of the client's records;
sent as they are, they would leave the client un-noised next to the DP release
and void it. So by default :func:`settle_metrics` replaces them with one
MetricRecord holding only a *public* weight (``{weighted_by_key: 1.0}``, so
FedAvg's weighted mean becomes the plain mean of the clients' releases), and
nothing data-dependent leaves the client un-noised.

Opt-out (``release_metrics=True`` on the mod): the metrics are sent as they are
and the reply declares a :class:`~dp_accounting.dp_event.NonPrivateDpEvent`, so
the server's ledger reports ε = ∞ for that client — the truth about an
un-noised release. Use it for debugging, or where the metrics are not private.
"""

from __future__ import annotations

from dp_accounting.dp_event import NonPrivateDpEvent
from flwr.app import MetricRecord, RecordDict

from flwr_dp_strategies.declarations import declare_release

PUBLIC_WEIGHT = 1.0
NON_PRIVATE_METRICS_LABEL = "client metrics (sent un-noised: non-private)"


def withhold_metrics(
    content: RecordDict, weighted_by_key: str = "num-examples", public_weight: float = PUBLIC_WEIGHT
) -> None:
    """Replace every MetricRecord of ``content`` by one ``{weighted_by_key: public_weight}``.

    The record keeps the name of the first MetricRecord (``"metrics"`` if there was none).
    """
    names = [name for name, record in content.items() if isinstance(record, MetricRecord)]
    for name in names:
        del content[name]
    content[names[0] if names else "metrics"] = MetricRecord({weighted_by_key: float(public_weight)})


def settle_metrics(content: RecordDict, *, release_metrics: bool, weighted_by_key: str = "num-examples") -> None:
    """Withhold the reply's metrics (default), or keep them and declare them non-private."""
    if release_metrics:
        declare_release(
            content, NonPrivateDpEvent(), label=NON_PRIVATE_METRICS_LABEL, neighboring_relation="replace_one"
        )
    else:
        withhold_metrics(content, weighted_by_key)


__all__ = ["NON_PRIVATE_METRICS_LABEL", "PUBLIC_WEIGHT", "settle_metrics", "withhold_metrics"]
