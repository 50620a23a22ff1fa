r"""ε-LDP Laplace protection of inference results (MindSpore Federated's ``privacy_eval_type: LAPLACE``).

Needs two things from the app: the evaluate function returns its inference result as an
ArrayRecord ``"inference"`` in the reply (what the mod noises, what the server's
:class:`flwr_dp_strategies.ClusterEvaluation` scores), and an ε, either the mod's own
``epsilon`` or the server's (``epsilon=None``: the ServerApp's strategy is wrapped in
``ClusterEvaluation``, which sends ``privacy-eval-type`` and ``laplace-eval-eps``). Without
them every evaluate reply fails with one error naming what to add; nothing leaves un-noised.

What a client releases. After evaluation the ClientApp returns, in its reply, an
ArrayRecord (key ``"inference"`` by default) holding its inference result: one or
more probability vectors :math:`x \in \Delta^{k-1} = \{x \ge 0, \sum_c x_c = 1\}`,
e.g. the mean softmax output over its evaluation samples (as MindSpore's
``DirectClassifierResult``). :class:`LaplaceInferenceMod` replaces each vector by

.. math::  \tilde x = x + (L_1, \dots, L_k), \qquad L_c \overset{iid}{\sim} \mathrm{Lap}(b),\ b = \Delta_1/\varepsilon .

Sensitivity (local DP, the whole vector is the client's input). For any two
probability vectors :math:`\lVert x - y\rVert_1 \le \lVert x\rVert_1 + \lVert y\rVert_1 = 2`,
with equality for disjoint supports, e.g. :math:`e_1` and :math:`e_2`. So
:math:`\Delta_1 = 2` (the default) and the release is ε-LDP (Dwork & Roth 2014,
Thm 3.6): for every output z, :math:`p(z|x)/p(z|y) \le e^{\varepsilon\lVert x-y\rVert_1/\Delta_1} \le e^\varepsilon`.

MindSpore Federated's documentation of this mechanism states :math:`\lVert X - Y\rVert_1 \le 1`
for two vectors summing to 1;
that is false (the bound is 2), so MindSpore's scale :math:`b = 1/\varepsilon` gives
:math:`2\varepsilon`-LDP, not ε. ``seed_calibration=True`` reproduces MindSpore's noise
(:math:`b = 1/\varepsilon_\text{configured}`) and the ledger then records the ε the
release really has, :math:`2\varepsilon_\text{configured}`. ``m`` vectors in one reply
are ``m`` Laplace releases composed (``SelfComposedDpEvent``).

Declared relation (:attr:`LaplaceInferenceMod.neighboring_relation`): ``"replace_one"``
when Δ₁ ≥ 2 (any two vectors, LDP); ``"add_or_remove_one"`` when 1 ≤ Δ₁ < 2 (MindSpore's
Δ₁ = 1 bounds a vector against the absent, all-zero one: ‖x‖₁ = 1), which a replace-one
ledger converts soundly (doubling Δ₁). Δ₁ < 1 bounds no relation and is refused.

Domain check. The bound 2 holds only on the simplex, so the mod refuses (raises,
and Flower sends an error reply: nothing leaves the client) any vector with a
negative entry below ``-tolerance`` or a sum off 1 by more than ``tolerance``;
within the tolerance the vector is projected (clipped at 0, renormalised) before
the noise. Unlike MindSpore, which uploads the *un-noised* data whenever its eval map
does not hold exactly one entry, the mod never lets an expected inference result
leave without noise: a missing or malformed record is an error, not a pass-through.

Server-driven ε (MindSpore's ``laplace_eval_eps``). With ``epsilon=None`` the mod
uses the ``laplace-eval-eps`` the server put in the evaluate config when
``privacy-eval-type`` is ``LAPLACE``; with ``NOT_ENCRYPT`` it sends the result
unprotected and declares nothing (that is not DP). A client-set ``epsilon`` always
applies; if the server asks for a smaller ε the smaller one is used.

Randomness: OS entropy by default (``rng=None``); ``secure=True`` uses the
grid-snapped discrete Laplace of :func:`flwr_dp_strategies.privacy.laplace_mechanism`.
"""

from __future__ import annotations

import math
from logging import WARNING
from typing import Optional

import numpy as np
from dp_accounting import dp_event
from flwr.app import Array, ArrayRecord, Context, Message
from flwr.clientapp.typing import ClientAppCallable
from flwr.common.logger import log

from client_mods.reply_metrics import settle_metrics
from flwr_dp_strategies.declarations import declare_release
from flwr_dp_strategies.privacy import laplace_mechanism
from flwr_dp_strategies.privacy.rng import RngLike, RngSource
from flwr_dp_strategies.privacy.validation import check_epsilon, check_positive, check_sensitivity
from flwr_dp_strategies.wire import CONFIG_LAPLACE_EVAL_EPS, CONFIG_PRIVACY_EVAL_TYPE

