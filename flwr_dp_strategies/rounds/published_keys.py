"""Every key a strategy of this package may publish in Flower's round metrics, with what protects it.

A round's metrics leave the server (Flower's ``Result``, its logs, whoever reads them), so each value
is either public (fixed by the configuration, not by the clients' data nor by who replied), a figure of
the privacy ledger, or a function of an output that is already accounted (post-processing of a
released model, of noised counts, of locally randomised uploads). Counts that move with who replied
and un-noised statistics of the replies are kept for the operator instead
(:attr:`~.template.AccountedRound.server_figures`, the server log; rejection counts in
:attr:`~.client_accounting.ClientAccountingMixin.rejections`).

``tests/test_published_keys.py`` runs every registered strategy for a round of each phase and fails on
a key that is neither here nor one of the clients' own metric keys (Flower's weighted mean of what the
clients sent, :data:`CLIENT_METRICS`), so a new data-dependent key cannot ship unnoticed.
"""

from __future__ import annotations

import re
from typing import Optional

PUBLIC = "public: fixed by the configuration"
LEDGER = "the privacy ledger's figure"
POST = "post-processing of an accounted release"
ACCOUNTED = "noised and booked in the ledger"

PUBLISHED: dict[str, tuple[str, str]] = {
    # the ledger (every strategy)
    "privacy/epsilon": (LEDGER, "worst ε so far at the ledger's δ over the clients that followed the protocol"),
    "privacy/max-epsilon": (PUBLIC, "the ledger's budget, when one is set"),
    "privacy/delta": (LEDGER, "the ledger's δ"),
    "privacy/epsilon-rdp": (LEDGER, "ε from the RDP accountant"),
    "privacy/epsilon-pld": (LEDGER, "ε from the PLD accountant"),
    "privacy/clients": (LEDGER, "clients with a booked event so far"),
    "privacy/epsilon/node-<id>": (LEDGER, "a node's own ε (per_client_metrics=True)"),
    "privacy/epsilon-record-level": (
        LEDGER,
        "with record-level bookings only: worst ε over the protocol-following nodes of each node's own "
        "record-level events and the central record-level ones (one record of one client; a guarantee for the "
        "whole pipeline only when every reply is computed from those releases, see "
        "PrivacyLedger.record_level_report)",
    ),
    "privacy/epsilon-client-level": (
        LEDGER,
        "with record-level bookings only: worst ε of the central client-level events and each node's own "
        "client-level events (one whole client, the server trusted; ∞ for a node with record-level events unless "
        "the strategy's central release covers every reply, and ∞ for all with a central record-level event, "
        "see PrivacyLedger.client_level_report)",
    ),
    # the clients' evaluate metrics, every strategy (evaluate_metrics=AccountedMetrics(ranges, z))
    "dp-eval/<key>": (
        ACCOUNTED,
        "a declared evaluate metric: the bounded mean over the nodes asked, noised (rounds.client_metrics)",
    ),
    # central Gaussian strategies
    "dp/clipping-norm": (POST, "adaptive clipping: the next C, from the noised unclipped count"),
    "dp/unclipped-fraction": (POST, "adaptive clipping: the noised unclipped fraction"),
    "dp/noise-multiplier": (PUBLIC, "distributed DP: the calibrated noise multiplier of the planned n_h shares"),
    "secagg/peak-fraction": (POST, "distributed DP: the peak of the revealed noised sum"),
    "objective/noisy-count": (POST, "SecureObjectiveSum: the noised record count of the revealed sum"),
    # selection and shuffling
    "selection/epsilon": (LEDGER, "MinDivergenceExpSampling: the selection ledger's ε"),
    "selection/k-requested": (PUBLIC, "MinDivergenceExpSampling: num_selected"),
    "selection/layers": (PUBLIC, "MinDivergenceExpSampling: the model's layers"),
    "shuffle/epsilon": (LEDGER, "ShuffleAmplifiedFedAvg: the shuffle ledger's ε"),
    "shuffle/delta": (LEDGER, "ShuffleAmplifiedFedAvg: the shuffle ledger's δ"),
    "shuffle/epsilon0": (LEDGER, "ShuffleAmplifiedFedAvg: the worst local ε₀ the clients declared"),
    "shuffle/layers": (PUBLIC, "ShuffleAmplifiedFedAvg: the model's layers"),
    "shuffle/epsilon-paper": (PUBLIC, "ShuffleAmplifiedFedAvg (amplification='paper'): ε₀/m, not a DP bound"),
    # SignDS: MagRR's state is sent to every client in the next round's config
    "signds/step": (PUBLIC, "SignDS: the step size of r_est and the number of nodes asked"),
    "signds/r-est-used": (POST, "SignDS: MagRR's r_est this round (from randomised-response bits)"),
    "signds/r-est": (POST, "SignDS: MagRR's next r_est (from randomised-response bits)"),
    "signds/is-reached": (POST, "SignDS: MagRR's phase (from randomised-response bits)"),
    "signds/majority": (POST, "SignDS: the debiased majority of the randomised-response bits"),
    "signds/dense-values": (PUBLIC, "SignDS: the model's size"),
    "signds/values-per-client": (PUBLIC, "SignDS: the upload's size, fixed by the configuration"),
    "signds/bytes-per-client": (PUBLIC, "SignDS: the upload's bytes, fixed by the configuration"),
    "signds/payload-bytes-per-client": (PUBLIC, "SignDS: the upload's payload bytes"),
    # cluster evaluation of Laplace-protected (or booked non-private) inference points
    "cluster/silhouette": (POST, "ClusterEvaluation: score of the protected points"),
    "cluster/calinski-harabasz": (POST, "ClusterEvaluation: score of the protected points"),
    "cluster/davies-bouldin": (POST, "ClusterEvaluation: score of the protected points"),
    "cluster/labels": (POST, "ClusterEvaluation: labels among the protected points"),
    "unsupervised-eval": (POST, "ClusterEvaluation: the configured eval-type's score"),
}
"""``key: (what protects it, what it is)``; ``<id>`` stands for a node id."""

CLIENT_METRICS = (
    "the clients' own metric keys (Flower's weighted mean of what each client sent, as Flower's FedAvg "
    "publishes it): only when asked for by name (evaluate_metrics='flower', publish_client_metrics=True), "
    "booked non-private; or post-processing of what every client declared"
)


def protection(key: str) -> Optional[str]:
    """What protects ``key`` (an entry of :data:`PUBLISHED`, ``<id>`` matching a node id), or None."""
    if key in PUBLISHED:
        return PUBLISHED[key][0]
    for pattern, (protected_by, _) in PUBLISHED.items():
        regex = re.escape(pattern).replace("<id>", r"\d+").replace("<key>", r".+")
        if "<" in pattern and re.fullmatch(regex, key):
            return protected_by
    return None


__all__ = ["ACCOUNTED", "CLIENT_METRICS", "LEDGER", "POST", "PUBLIC", "PUBLISHED", "protection"]
