r"""Functional-mechanism trainer for a Flower ClientApp (DELM Algorithm 1, line 7).

The client trains a linear softmax (or logistic) head :math:`W\in\mathbb R^{q\times c}`
on features with :math:`\lVert z\rVert_2\le 1` (rows are clipped): typically
:math:`z = V^\top x` for the LDP-FPCA projection :math:`V` (orthonormal columns,
so :math:`\lVert V^\top x\rVert\le\lVert x\rVert`; see :mod:`client_mods.federated_pca`)
or any data-independent feature map.

What leaves the client, and why it is private:

1. The first time it trains, the client computes the coefficients of its
   degree-2 Taylor objective, :math:`(A, \operatorname{triu}S)`, and perturbs them
   once (:func:`flwr_dp_strategies.privacy.mechanisms.functional_mechanism.functional_mechanism`):
   ε-DP for one record of its data (Laplace, FM) or (ε, δ)-DP (Gaussian).
   The noisy coefficients (after PSD repair, post-processing) are kept in
   ``context.state`` - on the node, never sent - and the release is declared.
2. Every round it runs ``local_steps`` of gradient descent on that fixed noisy
   objective from the global head and returns the new head: a function of the
   noisy coefficients and of the global model only, i.e. post-processing. Later
   rounds declare ``NoOpDpEvent``; the client's ε does not grow with rounds.
3. The feature map must itself be private (LDP-FPCA: its release is accounted
   separately) or data-independent; only a head is trained. DELM's paper trains
   a ReLU hidden layer with FM, but a ReLU network's loss is not a polynomial in
   its weights and the paper gives no sensitivity for the hidden layer; this
   trainer does not claim that.
4. With ``upload="objective"`` the client sends the noisy coefficients
   :math:`(\tilde A, \tilde S)` themselves (unrepaired, the same release, re-sent
   unchanged every round) for :class:`flwr_dp_strategies.NoisyObjectiveSum`,
   which sums the clients' objectives and repairs and solves the sum on the
   server (less bias than repairing each client's; see that strategy).
5. ``num-examples`` is sent as the reply's weight: public under the replace-one
   relation (the default, as in the paper: replacing a record keeps n). The trainer
   refuses ``neighboring_relation="add_or_remove_one"``: under add/remove the record
   count n is private, and the released statistics carry it exactly (a server
   recovered n = 50.000000 / 51.000000 from the objective upload and ``train-loss``;
   with ``upload="head"`` the head's privacy loss alone was ε(1e-5) = 2.12 against a
   claimed 1). Protecting n would need a noisy count; the replace-one guarantee is
   the paper's and is what the trainer offers.

Guarantee: the client's whole participation is ε_FM-DP (record level, under the
chosen relation), plus whatever its feature map cost, whatever the number of rounds.
The release is declared with the unit ``"record"``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from dp_accounting import dp_event
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from flwr_dp_strategies.declarations import declare_release
from flwr_dp_strategies.privacy.mechanisms.functional_mechanism import (
    QuadraticStatistics,
    descend,
    functional_mechanism,
    quadratic_statistics,
    repaired,
    smooth_step_size,
    taylor_objective,
)
from flwr_dp_strategies.privacy.rng import RngLike, RngSource
from flwr_dp_strategies.privacy.validation import check_epsilon, check_int, check_nonnegative, check_positive
from flwr_dp_strategies.wire import LINEAR_KEY, QUADRATIC_KEY

STATE_KEY = "functional-mechanism"
UPLOADS: tuple[str, ...] = ("head", "objective")
EVENT_LABEL = "functional-mechanism/objective"


class FunctionalMechanismTrainer:
    """Train a head on a noisy Taylor objective computed once per client.

    Args:
        epsilon: ε in (0, inf) of the one-time release of the objective's coefficients.
        num_classes: c ≥ 2 (``loss="logistic"`` needs c = 2).
        loss: ``"softmax"`` (multi-class cross-entropy) or ``"logistic"`` (binary, DELM eq. 6).
        noise: ``"laplace"`` (FM, pure ε) or ``"gaussian"`` ((ε, delta), dimension-free sensitivity).
        delta: δ in (0, 1) for ``noise="gaussian"``.
        neighboring_relation: ``"replace_one"`` (the paper's, the only one accepted: under
            ``"add_or_remove_one"`` the exact record count would be released; see item 5 above).
        calibration: ``"sound"`` (tight L2-ball bound) or ``"paper"`` (DELM eqs. 9/13, to reproduce the
            paper only: it is *not* a valid bound for the logistic loss at q ≤ 2, e.g. 1.25 at q = 1 where
            the true replace-one sensitivity is at least 1.56; the noise then follows the paper, and the
            declared event carries the true ε for the sound sensitivity).
        psd_floor: eigenvalue floor (per record) of the repaired quadratic, ≥ 0.
        local_steps: gradient steps per round, ≥ 0.
        learning_rate: step size on the objective divided by n, ≥ 0; ``None``: the
            smooth step 1/L of the client's noisy objective
            (:func:`~flwr_dp_strategies.privacy.mechanisms.functional_mechanism.smooth_step_size`,
            post-processing), capped at ``max_learning_rate``.
        max_learning_rate: cap of the ``None`` step, > 0.
        ridge: L2 regularisation λ (objective/n + ½λ‖W‖²), ≥ 0; data-independent.
        weights_key: the ArrayRecord key of the head (shape (q, c), or (q, 1) for logistic).
        upload: ``"head"`` (DELM: the head after ``local_steps``, for FedAvg-like strategies) or
            ``"objective"`` (the noisy coefficients under ``fm.linear`` / ``fm.quadratic``,
            for :class:`flwr_dp_strategies.NoisyObjectiveSum`).
        rng: None (fresh OS entropy), an int seed or a Generator (tests only).
    """

    def __init__(
        self,
        epsilon: float,
        *,
        num_classes: int,
        loss: str = "softmax",
        noise: str = "laplace",
        delta: float = 1e-5,
        neighboring_relation: str = "replace_one",
        calibration: str = "sound",
        psd_floor: float = 0.0,
        local_steps: int = 5,
        learning_rate: Optional[float] = 1.0,
        max_learning_rate: float = 10.0,
        ridge: float = 0.0,
        weights_key: str = "head.weight",
        upload: str = "head",
        rng: RngLike = None,
    ) -> None:
        self.epsilon = check_epsilon(epsilon)
        self.num_classes = check_int("num_classes", num_classes, minimum=2)
        self.loss, self.noise, self.delta = loss, noise, delta
        if neighboring_relation != "replace_one":
            raise ValueError(
                "neighboring_relation must be 'replace_one': under 'add_or_remove_one' the FM "
                f"statistics and train-loss release the exact record count, got {neighboring_relation!r}"
            )
        self.neighboring_relation, self.calibration = neighboring_relation, calibration
        self.psd_floor = check_nonnegative("psd_floor", psd_floor)
        self.local_steps = check_int("local_steps", local_steps, minimum=0)
        self.learning_rate = None if learning_rate is None else check_nonnegative("learning_rate", learning_rate)
        self.max_learning_rate = check_positive("max_learning_rate", max_learning_rate)
        self.ridge = check_nonnegative("ridge", ridge)
        self.weights_key = weights_key
        if upload not in UPLOADS:
            raise ValueError(f"upload must be one of {UPLOADS}, got {upload!r}")
        self.upload = upload
        self._rng = RngSource(rng)

    # ------------------------------------------------------------ the release
    def noisy_objective(
        self, context: Context, features: np.ndarray, labels: np.ndarray
    ) -> tuple[QuadraticStatistics, Optional[dp_event.DpEvent]]:
        """The noisy statistics, and the event if they were released just now (None if reused).

        Repaired (PSD, post-processing) for ``upload="head"``; as released for ``"objective"``.
        """
        stored = _load(context)
        if stored is not None:
            return self._as_uploaded(context, *stored), None
        exact = quadratic_statistics(features, labels, num_classes=self.num_classes, loss=self.loss)
        release = functional_mechanism(
            exact,
            epsilon=self.epsilon,
            neighboring_relation=self.neighboring_relation,
            calibration=self.calibration,
            noise=self.noise,
            delta=self.delta,
            rng=self._rng(),
        )
        return self._as_uploaded(context, release.value, False), release.event

    def _as_uploaded(self, context: Context, stats: QuadraticStatistics, is_repaired: bool) -> QuadraticStatistics:
        """``stats`` as this trainer uses them (repaired for heads, raw for objectives), stored so once."""
        if self.upload == "objective":
            if is_repaired:
                raise ValueError(
                    "this node's stored objective was repaired for upload='head'; "
                    "upload='objective' needs the raw release (a fresh node state)"
                )
            if STATE_KEY not in context.state.array_records:
                _store(context, stats, False)
            return stats
        if not is_repaired:
            stats = repaired(stats, self.psd_floor * stats.count)
            _store(context, stats, True)
        return stats

    # ------------------------------------------------------------ one round
    def train(self, msg: Message, context: Context, features: np.ndarray, labels: np.ndarray) -> Message:
        """Reply to a train message: descend from the global head on the noisy objective, declare."""
        stats, event = self.noisy_objective(context, features, labels)
        arrays = msg.content.array_records
        if len(arrays) != 1 or self.weights_key not in next(iter(arrays.values())):
            raise ValueError(f"the train message must carry one ArrayRecord with key {self.weights_key!r}")
        record = next(iter(arrays.values()))
        start = record[self.weights_key].numpy()
        if start.size != stats.linear.size:
            raise ValueError(
                f"{self.weights_key} must have {stats.linear.size} entries "
                f"(features {stats.dim} x {stats.linear.shape[1]}), got shape {start.shape}"
            )
        if self.upload == "objective":
            return self._objective_reply(msg, stats, start, event)
        new = descend(stats, start, steps=self.local_steps, learning_rate=self.step_size(stats), ridge=self.ridge)
        return self._reply(msg, record, new.reshape(start.shape).astype(start.dtype), stats, event)

    def step_size(self, stats: QuadraticStatistics) -> float:
        """``learning_rate``, or min(1/L of the noisy objective, ``max_learning_rate``) when it is None."""
        if self.learning_rate is not None:
            return self.learning_rate
        return min(smooth_step_size(stats, self.ridge), self.max_learning_rate)

    def _objective_reply(
        self, msg: Message, stats: QuadraticStatistics, head: np.ndarray, event: Optional[dp_event.DpEvent]
    ) -> Message:
        out = ArrayRecord(
            {
                LINEAR_KEY: Array(np.ascontiguousarray(stats.linear, dtype=np.float64)),
                QUADRATIC_KEY: Array(np.ascontiguousarray(stats.quadratic, dtype=np.float64)),
            }
        )
        return self._declared_reply(msg, out, stats, head, event)

    def _reply(
        self,
        msg: Message,
        record: ArrayRecord,
        weights: np.ndarray,
        stats: QuadraticStatistics,
        event: Optional[dp_event.DpEvent],
    ) -> Message:
        out = ArrayRecord(
            {key: (Array(weights) if key == self.weights_key else value) for key, value in record.items()}
        )
        return self._declared_reply(msg, out, stats, weights, event)

    def _declared_reply(
        self,
        msg: Message,
        out: ArrayRecord,
        stats: QuadraticStatistics,
        weights: np.ndarray,
        event: Optional[dp_event.DpEvent],
    ) -> Message:
        weight = float(stats.count)  # public under replace-one (the only relation accepted)
        loss = taylor_objective(stats, weights) / max(stats.count, 1)
        content = RecordDict({"arrays": out, "metrics": MetricRecord({"num-examples": weight, "train-loss": loss})})
        declare_release(
            content,
            event if event is not None else dp_event.NoOpDpEvent(),
            label=EVENT_LABEL if event is not None else EVENT_LABEL + " (reused)",
            neighboring_relation=self.neighboring_relation,
            unit="record",
        )
        return Message(content, reply_to=msg)


def _store(context: Context, stats: QuadraticStatistics, is_repaired: bool) -> None:
    context.state[STATE_KEY] = ArrayRecord({"linear": Array(stats.linear), "quadratic": Array(stats.quadratic)})
    context.state[STATE_KEY + "-meta"] = ConfigRecord(
        {"count": stats.count, "loss": stats.loss, "num-classes": stats.num_classes, "repaired": is_repaired}
    )


def _load(context: Context) -> Optional[tuple[QuadraticStatistics, bool]]:
    """The stored statistics and whether they were repaired (older states: repaired)."""
    if STATE_KEY not in context.state.array_records:
        return None
    arrays = context.state.array_records[STATE_KEY]
    meta = context.state.config_records[STATE_KEY + "-meta"]
    stats = QuadraticStatistics(
        arrays["linear"].numpy(),
        arrays["quadratic"].numpy(),
        int(meta["count"]),
        str(meta["loss"]),
        int(meta["num-classes"]),
    )
    return stats, bool(meta.get("repaired", True))


__all__ = ["EVENT_LABEL", "STATE_KEY", "UPLOADS", "FunctionalMechanismTrainer"]