PROBABILITY_SIMPLEX_L1_DIAMETER = 2.0
SEED_SENSITIVITY = 1.0
EVENT_LABEL = "local-laplace/inference-results"


def laplace_eval_epsilon(noise_bound: float = 1e-5, probability: float = 0.9, *, sensitivity: float = 1.0) -> float:
    r"""The ε at which Laplace(Δ₁/ε) noise satisfies :math:`P(|L| < t) = p`.

    :math:`P(|L| < t) = 1 - e^{-t/b}`, so :math:`b = t/\ln(1/(1-p))` and
    :math:`\varepsilon = \Delta_1 \ln(1/(1-p))/t`. With MindSpore's ``sensitivity=1``
    and its t = 1e-5, p = 0.9: ε = ln(10)/1e-5 ≈ 230 258.5 (MindSpore rounds to
    230 260). The same noise on probability vectors is 2ε-LDP (see the module
    docstring): pass ``sensitivity=2`` for the ε to give :class:`LaplaceInferenceMod`.
    """
    t = check_positive("noise_bound", noise_bound)
    if not 0.0 < probability < 1.0:
        raise ValueError(f"probability must be in (0, 1), got {probability}")
    return check_sensitivity(sensitivity) * math.log(1.0 / (1.0 - probability)) / t


