r"""Neighbouring relations, and the sound conversion of an event between them.

A DpEvent's parameters are only meaningful together with the neighbouring
relation its sensitivity was computed for. This package's convention: an
event's noise multiplier is the noise scale divided by the sensitivity *under
the relation the event states* (for ``PoissonSampledDpEvent`` of a Gaussian
under ``replace_one``, dp-accounting's own convention: z relative to the bound
on one record's contribution, the replaced record shifting the output by up to
twice that bound). Every event that reaches a ledger travels with its relation
(``PrivacyLedger.record(..., neighboring_relation=...)``, client declarations);
the ledger converts it to its own relation with :func:`convert_event`, or
refuses it.

Add/remove → replace-one (always possible, never tighter than the truth).
Replacing record x by x' is removing x and then adding x', so for any query f
with add/remove sensitivity Δ the replace-one sensitivity is at most 2Δ
(triangle inequality through D \ {x}), and any ε-DP (add/remove) release is
2ε-DP under replacement (group privacy of size 2). Per event:

=========================================== ===========================================
declared under ``add_or_remove_one``        booked under ``replace_one``
=========================================== ===========================================
``GaussianDpEvent(z)``                      ``GaussianDpEvent(z/2)`` (sensitivity 2Δ)
``LaplaceDpEvent(b)``                       ``LaplaceDpEvent(b/2)``
``DiscreteLaplaceDpEvent(t, s)``            ``DiscreteLaplaceDpEvent(t, 2s)``
``PureDpEvent(ε)``, ``ExponentialMechanism(ε)`` ``2ε`` (group privacy; ε-bounded range → 2ε)
``ApproxDpEvent(ε, δ)``                     ``(2ε, (1 + e^ε)δ)`` (group privacy, Dwork & Roth
                                            2014 Thm 2.2 generalised, Vadhan 2017 Lemma 2.2);
                                            ``NonPrivateDpEvent`` if that δ ≥ 1
``ZCDpEvent(ρ, ξ=0)``                       ``ZCDpEvent(4ρ)`` (Bun & Steinke 2016, Prop. 1.9)
``PoissonSampledDpEvent(q, Gaussian(z))``   unchanged: dp-accounting's replace-one PLD of a
                                            sampled Gaussian already moves the output by 2z⁻¹
                                            (the replaced record's contribution, bound 1,
                                            against its replacement's)
``SelfComposed`` / ``Composed`` / other     converted inside
``PoissonSampled``
``NoOpDpEvent``, ``NonPrivateDpEvent``      unchanged
=========================================== ===========================================

Refused (``ValueError``): randomized response declared under add/remove (it is
only defined under replacement), ``ZCDpEvent`` with ξ > 0, the sampled-with/without-
replacement events (their amplification is only derived for one relation each).

``NoOpDpEvent`` and ``NonPrivateDpEvent`` (and compositions of only these) mean the
same under both relations and pass unchanged in either direction.

Replace-one → add/remove: refused otherwise. A replace-one sensitivity says nothing about
adding a record (a count has replace-one sensitivity 0 and add/remove
sensitivity 1), so no sound conversion exists; calibrate under add/remove.
"""

from __future__ import annotations


from dp_accounting import dp_event

from .custom_events import CustomDpEvent

ADD_OR_REMOVE_ONE = "add_or_remove_one"
REPLACE_ONE = "replace_one"
RELATIONS: tuple[str, ...] = (ADD_OR_REMOVE_ONE, REPLACE_ONE)


def check_relation(value: object, name: str = "neighboring_relation") -> str:
    """``value`` if it names a relation, else ``ValueError`` naming ``name`` and the domain."""
    if not isinstance(value, str) or value not in RELATIONS:
        raise ValueError(f"{name} must be one of {list(RELATIONS)}, got {value!r}")
    return value


def convert_event(event: dp_event.DpEvent, source: str, target: str) -> dp_event.DpEvent:
    """``event`` (calibrated under ``source``) as an event that is sound under ``target``.

    Raises ``ValueError`` where no sound conversion exists (see the module docstring).
    """
    check_relation(source, "source relation")
    check_relation(target, "target relation")
    if source == target or _relation_free(event):
        return event
    if source == REPLACE_ONE:
        raise ValueError(
            f"an event calibrated under 'replace_one' cannot be booked in an 'add_or_remove_one' ledger: "
            f"a replace-one sensitivity does not bound adding or removing a record ({type(event).__name__}); "
            f"calibrate it under add/remove or use a replace_one ledger"
        )
    return _add_remove_to_replace(event)


def _relation_free(event: dp_event.DpEvent) -> bool:
    """Whether ``event`` means the same under every relation (NoOp: nothing released; NonPrivate: ε = ∞)."""
    if isinstance(event, (dp_event.NoOpDpEvent, dp_event.NonPrivateDpEvent)):
        return True
    if isinstance(event, dp_event.ComposedDpEvent):
        return all(_relation_free(e) for e in event.events)
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return _relation_free(event.event)
    return False


def _add_remove_to_replace(event: dp_event.DpEvent) -> dp_event.DpEvent:
    if isinstance(event, (dp_event.NoOpDpEvent, dp_event.NonPrivateDpEvent)):
        return event
    if isinstance(event, dp_event.GaussianDpEvent):
        return dp_event.GaussianDpEvent(float(event.noise_multiplier) / 2.0)
    if isinstance(event, dp_event.LaplaceDpEvent):
        return dp_event.LaplaceDpEvent(float(event.noise_multiplier) / 2.0)
    if isinstance(event, dp_event.DiscreteLaplaceDpEvent):
        return dp_event.DiscreteLaplaceDpEvent(event.noise_parameter, 2 * int(event.sensitivity))
    if isinstance(event, CustomDpEvent):  # its own rule (PureDpEvent, EM: 2ε; ApproxDpEvent: group privacy)
        return event.replace_one()
    if isinstance(event, dp_event.ZCDpEvent):
        if event.xi != 0:
            raise ValueError("ZCDpEvent with xi > 0 has no group-privacy conversion to 'replace_one'")
        return dp_event.ZCDpEvent(4.0 * float(event.rho), 0.0)
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return dp_event.SelfComposedDpEvent(_add_remove_to_replace(event.event), event.count)
    if isinstance(event, dp_event.ComposedDpEvent):
        return dp_event.ComposedDpEvent([_add_remove_to_replace(e) for e in event.events])
    if isinstance(event, dp_event.PoissonSampledDpEvent):
        if isinstance(event.event, dp_event.GaussianDpEvent):
            return event
        return dp_event.PoissonSampledDpEvent(event.sampling_probability, _add_remove_to_replace(event.event))
    raise ValueError(
        f"{type(event).__name__} declared under 'add_or_remove_one' has no sound conversion to "
        f"'replace_one' (randomized response is only defined under replacement)"
    )


__all__ = ["ADD_OR_REMOVE_ONE", "RELATIONS", "REPLACE_ONE", "check_relation", "convert_event"]
