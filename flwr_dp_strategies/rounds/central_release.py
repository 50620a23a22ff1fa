r"""The release both central-DP strategies make: a clipped sum over a public denominator, plus noise.

.. math:: \tilde w = w + \frac1m \sum_{i \in S} \bar\Delta_i + \mathcal N\!\big(0, \sigma^2 I\big),
          \qquad \bar\Delta_i = \Delta_i \min(1, C/\lVert\Delta_i\rVert_2), \qquad \sigma = zC/m .

``m`` is public and fixed before the round (the configured number of clients),
never the number of replies nor a sum of client-reported weights: adding or
removing one client's whole data changes the sum by one clipped update, at most
C in L2, so the L2 sensitivity is exactly C/m and the noise multiplier is z
whatever arrives (McMahan et al. 2018, the fixed-denominator estimator). A
data-dependent denominator (FedAvg's Σn over the replies) moves every other
client's weight too, and client-reported weights make even that bound
data-dependent, so neither is used.

Noise comes from a :class:`numpy.random.Generator` seeded from OS entropy (or a
seed / Generator passed for tests), drawn in float64 chunks and added in place
(:func:`~.streaming_aggregation.add_gaussian_noise`); never from NumPy's global
generator. Floating-point attacks on the sampler are out of scope.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from logging import WARNING
from typing import Optional

import numpy as np
from dp_accounting import dp_event
import logging
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAdagrad, FedAdam, FedAvg, FedAvgM, FedYogi, Strategy

from ..privacy import PrivacyLedger
from ..privacy.mechanisms.discrete_gaussian import gaussian_grid, secure_gaussian_mechanism
from .streaming_aggregation import ClippedSum, add_gaussian_noise, to_array

#: Label of the clients' (un-noised) train metrics when a strategy is told to publish them anyway.
NON_PRIVATE_METRICS_LABEL = "client train metrics (published un-noised: non-private)"


def fixed_denominator_release(
    summed: ClippedSum,
    denominator: int,
    sigma: float,
    generator: np.random.Generator,
    secure_bound: float | None = None,
    correlated: np.ndarray | None = None,
) -> ArrayRecord:
    r""":math:`w + S/m + \mathcal N(0, \sigma^2 I)` per key, in each array's dtype (consumes ``summed``).

    With ``correlated`` (d values, the keys flattened in order): :math:`w + S/m + \sigma\,r` instead, r the
    caller's noise row (a banded factorisation's :math:`(C_b^{-1}Z)_t`); ``generator`` is then unused.

    With ``secure_bound`` B: :math:`S/m` is clamped to [−B, B], rounded to the grid of
    :func:`~flwr_dp_strategies.privacy.mechanisms.discrete_gaussian.gaussian_grid` and perturbed with
    discrete Gaussian noise (:func:`secure_release_event` is then the event to book).
    """
    out, start = {}, 0
    for key, total in summed.result().items():
        np.divide(total, denominator, out=total)
        if correlated is not None:
            flat = total.reshape(-1)
            flat += sigma * correlated[start : start + flat.size]
            start += flat.size
        elif secure_bound is None:
            if sigma:  # sigma = 0 (Flower's sampler adds the noise afterwards): no d draws scaled by 0
                add_gaussian_noise(total, sigma, generator)
        else:
            noisy = secure_gaussian_mechanism(
                total, noise_multiplier=1.0, sensitivity=sigma, value_bound=secure_bound, rng=generator
            ).value
            total[...] = noisy.reshape(total.shape)
        reference = summed.reference[key]
        np.add(total, reference, out=total, casting="same_kind")
        out[key] = to_array(total.astype(reference.dtype, copy=False))
    return ArrayRecord(out)


def secure_release_event(
    noise_multiplier: float, clipping_norm: float, denominator: int, dimension: int, secure_bound: float
) -> dp_event.ZCDpEvent:
    r"""The zCDP event of the secure release (CKS 2020, Thm 14): neighbours' S/m differ by at most
    Δ = C/m in L2 and rounding to the grid γ moves each of the D coordinates by at most γ/2, so their
    grid images differ by at most :math:`\Delta/\gamma + \sqrt D` steps and
    :math:`\rho = (\Delta/\gamma + \sqrt D)^2 \gamma^2 / (2\sigma^2)` (≈ 1/(2z²))."""
    sigma = noise_multiplier * clipping_norm / denominator
    sensitivity = clipping_norm / denominator
    gamma = gaussian_grid(sigma, secure_bound)
    steps = sensitivity / gamma + math.sqrt(dimension)
    return dp_event.ZCDpEvent(rho=(steps * gamma) ** 2 / (2.0 * sigma * sigma))


MEAN_BASED = {
    FedAvg.aggregate_train: "FedAvg",
    FedAvgM.aggregate_train: "FedAvgM",
    FedAdam.aggregate_train: "FedAdam",
    FedYogi.aggregate_train: "FedYogi",
    FedAdagrad.aggregate_train: "FedAdagrad",
}
"""The server updates that are a function of the mean update, by the ``aggregate_train`` that computes them
(FedProx and every subclass that keeps one of these inherit it)."""


def check_mean_based(strategy: object, owner: str) -> None:
    """ValueError unless ``strategy`` is a Flower FedAvg whose server update is a function of the mean update
    (:data:`MEAN_BASED`): the DP release is that mean, and only then is the optimizer's step post-processing of
    it. FedMedian, FedTrimmedAvg, Krum, MultiKrum, Bulyan (and any other ``aggregate_train``) read the
    individual updates, which the release does not contain."""
    if not isinstance(strategy, FedAvg):
        raise ValueError(f"strategy must be a FedAvg (or subclass), got {type(strategy).__name__}")
    if type(strategy).aggregate_train not in MEAN_BASED:
        raise ValueError(
            f"{owner} cannot wrap {type(strategy).__name__}: its aggregate_train is not a function of the mean "
            f"update (the DP release is the noised mean of the clipped updates, and only a server update "
            f"computed from that mean - {', '.join(sorted(set(MEAN_BASED.values())))}, FedProx - is "
            "post-processing of it)"
        )


def server_step(strategy: Strategy, server_round: int, released: ArrayRecord) -> ArrayRecord:
    r"""The wrapped strategy's server update applied to the DP release :math:`\tilde w = w + \tilde\Delta`
    (post-processing, nothing more to book): FedAvg's is :math:`\tilde w` itself; FedAvgM, FedAdam, FedYogi and
    FedAdagrad take :math:`\tilde\Delta = \tilde w - w` as their mean update (their ``current_arrays``, w,
    set by their own ``configure_train``) and return their step, as DP-FedAdam does (Reddi et al. 2021 with
    DP-FedAvg's release; Andrew et al. 2021). Flower's DP wrappers instead add noise after the optimizer's step
    with a scale calibrated for the mean, which bounds nothing about the step's sensitivity. The step is the
    strategy's own ``aggregate_train`` on one reply carrying :math:`\tilde w` (its reply log is silenced); the step is
    cast back to the release's dtypes."""
    if type(strategy).aggregate_train is FedAvg.aggregate_train:
        return released
    fedavg = strategy  # a FedAvg by check_mean_based
    content = RecordDict(
        {
            getattr(fedavg, "arrayrecord_key", "arrays"): released,
            "metrics": MetricRecord({fedavg.weighted_by_key: 1.0}),  # type: ignore[attr-defined]
        }
    )
    reply = Message(content, dst_node_id=0, message_type=MessageType.TRAIN)
    flower = logging.getLogger("flwr")
    level = flower.level
    flower.setLevel(logging.WARNING)
    try:
        stepped, _ = strategy.aggregate_train(server_round, [reply])
    finally:
        flower.setLevel(level)
    if stepped is None:
        raise RuntimeError(f"{type(strategy).__name__}.aggregate_train returned no arrays for the DP release")
    # Flower's optimizers compute in float64; the model keeps its own dtypes (the clients' replies are screened
    # against them, and a float32 model that came back float64 would have every reply refused next round)
    return ArrayRecord(
        {
            key: array if array.dtype == released[key].dtype else to_array(array.numpy().astype(released[key].dtype))
            for key, array in stepped.items()
        }
    )


def poisson_sample(nodes: Iterable[int], rate: float, generator: np.random.Generator) -> list[int]:
    """Poisson sampling: each node (in sorted order, one uniform draw each) is kept independently
    with probability ``rate``; the sample is never resampled or topped up."""
    ordered = sorted(nodes)
    keep = generator.random(len(ordered)) < rate
    return [node for node, kept in zip(ordered, keep) if kept]


def sampled_train_instructions(
    strategy: Strategy, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid, nodes: Iterable[int]
) -> Optional[list[Message]]:
    """The wrapped strategy's train instructions, sent to ``nodes`` (a sample drawn by the caller) instead of its own.

    ``strategy.configure_train(server_round, arrays, config, grid)`` is called as Flower's DP wrappers
    call it (it may wait for its ``min_available_nodes``), so what it puts in an instruction (a
    learning-rate schedule in the config, extra records, other arrays) reaches the nodes; only its
    choice of nodes is replaced. A node it addressed gets its own message; another node gets a copy
    of the instruction's content, type, ttl and group id when every message carries the same content.

    Returns None when the strategy configures no training (no message): the caller then trains no
    node and releases nothing. Raises ValueError when the messages differ in content and a node in
    ``nodes`` was not addressed (which content it should get is unknown): such a strategy must
    address every node (e.g. ``fraction_train=1.0``).
    """
    planned = list(strategy.configure_train(server_round, arrays, config, grid))
    if not planned:
        return None
    own = {message.metadata.dst_node_id: message for message in planned}
    template = planned[0]
    uniform = all(m.content is template.content or m.content == template.content for m in planned[1:])
    messages = []
    for node in nodes:
        if node in own:
            messages.append(own[node])
        elif uniform:
            meta = template.metadata
            messages.append(
                Message(
                    content=template.content,
                    message_type=meta.message_type,
                    dst_node_id=node,
                    ttl=meta.ttl,
                    group_id=meta.group_id,
                )
            )
        else:
            raise ValueError(
                f"{type(strategy).__name__}.configure_train sent different content to different nodes and did "
                f"not address node {node}, which the sampling picked: have it address every node (e.g. "
                "fraction_train=1.0) so that each sampled node gets its own instruction"
            )
    return messages


def log_budget_stop(server_round: int, ledger: PrivacyLedger) -> None:
    """Say (once, the caller remembers) that training stops before ``server_round`` would exceed the budget."""
    log(
        WARNING,
        "Privacy budget: round %d would exceed max_epsilon=%s; no further training.",
        server_round,
        ledger.max_epsilon,
    )


__all__ = [
    "MEAN_BASED",
    "check_mean_based",
    "server_step",
    "NON_PRIVATE_METRICS_LABEL",
    "fixed_denominator_release",
    "log_budget_stop",
    "poisson_sample",
    "sampled_train_instructions",
    "secure_release_event",
]


def require_configured(strategy: object) -> None:
    """Raise Flower's ``AggregationError`` when ``aggregate_train`` comes before ``configure_train``.

    The round's model (the reference every update is clipped against and screened by) and the
    sampling rate q = m/N are fixed by ``configure_train``, as ``Strategy.start`` calls it; without
    them nothing can be clipped or booked (Flower's FedAvgM raises the same error for its model).
    """
    from flwr.serverapp.exception import AggregationError

    if getattr(strategy, "_spec", None) is None:
        raise AggregationError(
            f"{type(strategy).__name__}.aggregate_train called before configure_train: the "
            "round's model and the sampling rate q = m/N are set there (Strategy.start calls "
            "configure_train first)"
        )