class LaplaceInferenceMod:
    """Flower mod: Laplace noise on the inference results of evaluate replies (ε-LDP per vector).

    Needs: an ArrayRecord ``key`` (default ``"inference"``) in the evaluate reply, and ``epsilon``
    or a server strategy wrapped in :class:`flwr_dp_strategies.ClusterEvaluation` (see the
    module docstring).

    Args:
        epsilon: the true LDP ε of one vector's release, in (0, inf); None: use the
            server's ``laplace-eval-eps`` (see module docstring).
        sensitivity: Δ₁ in [1, inf), default 2, the L1 diameter of the simplex; below 2 the
            release is declared under ``"add_or_remove_one"`` (see the module docstring).
        seed_calibration: MindSpore's noise b = 1/ε; the ledger records 2ε.
        key: the reply ArrayRecord holding the inference results.
        tolerance: accepted deviation from the simplex before projection.
        rng: None (OS entropy), a seed or a numpy Generator.
        secure: floating-point-safe discrete Laplace sampler.
        release_metrics: send the evaluate metrics (accuracy, the exact ``num-examples``) as they
            are and declare them non-private (ε = ∞); default False: replaced by the public weight
            ``{weighted_by_key: 1.0}`` (:mod:`client_mods.reply_metrics`).
        weighted_by_key: the weight key the server's FedAvg reads.
    """

    def __init__(
        self,
        epsilon: Optional[float] = None,
        sensitivity: float = PROBABILITY_SIMPLEX_L1_DIAMETER,
        *,
        seed_calibration: bool = False,
        key: str = "inference",
        tolerance: float = 1e-4,
        rng: RngLike = None,
        secure: bool = False,
        release_metrics: bool = False,
        weighted_by_key: str = "num-examples",
    ) -> None:
        self.release_metrics = bool(release_metrics)
        self.weighted_by_key = str(weighted_by_key)
        self.epsilon = None if epsilon is None else check_epsilon(epsilon)
        self.sensitivity = check_sensitivity(sensitivity)
        if self.sensitivity < SEED_SENSITIVITY:
            raise ValueError(
                f"sensitivity must be in [1, inf): a probability vector is at L1 distance 1 from the "
                f"zero vector, got {sensitivity!r}"
            )
        self.neighboring_relation = (
            "replace_one" if self.sensitivity >= PROBABILITY_SIMPLEX_L1_DIAMETER else "add_or_remove_one"
        )
        self.seed_calibration = bool(seed_calibration)
        self.key = key
        self.tolerance = check_positive("tolerance", tolerance)
        self.rng = RngSource(rng)
        self.secure = bool(secure)

    def __call__(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        if msg.metadata.message_type.split(".")[0] != "evaluate":
            return call_next(msg, context)
        epsilon = self._epsilon_for(msg)
        reply = call_next(msg, context)
        if epsilon is None or reply.has_error():
            return reply
        record = reply.content.array_records.get(self.key)
        if record is None:
            raise ValueError(
                f"LaplaceInferenceMod noises the inference result the evaluate function returns, but this reply has "
                f"no ArrayRecord {self.key!r} (its records: {sorted(reply.content.keys())}). Return it in the reply, "
                f"e.g. RecordDict({{'metrics': MetricRecord(...), {self.key!r}: ArrayRecord({{'probabilities': "
                "Array(mean_softmax)}})}) (what ClusterEvaluation scores), or remove the mod. Nothing was sent."
            )
        noisy, event = self.protect(record, epsilon)
        reply.content[self.key] = noisy
        declare_release(reply.content, event, label=EVENT_LABEL, neighboring_relation=self.neighboring_relation)
        settle_metrics(reply.content, release_metrics=self.release_metrics, weighted_by_key=self.weighted_by_key)
        return reply

    def _epsilon_for(self, msg: Message) -> Optional[float]:
        """The ε to apply: the client's, the server's LAPLACE ε, or the smaller of the two."""
        config = next(iter(msg.content.config_records.values()), {})
        mode = str(config.get(CONFIG_PRIVACY_EVAL_TYPE, "")).upper()
        server_eps = config.get(CONFIG_LAPLACE_EVAL_EPS) if mode == "LAPLACE" else None
        if server_eps is not None:
            server_eps = check_epsilon(float(server_eps), CONFIG_LAPLACE_EVAL_EPS)
        if self.epsilon is None:
            if mode not in ("LAPLACE", "NOT_ENCRYPT"):
                raise ValueError(
                    "LaplaceInferenceMod(epsilon=None) takes its epsilon from the server, but this evaluate message "
                    f"carries no {CONFIG_PRIVACY_EVAL_TYPE!r} (LAPLACE with {CONFIG_LAPLACE_EVAL_EPS!r}, or "
                    "NOT_ENCRYPT): wrap the ServerApp's strategy in flwr_dp_strategies.ClusterEvaluation, which sends "
                    "them, or give the mod its own epsilon: LaplaceInferenceMod(epsilon=...). Nothing was sent."
                )
            return server_eps
        return self.epsilon if server_eps is None else min(self.epsilon, server_eps)

    def protect(self, record: ArrayRecord, epsilon: float) -> tuple[ArrayRecord, dp_event.DpEvent]:
        """Noisy copy of ``record`` (same keys and shapes) and the event of its release."""
        noisy: dict[str, np.ndarray] = {}
        events: list[dp_event.DpEvent] = []
        for name, array in record.items():
            vectors = self._on_simplex(name, array.numpy())
            release = self._noise(vectors, epsilon)
            original = array.numpy()
            dtype = original.dtype if original.dtype.kind == "f" else np.float64
            noisy[name] = release.value.reshape(original.shape).astype(dtype)
            events.append(dp_event.SelfComposedDpEvent(release.event, vectors.shape[0]))
        event = events[0] if len(events) == 1 else dp_event.ComposedDpEvent(events)
        return ArrayRecord({name: Array(value) for name, value in noisy.items()}), event

    def _noise(self, vectors: np.ndarray, epsilon: float):
        """Per-vector ε-LDP release; ``seed_calibration`` adds MindSpore's b = 1/ε and declares the true
        ε·Δ₁ (2ε on the simplex)."""
        if self.seed_calibration:
            true_epsilon = epsilon * self.sensitivity / SEED_SENSITIVITY
            if true_epsilon != epsilon:
                log(
                    WARNING,
                    "seed_calibration: noise b = 1/%g as MindSpore; the release is %g-LDP on vectors of L1 diameter %g",
                    epsilon,
                    true_epsilon,
                    self.sensitivity,
                )
            epsilon = true_epsilon
        return laplace_mechanism(
            vectors,
            epsilon=epsilon,
            sensitivity=self.sensitivity,
            rng=self.rng(),
            secure=self.secure,
            value_bound=1.0 if self.secure else None,
        )

    def _on_simplex(self, name: str, values: np.ndarray) -> np.ndarray:
        """Rows of ``values`` as probability vectors (tiny deviations projected); raises otherwise."""
        x = np.asarray(values, dtype=np.float64)
        if x.ndim not in (1, 2) or x.shape[-1] < 2 or not np.isfinite(x).all():
            raise ValueError(
                f"inference result {name!r} must be finite probability vectors "
                f"(shape (k,) or (m, k), k >= 2), got shape {x.shape}"
            )
        x = x.reshape(-1, x.shape[-1])
        if x.min() < -self.tolerance or np.abs(x.sum(axis=1) - 1.0).max() > self.tolerance:
            raise ValueError(
                f"inference result {name!r} is not a probability vector (entries >= 0 summing "
                f"to 1 within {self.tolerance}); its L1 sensitivity would not be bounded"
            )
        x = np.clip(x, 0.0, None)
        return x / x.sum(axis=1, keepdims=True)


__all__ = ["LaplaceInferenceMod", "laplace_eval_epsilon"]
