r"""Local DP on model updates: clip, add calibrated Gaussian noise, declare the release (LDP-FL).

For every train reply, with :math:`w` the weights received and :math:`w'` the
weights trained, the mod releases

.. math::  \tilde w = w + \bar\Delta + \mathcal N(0, \sigma^2 I), \qquad
           \bar\Delta = \Delta\,\min(1, C/\lVert\Delta\rVert_2),\ \Delta = w' - w,

over all arrays of the reply's single ArrayRecord flattened together (one L2 norm).

Sensitivity and relation. The client's whole data set is its input (local DP:
any two inputs are neighbours). Two clipped updates differ by at most
:math:`\lVert\bar\Delta - \bar\Delta'\rVert_2 \le 2C`, so :math:`\Delta_2 = 2C`
(the default ``sensitivity``). MindSpore's DP_ENCRYPT and Flower's ``LocalDpMod``
examples use C; that bound holds only against the all-zero update (a
"zero-out" relation), so it is available as ``sensitivity=clipping_norm`` and
then the declared ε is for that relation, not for LDP.

Declared relation (:attr:`LocalUpdateNoiseMod.neighboring_relation`): ``"replace_one"``
when Δ₂ ≥ 2C (any two inputs are covered); ``"add_or_remove_one"`` when C ≤ Δ₂ < 2C
(covers a clipped update against the absent, all-zero one: ‖Δ̄ − 0‖₂ ≤ C), which a
replace-one ledger converts soundly (doubling Δ₂). Δ₂ < C bounds no relation and is
refused.

Calibration. Either a noise multiplier :math:`z` (:math:`\sigma = z\Delta_2`), or a
per-round :math:`(\varepsilon, \delta)` calibrated with the *analytic* Gaussian
mechanism (Balle & Wang 2018), exact for every ε. Flower's ``LocalDpMod`` uses
the classical :math:`\sigma = \Delta\sqrt{2\ln(1.25/\delta)}/\varepsilon`, which is a
valid bound only for ε < 1 (Dwork & Roth 2014, Thm A.1); above 1 it can
under-noise, so it is not reused here.

Accounting. Each round's release is ``GaussianDpEvent(σ/Δ₂)``, declared in the
reply (:func:`flwr_dp_strategies.declare_release`). The server's
:class:`~flwr_dp_strategies.strategy.AccountedFedAvg` composes a client's
rounds in RDP/PLD (adaptive composition), far tighter than ε·T.
Metrics: the reply's train metrics and exact ``num-examples`` are replaced by a
public weight unless ``release_metrics=True``, which declares them non-private
(:mod:`client_mods.reply_metrics`). Attach it to train only (``@app.train(mods=[LocalUpdateNoiseMod(...)])``);
it also passes non-train messages through untouched.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from flwr.app import ArrayRecord, Context, Message
from flwr.clientapp.typing import ClientAppCallable

from client_mods.reply_metrics import settle_metrics
from flwr_dp_strategies.declarations import declare_release
from flwr_dp_strategies.privacy import gaussian_mechanism, gaussian_sigma
from flwr_dp_strategies.privacy.mechanisms.release import Release
from flwr_dp_strategies.privacy.rng import RngLike, RngSource
from flwr_dp_strategies.privacy.validation import check_positive, check_sensitivity
from flwr_dp_strategies.npy_codec import npy_view, to_array
from flwr_dp_strategies.wire import flat_update

EVENT_LABEL = "local-gaussian/update"


def clip_l2(update: np.ndarray, clipping_norm: float) -> tuple[np.ndarray, float]:
    """(Δ·min(1, C/‖Δ‖₂), ‖Δ‖₂), in place on ``update``."""
    norm = float(np.linalg.norm(update))
    if norm > clipping_norm:
        update *= clipping_norm / norm
    return update, norm


class LocalUpdateNoiseMod:
    """Flower mod: clip the update to L2 norm C and add Gaussian noise (local DP, declared per round).

    Args:
        clipping_norm: C in (0, inf).
        noise_multiplier: z in (0, inf); or give ``epsilon`` and ``delta`` instead.
        epsilon, delta: per-round (ε, δ) for the analytic Gaussian calibration.
        sensitivity: Δ₂ in [C, inf), default 2C (local DP, see module docstring); below 2C the
            release is declared under ``"add_or_remove_one"``.
        rng: None (OS entropy), a seed or a numpy Generator.
        release_metrics: send the reply's metrics (train loss, the exact ``num-examples``) as they
            are and declare them non-private (ε = ∞); default False: they are replaced by the
            public weight ``{weighted_by_key: 1.0}`` (:mod:`client_mods.reply_metrics`).
        weighted_by_key: the weight key the server's FedAvg reads.
        secure: floating-point-safe discrete Gaussian noise on a grid (CKS 2020); the clipped
            update's coordinates are bounded by C, the public bound it needs. The declared event
            is then ``ZCDpEvent`` (grid rounding included).
    """

    def __init__(
        self,
        clipping_norm: float,
        noise_multiplier: Optional[float] = None,
        *,
        epsilon: Optional[float] = None,
        delta: Optional[float] = None,
        sensitivity: Optional[float] = None,
        rng: RngLike = None,
        release_metrics: bool = False,
        weighted_by_key: str = "num-examples",
        secure: bool = False,
    ) -> None:
        self.secure = bool(secure)
        self.release_metrics = bool(release_metrics)
        self.weighted_by_key = str(weighted_by_key)
        self.clipping_norm = check_positive("clipping_norm", clipping_norm)
        self.sensitivity = 2.0 * self.clipping_norm if sensitivity is None else check_sensitivity(sensitivity)
        if self.sensitivity < self.clipping_norm:
            raise ValueError(
                f"sensitivity must be in [clipping_norm, inf) = [{self.clipping_norm}, inf): a clipped "
                f"update is {self.clipping_norm} from the zero update, got {sensitivity!r}"
            )
        self.neighboring_relation = (
            "replace_one" if self.sensitivity >= 2.0 * self.clipping_norm else "add_or_remove_one"
        )
        if (noise_multiplier is None) == (epsilon is None):
            raise ValueError("give exactly one of noise_multiplier (in (0, inf)) or epsilon (with delta)")
        if epsilon is not None:
            if delta is None:
                raise ValueError("delta in (0, 1) is required with epsilon")
            noise_multiplier = gaussian_sigma(epsilon, delta, self.sensitivity) / self.sensitivity
        self.noise_multiplier = check_positive("noise_multiplier", noise_multiplier)
        self.rng = RngSource(rng)

    @property
    def sigma(self) -> float:
        """Noise std σ = z·Δ₂ per coordinate."""
        return self.noise_multiplier * self.sensitivity

    def privatize(self, received: list[np.ndarray], trained: list[np.ndarray]) -> Release[list[np.ndarray]]:
        """Clip the concatenated update, add noise, and return the noisy weights (same shapes)."""
        update = flat_update(received, trained)
        clipped, _ = clip_l2(update, self.clipping_norm)
        release = gaussian_mechanism(
            clipped,
            noise_multiplier=self.noise_multiplier,
            sensitivity=self.sensitivity,
            rng=self.rng(),
            secure=self.secure,
            value_bound=self.clipping_norm,
        )
        out, start = [], 0
        for r in received:
            out.append((r + release.value[start : start + r.size].reshape(r.shape)).astype(r.dtype))
            start += r.size
        return Release(out, release.event)

    def __call__(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        if msg.metadata.message_type.split(".")[0] != "train":
            return call_next(msg, context)
        if len(msg.content.array_records) != 1:
            raise ValueError("LocalUpdateNoiseMod expects exactly one ArrayRecord in the train message")
        sent = next(iter(msg.content.array_records.values()))
        # zero-copy read-only views of the received payloads (immutable bytes: the app cannot change them)
        keys, received = list(sent.keys()), [npy_view(sent[k]) for k in sent.keys()]
        reply = call_next(msg, context)
        if reply.has_error():
            return reply
        if len(reply.content.array_records) != 1:
            raise ValueError("LocalUpdateNoiseMod expects exactly one ArrayRecord in the reply")
        name, trained = next(iter(reply.content.array_records.items()))
        if list(trained.keys()) != keys:
            raise ValueError("the reply's ArrayRecord must have the keys of the received one")
        release = self.privatize(received, [npy_view(trained[k]) for k in keys])
        reply.content[name] = ArrayRecord({k: to_array(v) for k, v in zip(keys, release.value)})
        declare_release(reply.content, release.event, label=EVENT_LABEL, neighboring_relation=self.neighboring_relation)
        settle_metrics(reply.content, release_metrics=self.release_metrics, weighted_by_key=self.weighted_by_key)
        return reply


__all__ = ["LocalUpdateNoiseMod", "clip_l2"]
