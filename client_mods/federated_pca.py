r"""Client side of LDP federated PCA (DELM Algorithm 2, lines 1-5 and 10-12).

* :func:`covariance_reply` answers the server's ``train.pca`` message with the
  client's second-moment matrix :math:`\sum_r x_r x_r^\top` (rows clipped to unit
  norm) plus noise, and declares the release (Analyze Gauss by default,
  ``GaussianDpEvent``; the paper's Wishart noise is not DP and is declared as
  ``NonPrivateDpEvent``, see :mod:`flwr_dp_strategies.privacy.mechanisms.covariance`), with the unit
  ``"record"``: the sensitivity is that of one row (one record) of the client.
* :func:`store_projection` keeps the server's projection :math:`\tilde V_{[k]}`
  (message ``train.pca_projection``) in ``context.state``; :func:`project` maps a
  client's rows to :math:`x^\top\tilde V` for the functional-mechanism trainer.
  The projection is post-processing of the clients' releases.

Wire it in a ClientApp::

    @app.train("pca")
    def pca(msg, context):
        return covariance_reply(msg, context, load_features(context), epsilon=1 / 3)

    @app.train("pca_projection")
    def projection(msg, context):
        return store_projection(msg, context)
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict

from flwr_dp_strategies.declarations import declare_release
from flwr_dp_strategies.privacy.mechanisms.covariance import covariance_replace_one_event, private_second_moment
from flwr_dp_strategies.privacy.mechanisms.functional_mechanism import clip_rows
from flwr_dp_strategies.privacy.rng import RngLike

COVARIANCE_KEY = "covariance"
PROJECTION_KEY = "projection"
STATE_KEY = "ldp-fpca-projection"
EVENT_LABEL = "ldp-fpca/covariance"


def covariance_reply(
    msg: Message,
    context: Context,
    features: np.ndarray,
    *,
    epsilon: float,
    delta: float = 1e-5,
    noise: str = "analyze-gauss",
    neighboring_relation: str = "replace_one",
    rng: RngLike = None,
) -> Message:
    """Reply with the noisy second moment (float64, d × d) and declare its event.

    The declaration names ``neighboring_relation``, the relation the noise was calibrated for
    (:func:`~flwr_dp_strategies.privacy.mechanisms.covariance.covariance_l2_sensitivity`: Δ₂ = 1 for
    ``"add_or_remove_one"``, √2 for ``"replace_one"``); an add/remove declaration carries its
    replace-one form (:func:`~flwr_dp_strategies.privacy.mechanisms.covariance.covariance_replace_one_event`),
    so a replace-one ledger books the √2 bound rather than the generic 2.
    """
    release = private_second_moment(
        features, epsilon=epsilon, delta=delta, noise=noise, neighboring_relation=neighboring_relation, rng=rng
    )
    weight = float(len(features)) if neighboring_relation == "replace_one" else 1.0
    content = RecordDict(
        {
            "arrays": ArrayRecord({COVARIANCE_KEY: Array(release.value)}),
            "metrics": MetricRecord({"num-examples": weight}),
        }
    )
    declare_release(
        content,
        release.event,
        label=EVENT_LABEL,
        neighboring_relation=neighboring_relation,
        replace_one_event=covariance_replace_one_event(release.event)
        if neighboring_relation == "add_or_remove_one"
        else None,
        unit="record",
    )
    return Message(content, reply_to=msg)


def store_projection(msg: Message, context: Context) -> Message:
    """Keep the server's projection (d × k) in ``context.state``; reply with an empty acknowledgement."""
    records = list(msg.content.array_records.values())
    if len(records) != 1 or PROJECTION_KEY not in records[0]:
        raise ValueError(f"the projection message must carry one ArrayRecord with key {PROJECTION_KEY!r}")
    matrix = records[0][PROJECTION_KEY].numpy()
    if matrix.ndim != 2 or not np.isfinite(matrix).all():
        raise ValueError(f"projection must be a finite 2-D array, got shape {matrix.shape}")
    context.state[STATE_KEY] = ArrayRecord({PROJECTION_KEY: Array(np.ascontiguousarray(matrix))})
    return Message(RecordDict({"metrics": MetricRecord({"num-examples": 1.0})}), reply_to=msg)


def projection_from_state(context: Context) -> np.ndarray:
    """The stored projection; ``LookupError`` if the federated PCA has not run on this node."""
    if STATE_KEY not in context.state.array_records:
        raise LookupError("no LDP-FPCA projection in context.state: run the federated PCA first")
    return context.state.array_records[STATE_KEY][PROJECTION_KEY].numpy()


def project(features: np.ndarray, projection: np.ndarray) -> np.ndarray:
    """Rows clipped to unit norm, then mapped to xᵀV (norm ≤ 1 for orthonormal V)."""
    return clip_rows(features) @ projection


__all__ = [
    "COVARIANCE_KEY",
    "EVENT_LABEL",
    "PROJECTION_KEY",
    "STATE_KEY",
    "covariance_reply",
    "project",
    "projection_from_state",
    "store_projection",
]
