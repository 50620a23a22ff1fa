"""One validator for every DpEvent that can reach a ledger.

A ledger can only report a true ε for an event whose parameters lie in the
domain its accountants were derived for. dp-accounting itself does not check
that: ``GaussianDpEvent(nan)`` or ``LaplaceDpEvent(nan)`` compose to ε = 0,
``DiscreteLaplaceDpEvent(-1, 1)`` makes an RDP curve negative (and with it the
ε of every client that shares a central event), ``PoissonSampledDpEvent(0.5,
event=5)`` is accepted until a query touches it. :func:`validate_event` closes
that door once: :class:`~flwr_dp_strategies.privacy.accounting.ledger.PrivacyLedger` calls
it on ``record``, ``record_clients``, ``check_accountable`` and ``load``, and the
declarations read from client replies pass through the same ledger calls, so
no path books an event it has not validated.

Domains (the field named in the error is ``<path>.<field>``, e.g.
``events[2].event.noise_multiplier``):

=================================== =============================================
event                               parameters
=================================== =============================================
``NoOpDpEvent``, ``NonPrivateDpEvent`` none
``GaussianDpEvent``                 noise_multiplier ∈ (0, ∞) (no noise: declare ``NonPrivateDpEvent``)
``LaplaceDpEvent``                  noise_multiplier ∈ (0, ∞) (no noise: declare ``NonPrivateDpEvent``)
``DiscreteLaplaceDpEvent``          noise_parameter ∈ (0, ∞), sensitivity integer ≥ 1
``RandomizedResponseDpEvent``       noise_parameter ∈ [0, 1], num_buckets integer ≥ 2
``ZCDpEvent``                       rho ∈ [0, ∞), xi ∈ [0, ∞)
``SelfComposedDpEvent``             event valid, count integer ≥ 1
``ComposedDpEvent``                 events a list of valid events
``PoissonSampledDpEvent``           sampling_probability ∈ [0, 1], event valid
``SampledWithoutReplacementDpEvent`` source_dataset_size integer ≥ 1,
                                    sample_size integer in [0, source_dataset_size], event valid
``SampledWithReplacementDpEvent``   source_dataset_size integer ≥ 1, sample_size integer ≥ 0, event valid
``ExponentialMechanismDpEvent``,    epsilon ∈ (0, ∞)
``PureDpEvent``
``ApproxDpEvent``                   epsilon ∈ (0, ∞), delta ∈ (0, 1)
``SkellamDpEvent``                  l1_sensitivity, l2_sensitivity ∈ (0, ∞), mu ∈ (0, 1e18];
                                    never inside a sampled event (no amplification
                                    bound is derived for it)
=================================== =============================================

Every real parameter must be a finite ``int``/``float`` (``bool`` is refused,
NumPy scalars are accepted); every integer parameter a true integer (``5.0`` is
refused: a count read from JSON as a float is malformed). Event trees deeper
than :data:`MAX_DEPTH` or with more than :data:`MAX_NODES` events are refused, so
validation (and every later accountant pass) is bounded. Any other class,
including dp-accounting events this package's accountants do not know, is
refused: an event the ledger cannot bound is never booked.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

from dp_accounting import dp_event

from . import events as _events  # noqa: F401  (registers this package's custom events)
from .custom_events import CustomDpEvent

MAX_DEPTH = 32
MAX_NODES = 4096


def validate_event(event: Any) -> dp_event.DpEvent:
    """Return ``event`` if it is a DpEvent tree the ledger can bound, else raise ``ValueError``.

    The error names the offending field by its path in the tree and states its domain.
    """
    budget = [MAX_NODES]
    _validate(event, "event", 0, budget)
    return event


def _validate(event: Any, path: str, depth: int, budget: list[int]) -> None:
    if depth > MAX_DEPTH:
        raise ValueError(f"{path}: event tree deeper than {MAX_DEPTH} levels")
    budget[0] -= 1
    if budget[0] < 0:
        raise ValueError(f"{path}: event tree has more than {MAX_NODES} events")
    if not isinstance(event, dp_event.DpEvent):
        raise ValueError(f"{path} must be a dp_accounting DpEvent, got {type(event).__name__}")
    check = _custom if isinstance(event, CustomDpEvent) else _CHECKS.get(type(event))
    if check is None:
        raise ValueError(f"{path}: event type {type(event).__name__} cannot be bounded by the ledger")
    check(event, path, depth, budget)


def _real(
    event: Any, field: str, path: str, *, low: float, low_open: bool, high: float = math.inf, high_open: bool = True
) -> float:
    value = getattr(event, field)
    name = f"{path}.{field}"
    domain = (
        ("(" if low_open else "[")
        + f"{low:g}, "
        + ("inf" if math.isinf(high) else f"{high:g}")
        + (")" if high_open else "]")
    )
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a real number in {domain}, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number in {domain}, got {value!r}")
    too_low = number <= low if low_open else number < low
    too_high = number >= high if high_open else number > high
    if too_low or too_high:
        raise ValueError(f"{name} must be in {domain}, got {value!r}")
    return number


def _integer(event: Any, field: str, path: str, *, low: int, high: float = math.inf) -> int:
    value = getattr(event, field)
    name = f"{path}.{field}"
    domain = f"[{low}, {'inf' if math.isinf(high) else int(high)}]"
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ValueError(f"{name} must be an integer in {domain}, got {value!r}")
    if not low <= int(value) <= high:
        raise ValueError(f"{name} must be an integer in {domain}, got {value!r}")
    return int(value)


def _none(event: Any, path: str, depth: int, budget: list[int]) -> None:
    return None


def _gaussian(event: Any, path: str, depth: int, budget: list[int]) -> None:
    _real(event, "noise_multiplier", path, low=0.0, low_open=True)


def _discrete_laplace(event: Any, path: str, depth: int, budget: list[int]) -> None:
    _real(event, "noise_parameter", path, low=0.0, low_open=True)
    _integer(event, "sensitivity", path, low=1)


def _randomized_response(event: Any, path: str, depth: int, budget: list[int]) -> None:
    _real(event, "noise_parameter", path, low=0.0, low_open=False, high=1.0, high_open=False)
    _integer(event, "num_buckets", path, low=2)


def _zcdp(event: Any, path: str, depth: int, budget: list[int]) -> None:
    _real(event, "rho", path, low=0.0, low_open=False)
    _real(event, "xi", path, low=0.0, low_open=False)


def _self_composed(event: Any, path: str, depth: int, budget: list[int]) -> None:
    _integer(event, "count", path, low=1)
    _validate(event.event, f"{path}.event", depth + 1, budget)


def _composed(event: Any, path: str, depth: int, budget: list[int]) -> None:
    events = event.events
    if not isinstance(events, (list, tuple)):
        raise ValueError(f"{path}.events must be a list of DpEvents, got {type(events).__name__}")
    for index, inner in enumerate(events):
        _validate(inner, f"{path}.events[{index}]", depth + 1, budget)


def _poisson(event: Any, path: str, depth: int, budget: list[int]) -> None:
    _refuse_sampled_skellam(event, path)
    _real(event, "sampling_probability", path, low=0.0, low_open=False, high=1.0, high_open=False)
    _validate(event.event, f"{path}.event", depth + 1, budget)


def _without_replacement(event: Any, path: str, depth: int, budget: list[int]) -> None:
    _refuse_sampled_skellam(event, path)
    size = _integer(event, "source_dataset_size", path, low=1)
    _integer(event, "sample_size", path, low=0, high=size)
    _validate(event.event, f"{path}.event", depth + 1, budget)


def _with_replacement(event: Any, path: str, depth: int, budget: list[int]) -> None:
    _refuse_sampled_skellam(event, path)
    _integer(event, "source_dataset_size", path, low=1)
    _integer(event, "sample_size", path, low=0)
    _validate(event.event, f"{path}.event", depth + 1, budget)


def _custom(event: Any, path: str, depth: int, budget: list[int]) -> None:
    """A :class:`~.custom_events.CustomDpEvent`: each field in the domain its class states (``FIELDS``)."""
    for field, domain in type(event).FIELDS.items():
        _real(event, field, path, **domain)


def _refuse_sampled_skellam(event: Any, path: str) -> None:
    """A sampled event must not contain a custom event that is not ``AMPLIFIABLE`` (Skellam: dp-accounting
    amplifies only Gaussians and no amplification bound for Skellam is implemented here; book the un-sampled
    event)."""
    stack, seen = [(event.event, f"{path}.event")], 0
    while stack and seen < MAX_NODES:
        inner, where = stack.pop()
        seen += 1
        if isinstance(inner, CustomDpEvent) and not inner.AMPLIFIABLE:
            name = type(inner).__name__
            raise ValueError(
                f"{where}: {name} inside {type(event).__name__} is refused: no privacy "
                f"amplification by sampling is derived for it; book the "
                f"{name} itself (unamplified)"
            )
        if isinstance(inner, dp_event.SelfComposedDpEvent):
            stack.append((inner.event, f"{where}.event"))
        elif isinstance(inner, dp_event.ComposedDpEvent) and isinstance(inner.events, (list, tuple)):
            stack.extend((e, f"{where}.events[{i}]") for i, e in enumerate(inner.events))
        elif isinstance(
            inner,
            (
                dp_event.PoissonSampledDpEvent,
                dp_event.SampledWithoutReplacementDpEvent,
                dp_event.SampledWithReplacementDpEvent,
            ),
        ):
            stack.append((inner.event, f"{where}.event"))


_CHECKS = {
    dp_event.NoOpDpEvent: _none,
    dp_event.NonPrivateDpEvent: _none,
    dp_event.GaussianDpEvent: _gaussian,
    dp_event.LaplaceDpEvent: _gaussian,
    dp_event.DiscreteLaplaceDpEvent: _discrete_laplace,
    dp_event.RandomizedResponseDpEvent: _randomized_response,
    dp_event.ZCDpEvent: _zcdp,
    dp_event.SelfComposedDpEvent: _self_composed,
    dp_event.ComposedDpEvent: _composed,
    dp_event.PoissonSampledDpEvent: _poisson,
    dp_event.SampledWithoutReplacementDpEvent: _without_replacement,
    dp_event.SampledWithReplacementDpEvent: _with_replacement,
}

__all__ = ["MAX_DEPTH", "MAX_NODES", "validate_event"]
