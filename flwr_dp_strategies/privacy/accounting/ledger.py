"""The privacy ledger: what each client's data went through, and the ε it cost.

Model. Every release is a dp-accounting ``DpEvent`` recorded for a round and
either for one client (node id: local mechanisms, client-level selection,
per-client DP-SGD) or for the federation (central mechanisms, e.g. noise on the
aggregate, which touch every client's data). The privacy loss of client c is the
adaptive composition of the central events and c's own events; the ledger
reports it per client and as the worst case over clients.

Accounting. For a composition the ledger asks both dp-accounting accountants
(:mod:`.accountants`) and reports the smaller ε, never the larger: each is a
valid upper bound, so their minimum is too.

* RDP (Mironov 2017) with the Balle et al. 2020 conversion; RDP curves are
  cached per distinct event and summed per client (Σ count·curve), so 1 000
  clients × 1 000 rounds cost one curve per event type.
* PLD (pessimistic, Doroshenko et al. 2022), computed once per distinct
  composition (clients with the same multiset of events share it) with a
  discretisation interval of max(1e-4, 1e-4·ε_RDP), which keeps its cost
  bounded when ε is large and stays a valid (pessimistic) bound.

The worst case over clients only computes PLD for compositions whose RDP ε
exceeds the best worst case found so far (min(RDP, PLD) ≤ RDP).

Unit of privacy. Each booking also has a unit (:mod:`.units`): ``"client"`` (the default, and
what every booking made before units existed means) or ``"record"`` (one record of that client: DP-SGD,
label DP, the functional mechanism; or, for a central event, one record of any client: a Skellam sum of
the clients' record-level contributions under secure aggregation). ``privacy/epsilon`` composes every
booking whatever its unit; when the ledger holds record-level bookings (a client's or central),
:meth:`PrivacyLedger.metrics` also reports the two guarantees apart (:meth:`PrivacyLedger.record_level_report`,
:meth:`PrivacyLedger.client_level_report`; why each is sound, and when it alone is a guarantee for the whole
pipeline, is said there).

Neighbouring relation. One per ledger (``add_or_remove_one`` for central DP,
``replace_one`` for local DP and label DP, where randomized response is only
defined under replacement). Events the accountants cannot handle under that
relation are refused at record time.

Budget. With ``max_epsilon``, :meth:`PrivacyLedger.would_exceed` tells a
strategy *before* a release whether it would push any client above the budget,
so the run can stop cleanly with the budget intact.

Persistence. :meth:`PrivacyLedger.to_json` / :meth:`from_json` keep every
event, client and round (canonical JSON; loading validates every event and the
structure). :meth:`save` / :meth:`load` go through :mod:`.ledger_file`: one
file per strategy holding its named ledgers, with a SHA-256 checksum over the
canonical body (any accidental change is refused; a deliberate forger who
recomputes it is not caught unless an HMAC key is set), fsync and atomic
rename, an exclusive lock against a second writer, a size cap, and one
:class:`~.ledger_file.LedgerFileError` naming the file for every fault.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation

from ..analyses import bounds
from .accountants import LedgerPldAccountant, LedgerRdpAccountant, basic_pure_epsilon, epsilon_from_rdp
from .events import event_from_dict, event_key, event_to_dict
from .ledger_file import _ORIGIN, MAIN, LedgerFileError, LedgerStore, canonical_json, parse_body, read_file
from ..mechanisms.release import Release
from .event_validation import validate_event
from .relations import ADD_OR_REMOVE_ONE, REPLACE_ONE, check_relation, convert_event
from .units import CLIENT, RECORD, check_unit
from ..validation import check_delta, check_int, check_positive

ClientId = Union[int, str]
Signature = tuple[tuple[str, int], ...]

_RELATIONS = {
    "add_or_remove_one": NeighboringRelation.ADD_OR_REMOVE_ONE,
    "replace_one": NeighboringRelation.REPLACE_ONE,
}
_METHODS = ("best", "rdp", "pld")
LEDGER_FORMAT = 1


class PrivacyBudgetExceeded(RuntimeError):
    """Raised by :meth:`PrivacyLedger.check_budget` when a release would exceed ``max_epsilon``."""


@dataclass(frozen=True)
class PrivacyReport:
    """ε at δ for one client (or the worst client), with both accountants' values."""

    epsilon: float
    delta: float
    method: str
    epsilon_rdp: float
    epsilon_pld: float
    client: Optional[str]
    num_clients: int


class PrivacyLedger:
    """Per-client and central record of DP releases with RDP/PLD accounting.

    Args:
        target_delta: δ in (0, 1) at which ε is reported.
        neighboring_relation: ``"add_or_remove_one"`` or ``"replace_one"``.
        max_epsilon: optional budget in (0, inf); see :meth:`would_exceed`.
        accounting: ``"best"`` (min of RDP and PLD), ``"rdp"`` or ``"pld"``.
    """

    def __init__(
        self,
        target_delta: float = 1e-5,
        *,
        neighboring_relation: str = "add_or_remove_one",
        max_epsilon: Optional[float] = None,
        accounting: str = "best",
    ) -> None:
        self.target_delta = check_delta(target_delta, "target_delta")
        self.neighboring_relation = check_relation(neighboring_relation)
        self.max_epsilon = None if max_epsilon is None else check_positive("max_epsilon", max_epsilon)
        if accounting not in _METHODS:
            raise ValueError(f"accounting must be one of {_METHODS}, got {accounting!r}")
        self.accounting = accounting
        self._events: dict[str, dp_event.DpEvent] = {}
        self._key_cache: dict[dp_event.DpEvent, str] = {}
        self._central: dict[str, list[int]] = {}
        self._clients: dict[str, dict[str, list[int]]] = {}
        #: the record-level part of ``_clients`` (same keys and rounds, a sub-multiset); the rest is client-level
        self._record: dict[str, dict[str, list[int]]] = {}
        #: the record-level part of ``_central`` (same keys and rounds, a sub-multiset); the rest is client-level
        self._central_record: dict[str, list[int]] = {}
        self._labels: dict[str, str] = {}
        self._rdp_cache: dict[str, Optional[tuple[np.ndarray, float, float]]] = {}
        self._pld_cache: dict[tuple[str, float], object] = {}
        self._result_cache: dict[tuple[Signature, float, str], tuple[float, float]] = {}

    # ------------------------------------------------------------------ record
    def record(
        self,
        event: Union[dp_event.DpEvent, Release],
        *,
        server_round: int,
        client: Optional[ClientId] = None,
        label: str = "",
        neighboring_relation: Optional[str] = None,
        replace_one_event: Optional[dp_event.DpEvent] = None,
        unit: str = CLIENT,
    ) -> None:
        """Record that ``event`` was released in ``server_round`` (for ``client``, or centrally if None).

        ``unit``: what the event protects (:mod:`.units`): ``"client"`` (default) or ``"record"`` (one
        record of ``client``; for a central event, one record of any client: it is booked for every client
        and bounds nothing at the client level, see :meth:`client_level_report`).

        ``neighboring_relation`` is the relation the event was calibrated under
        (default: this ledger's). An event from another relation is converted
        soundly (:func:`~.relations.convert_event`: add/remove → replace-one doubles
        the sensitivity) or refused with ``ValueError`` (replace-one → add/remove).
        ``replace_one_event`` is an optional tighter form of an add/remove event
        under replacement (e.g. Analyze Gauss: sensitivity √2 instead of 2); a
        replace-one ledger books it instead of the generic conversion. Every event
        is validated (:func:`~.event_validation.validate_event`) before anything is
        booked: an event with a NaN, negative or out-of-domain parameter raises.
        """
        if isinstance(event, Release):
            event = event.event
        rnd = check_int("server_round", server_round, minimum=0)
        unit = check_unit(unit)
        event, label = self._in_own_relation(event, neighboring_relation, replace_one_event, label)
        key = self._register(event)
        if label:
            self._labels.setdefault(key, label)
        target = self._central if client is None else self._clients.setdefault(_client_id(client), {})
        target.setdefault(key, []).append(rnd)
        if unit == RECORD:
            record = self._central_record if client is None else self._record.setdefault(_client_id(client), {})
            record.setdefault(key, []).append(rnd)

    def record_clients(
        self,
        event: dp_event.DpEvent,
        *,
        server_round: int,
        clients: Iterable[ClientId],
        label: str = "",
        neighboring_relation: Optional[str] = None,
        unit: str = CLIENT,
    ) -> None:
        """Record the same event for every client in ``clients`` (one call per round, not per client)."""
        rnd = check_int("server_round", server_round, minimum=0)
        unit = check_unit(unit)
        event, label = self._in_own_relation(event, neighboring_relation, None, label)
        key = self._register(event)
        if label:
            self._labels.setdefault(key, label)
        for client in clients:
            name = _client_id(client)
            self._clients.setdefault(name, {}).setdefault(key, []).append(rnd)
            if unit == RECORD:
                self._record.setdefault(name, {}).setdefault(key, []).append(rnd)

    def _in_own_relation(
        self, event: object, relation: Optional[str], replace_one_event: Optional[dp_event.DpEvent], label: str
    ) -> tuple[dp_event.DpEvent, str]:
        """``event`` validated and converted to this ledger's relation, and its label (noting a conversion)."""
        validate_event(event)
        source = self.neighboring_relation if relation is None else check_relation(relation)
        if replace_one_event is not None:
            validate_event(replace_one_event)
            if source != ADD_OR_REMOVE_ONE:
                raise ValueError(
                    "replace_one_event is only meaningful for an event calibrated under 'add_or_remove_one'"
                )
            if self.neighboring_relation == REPLACE_ONE:
                return replace_one_event, (f"{label} [replace-one form]" if label else label)
        if source == self.neighboring_relation:
            return event, label  # type: ignore[return-value]
        converted = validate_event(convert_event(event, source, self.neighboring_relation))  # type: ignore[arg-type]
        return converted, (f"{label} [converted from {source}]" if label else f"[converted from {source}]")

    def _register(self, event: dp_event.DpEvent) -> str:
        validate_event(event)
        try:
            key = self._key_cache.get(event)
        except TypeError:  # events holding lists (ComposedDpEvent) are not hashable
            key = event_key(event)
        if key is None:
            key = self._key_cache[event] = event_key(event)
        if key not in self._events:
            if not self._supported(event):
                raise ValueError(
                    f"event {type(event).__name__} cannot be accounted under neighboring_relation="
                    f"{self.neighboring_relation!r} (randomized response needs 'replace_one')"
                )
            self._events[key] = event
            try:  # an event dp-accounting cannot compose is refused now, not at the next query
                part = self._rdp_part(key)
                if part is not None and (np.isnan(part[0]).any() or (part[0] < 0).any()):
                    raise ValueError("its RDP curve is not a non-negative number")
            except Exception as err:  # noqa: BLE001 - any accountant failure makes the event unusable
                self._events.pop(key, None)
                self._rdp_cache.pop(key, None)
                raise ValueError(f"event {type(event).__name__} cannot be accounted: {err}") from err
        return key

    def _supported(self, event: dp_event.DpEvent) -> bool:
        """Whether either accountant composes ``event`` under this ledger's relation (False if one crashes)."""
        relation = _RELATIONS[self.neighboring_relation]
        for accountant in (LedgerRdpAccountant, LedgerPldAccountant):
            try:
                if accountant(neighboring_relation=relation).supports(event):
                    return True
            except Exception:  # noqa: BLE001 - dp-accounting raises on degenerate trees (e.g. sampled empty composition)
                continue
        return False

    def check_accountable(
        self,
        event: dp_event.DpEvent,
        *,
        neighboring_relation: Optional[str] = None,
        replace_one_event: Optional[dp_event.DpEvent] = None,
    ) -> None:
        """Raise ``ValueError`` unless ``event`` can be accounted (valid, convertible, RDP curve computable).

        Used on events declared by clients: a malformed event is rejected before it is
        booked, so it can never break a later ε query. The event's RDP curve is cached.
        """
        try:
            event, _ = self._in_own_relation(event, neighboring_relation, replace_one_event, "")
            key = self._register(event)
        except (TypeError, AttributeError) as err:
            raise ValueError(f"event {type(event).__name__} cannot be accounted: {err}") from err
        try:
            part = self._rdp_part(key)
            if part is not None and (
                np.isnan(part[0]).any() or (part[0] < 0).any() or not math.isfinite(part[1] + part[2])
            ):
                raise ValueError("its RDP curve is not a non-negative number")
        except Exception as err:  # noqa: BLE001 - any failure means the event is unusable
            if not any(key in source for source in (self._central, *self._clients.values())):
                self._events.pop(key, None)
                self._rdp_cache.pop(key, None)
            raise ValueError(f"event {type(event).__name__} cannot be accounted: {err}") from err

    # ------------------------------------------------------------------ query
    @property
    def clients(self) -> list[str]:
        """Ids of the clients that have events."""
        return list(self._clients)

    def non_private_clients(self) -> list[str]:
        """Ids of the clients with a non-private event of their own (:func:`non_private_event`: a raw or undeclared
        release reached the server, alone or inside a composed or sampled declaration): their ε is infinite,
        whatever else is booked."""
        return [
            client
            for client, keys in self._clients.items()
            if any(non_private_event(self._events[key]) for key in keys)
        ]

    def rounds(self, client: Optional[ClientId] = None) -> list[int]:
        """Sorted rounds in which ``client`` (or the federation, if None) had a release."""
        source = self._central if client is None else self._clients.get(str(client), {})
        return sorted({r for rounds in source.values() for r in rounds})

    def events(
        self, client: Optional[ClientId] = None, *, unit: Optional[str] = None
    ) -> list[tuple[int, dp_event.DpEvent, str]]:
        """(round, event, label) of ``client``'s own events (central ones if None), by round; with ``unit``,
        only those of that unit."""
        if unit is not None:
            unit = check_unit(unit)
        if client is None:
            source = self._central if unit is None else self._central_unit(unit)
        elif unit is None:
            source = self._clients.get(str(client), {})
        else:
            source = self._unit_bookings(str(client), unit)
        rows = [(r, self._events[k], self._labels.get(k, "")) for k, rs in source.items() for r in rs]
        return sorted(rows, key=lambda row: row[0])

    def has_record_level(self) -> bool:
        """Whether any booking, a client's or central, has the unit ``"record"``."""
        return bool(self._record or self._central_record)

    def units(self, client: ClientId) -> dict[str, int]:
        """How many of ``client``'s own bookings have each unit: ``{"record": n, "client": m}``."""
        name = str(client)
        return {unit: sum(len(r) for r in self._unit_bookings(name, unit).values()) for unit in (RECORD, CLIENT)}

    def _unit_bookings(self, client: str, unit: str) -> dict[str, list[int]]:
        """``client``'s own bookings of ``unit`` (rounds per event key)."""
        return _of_unit(self._clients.get(client, {}), self._record.get(client, {}), unit)

    def _central_unit(self, unit: str) -> dict[str, list[int]]:
        """The central bookings of ``unit`` (rounds per event key)."""
        return _of_unit(self._central, self._central_record, unit)

    def _signature(self, client: Optional[str], extra: Sequence[dp_event.DpEvent] = ()) -> Signature:
        counts: Counter[str] = Counter({k: len(r) for k, r in self._central.items()})
        if client is not None:
            counts.update({k: len(r) for k, r in self._clients.get(client, {}).items()})
        for event in extra:
            counts[self._register(event)] += 1
        return tuple(sorted(counts.items()))

    def _rdp_of(self, signature: Signature, delta: float) -> tuple[float, float]:
        """(ε_RDP at δ, ε of (ε, δ) events) for a composition."""
        relation = _RELATIONS[self.neighboring_relation]
        probe = LedgerRdpAccountant(neighboring_relation=relation)
        total = np.zeros_like(probe.orders, dtype=np.float64)
        approx_eps = approx_delta = 0.0
        for key, count in signature:
            part = self._rdp_part(key)
            if part is None:
                return float("inf"), 0.0
            curve, event_eps, event_delta = part
            total += count * curve
            approx_eps += count * event_eps
            approx_delta += count * event_delta
        eps = epsilon_from_rdp(probe.orders, total, delta, approx_eps, approx_delta)
        return min(eps, self._basic_pure(signature)), approx_eps

    def _basic_pure(self, signature: Signature) -> float:
        """Σ count·ε when every event is pure ε-DP (a valid (ε, 0) bound), else inf."""
        total = 0.0
        for key, count in signature:
            eps = basic_pure_epsilon(self._events[key])
            if eps is None:
                return float("inf")
            total += count * eps
        return total

    def _rdp_part(self, key: str) -> Optional[tuple[np.ndarray, float, float]]:
        """(RDP curve, Σε, Σδ of its (ε, δ) parts) of one event, cached; None if RDP cannot account it."""
        if key not in self._rdp_cache:
            acc = LedgerRdpAccountant(neighboring_relation=_RELATIONS[self.neighboring_relation])
            event = self._events[key]
            if acc.supports(event):
                with _quiet_numerics():
                    acc.compose(event)
                self._rdp_cache[key] = (acc.rdp, acc.approx_epsilon, acc.approx_delta)
            else:
                self._rdp_cache[key] = None
        return self._rdp_cache[key]

    def _pld_of(self, signature: Signature, rdp_epsilon: float, delta: float) -> float:
        """ε at δ of the composition by PLD: cached per-event PLDs, self-composed by FFT."""
        interval = _pld_interval(rdp_epsilon)
        try:
            total = None
            for key, count in signature:
                base = self._pld_base(key, interval)
                if base is None:
                    return float("inf")
                part = base.self_compose(count) if count > 1 else base
                total = part if total is None else total.compose(part)
            return float(total.get_epsilon_for_delta(delta)) if total is not None else 0.0
        except (ArithmeticError, ValueError):
            # PLD discretisation overflows for (near) noiseless events; RDP still answers. Any
            # other numerical failure is read as "no bound from PLD" (inf), never as a number.
            return float("inf")

    def _pld_base(self, key: str, interval: float):
        """The PLD of one event at a discretisation interval (cached); None if PLD cannot account it."""
        cache_key = (key, interval)
        if cache_key not in self._pld_cache:
            acc = LedgerPldAccountant(
                neighboring_relation=_RELATIONS[self.neighboring_relation], value_discretization_interval=interval
            )
            event = self._events[key]
            if not acc.supports(event):
                self._pld_cache[cache_key] = None
            else:
                with _quiet_numerics():
                    acc.compose(event)
                self._pld_cache[cache_key] = None if acc._contains_non_dp_event else acc._pld
        return self._pld_cache[cache_key]

    def _evaluate(
        self, signature: Signature, method: str, delta: float, prune_below: float = -1.0
    ) -> tuple[float, float]:
        """(ε_RDP, ε_PLD) of a composition; PLD skipped (inf) when not asked or when pruned."""
        if not signature:
            return 0.0, 0.0
        cache_key = (signature, delta, method)
        if cache_key in self._result_cache:
            return self._result_cache[cache_key]
        eps_rdp = _upper_bound(self._rdp_of(signature, delta)[0])  # cheap; also sets the PLD discretisation
        eps_pld = float("inf")
        if method == "pld" or (method == "best" and eps_rdp > prune_below):
            eps_pld = _upper_bound(self._pld_of(signature, eps_rdp, delta))
        if method == "best" and eps_rdp <= prune_below:
            return eps_rdp, eps_pld  # not cached: PLD was skipped
        self._result_cache[cache_key] = (eps_rdp, eps_pld)
        return eps_rdp, eps_pld

    def report(
        self, client: Optional[ClientId] = None, *, delta: Optional[float] = None, method: Optional[str] = None
    ) -> PrivacyReport:
        """ε at ``delta`` (default ``target_delta``) of one client's data (central events included),
        or of the worst client when ``client`` is None."""
        method = self._method(method)
        dlt = self.target_delta if delta is None else check_delta(delta)
        if client is not None:
            rdp, pld = self._evaluate(self._signature(str(client)), method, dlt)
            return self._make_report(rdp, pld, method, dlt, str(client))
        return self._worst(method, dlt)

    def epsilon(
        self, client: Optional[ClientId] = None, *, delta: Optional[float] = None, method: Optional[str] = None
    ) -> float:
        """Shorthand for ``report(client, delta=delta).epsilon`` (worst client when ``client`` is None)."""
        return self.report(client, delta=delta, method=method).epsilon

    def _worst(
        self,
        method: str,
        delta: float,
        extra: Optional[Mapping[str, Sequence[dp_event.DpEvent]]] = None,
        extra_central: Sequence[dp_event.DpEvent] = (),
        exclude: frozenset[str] = frozenset(),
    ) -> PrivacyReport:
        extra = extra or {}
        names = (set(self._clients) - exclude) | set(extra)
        by_signature: dict[Signature, Optional[str]] = {}
        for name in sorted(names) or [None]:
            planned = list(extra_central) + (list(extra.get(name, ())) if name is not None else [])
            by_signature.setdefault(self._signature(name, planned), name)
        if method == "best":  # visit likely-worst compositions first so PLD can be pruned
            order = sorted(by_signature, key=lambda sig: -self._evaluate(sig, "rdp", delta)[0])
        else:
            order = list(by_signature)
        best: Optional[PrivacyReport] = None
        for sig in order:
            rdp, pld = self._evaluate(sig, method, delta, prune_below=-1.0 if best is None else best.epsilon)
            report = self._make_report(rdp, pld, method, delta, by_signature[sig])
            if best is None or report.epsilon > best.epsilon:
                best = report
        assert best is not None
        return best

    def _make_report(self, rdp: float, pld: float, method: str, delta: float, client: Optional[str]) -> PrivacyReport:
        eps = {"rdp": rdp, "pld": pld, "best": min(rdp, pld)}[method]
        return PrivacyReport(eps, delta, method, rdp, pld, client, len(self._clients))

    def _method(self, method: Optional[str]) -> str:
        method = method or self.accounting
        if method not in _METHODS:
            raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
        return method

    # ------------------------------------------------------------------ budget
    def would_exceed(
        self,
        client_events: Optional[Mapping[ClientId, Sequence[dp_event.DpEvent]]] = None,
        central_events: Sequence[dp_event.DpEvent] = (),
        *,
        neighboring_relation: Optional[str] = None,
    ) -> bool:
        """Whether recording these planned events would put any client above ``max_epsilon``.

        ``neighboring_relation``: the relation the events are calibrated under (default: this
        ledger's); they are converted exactly as :meth:`record` would book them, so the check
        and the booking can never disagree. Nothing is recorded. Always False without a budget.
        """
        if self.max_epsilon is None:
            return False

        def own(events: Sequence[dp_event.DpEvent]) -> list[dp_event.DpEvent]:
            return [self._in_own_relation(e, neighboring_relation, None, "")[0] for e in events]

        extra = {str(c): own(evs) for c, evs in (client_events or {}).items()}
        worst = self._worst(self._method(None), self.target_delta, extra, own(central_events))
        return worst.epsilon > self.max_epsilon

    def check_budget(
        self,
        client_events: Optional[Mapping[ClientId, Sequence[dp_event.DpEvent]]] = None,
        central_events: Sequence[dp_event.DpEvent] = (),
    ) -> None:
        """Raise :class:`PrivacyBudgetExceeded` if :meth:`would_exceed` says so."""
        if self.would_exceed(client_events, central_events):
            raise PrivacyBudgetExceeded(
                f"the planned release would exceed max_epsilon={self.max_epsilon} at delta={self.target_delta} "
                f"(spent so far: epsilon={self.epsilon():.4g})"
            )

    # ------------------------------------------------------------------ comparison
    def textbook_bounds(self, client: Optional[ClientId] = None) -> dict[str, tuple[float, float]]:
        """Basic and strong composition of the same events, for comparison (see :mod:`.bounds`)."""
        if client is None:
            client = self._worst(self._method(None), self.target_delta).client
        signature = self._signature(None if client is None else str(client))
        events = [(self._events[k], c) for k, c in signature]
        return bounds.textbook_bounds(events, self.target_delta)

    # ------------------------------------------------------------------ metrics
    def protocol_report(self) -> PrivacyReport:
        """The worst ε over the clients that followed the protocol: every client but
        :meth:`non_private_clients` (whose ε is infinite), central events included. Equal to :meth:`report`
        (so infinite) when every client sent a non-private release, and when none did: a federation in which no
        client followed the protocol protects no one."""
        excluded = frozenset(self.non_private_clients())
        if not excluded or excluded == set(self._clients):
            return self.report()
        return self._worst(self._method(None), self.target_delta, exclude=excluded)

    # ------------------------------------------------------------------ units
    def record_level_report(self) -> PrivacyReport:
        r"""The record-level ε: the worst, over the clients that followed the protocol (as
        :meth:`protocol_report`), of the composition of each client's **own record-level** bookings and the
        **central record-level** events (plus every ``NonPrivateDpEvent`` that reached its data, central or its
        own of either unit: a non-private release is non-private for every unit). ``client`` names the worst
        client.

        Why it is sound. A record-level neighbour changes one record of one client c. Everything c sends
        that is computed from its data is, when c follows a record-level protocol (DP-SGD, the functional
        mechanism, label DP), a function of its record-level releases, which its own record-level events
        bound; everything the server releases afterwards (the central noise, the next global models, the
        other clients' replies to them) is computed from the replies, so it is post-processing of those
        releases and costs nothing more. The other clients' data do not change. A central **record-level**
        event (``record(..., client=None, unit="record")``: a Skellam sum under secure aggregation of the
        clients' exact contributions, calibrated for one record of any client) is different: it is computed from
        the clients' data, not from noised record-level releases of theirs (its clients book none), so it is not
        post-processing of anything bounded; it is the bound, for every client at once, and counts in full. A
        central **client-level** event counts only if non-private: a client-level guarantee implies a record-level
        one, but under the conditions below it is post-processing of the replies, which the clients' own
        record-level events already bound, and counting it would be an over-count.

        When it alone is a guarantee for the whole pipeline: exactly when (1) each client's every reply is
        computed only from its record-level releases and public values (no client-level declaration of c
        is a separate release of its data, nothing undeclared leaves c), and (2) every central event is a
        release computed from the replies alone (the central strategies' noise on the clipped sum; not one
        computed from the clients' data by another path) or is itself booked record-level. Then it holds
        against the server too (for a central record-level release: against whoever its trust model names;
        secure aggregation hides each contribution). When a client also declares client-level releases of its
        data (local DP on another output, SignDS, a Laplace inference), or a central client-level release
        reads the clients' data otherwise, its own record-level events do not bound everything that depends
        on one record: read ``privacy/epsilon`` (:meth:`protocol_report`), which composes every booking.
        """
        return self._scoped_worst(RECORD, True)

    def client_level_report(self, *, central_covers_replies: bool = False) -> PrivacyReport:
        r"""The client-level ε: the worst, over the clients that followed the protocol, of the composition of
        the central client-level events and each client's **own client-level** bookings (plus every
        ``NonPrivateDpEvent`` that reached its data, whatever its unit); ∞ when the ledger holds a central
        record-level event.

        Why it is sound. A client-level neighbour adds, removes or replaces one client's whole data; the
        central events (noise on the sum of the clipped updates) and the client's own client-level releases
        (local DP on its whole update) are calibrated for exactly that. A client's record-level releases
        bound nothing at this unit (one client holds many records), so they count only through what covers
        them: ``central_covers_replies=True`` says that every reply reaches the published outputs only
        through a central client-level release booked in this ledger (the strategy clips each reply and
        noises the sum: the central Gaussian strategies, distributed DP), so a client's record-level
        replies are that release's input and are covered by its event. With ``False`` (the default: the
        ledger alone cannot know what the server publishes) a client with record-level bookings has
        client-level ε = ∞: nothing bounds what its whole data changes in a model averaged from its
        record-level replies (``AccountedFedAvg`` over DP-SGD clients). The guarantee is for whoever sees
        the published outputs; the server, which sees each reply before the central noise, is trusted for
        it (record-level DP, :meth:`record_level_report`, is what protects against the server).

        A central **record-level** event (``record(..., client=None, unit="record")``) is calibrated for one
        record of any client: it bounds nothing at this unit (one client holds many records; a client-level
        neighbour changes the released sum by up to all of them), and it is a release of every client's data.
        So while the ledger holds one, the client-level ε is ∞ for every client, whatever
        ``central_covers_replies`` says (that flag is about central client-level releases only).
        """
        return self._scoped_worst(CLIENT, bool(central_covers_replies))

    def _scoped_signature(self, client: Optional[str], unit: str) -> Signature:
        """The composition of ``client``'s bookings of ``unit``, the central events of ``unit`` (so central
        client-level events count in the record-level figure only if non-private) and every
        ``NonPrivateDpEvent`` that reached its data."""
        other_unit = RECORD if unit == CLIENT else CLIENT
        central = Counter({k: len(r) for k, r in self._central_unit(unit).items()})
        central_other = Counter({k: len(r) for k, r in self._central_unit(other_unit).items()})
        own: Counter[str] = Counter()
        other: Counter[str] = Counter()
        if client is not None:
            own.update({k: len(r) for k, r in self._unit_bookings(client, unit).items()})
            other.update({k: len(r) for k, r in self._unit_bookings(client, other_unit).items()})
        counts = own + central + self._non_private(central_other) + self._non_private(other)
        return tuple(sorted(counts.items()))

    def _non_private(self, counts: Counter[str]) -> Counter[str]:
        return Counter({k: n for k, n in counts.items() if non_private_event(self._events[k])})

    def _scoped_worst(self, unit: str, covered: bool) -> PrivacyReport:
        method, delta = self._method(None), self.target_delta
        excluded = set(self.non_private_clients())
        names = sorted(self._clients) if excluded == set(self._clients) else sorted(set(self._clients) - excluded)
        if unit == CLIENT and self._central_record:  # a central record-level release bounds no client's data
            return self._make_report(float("inf"), float("inf"), method, delta, names[0] if names else None)
        if unit == CLIENT and not covered:
            uncovered = [name for name in names if name in self._record]
            if uncovered:
                return self._make_report(float("inf"), float("inf"), method, delta, uncovered[0])
        by_signature: dict[Signature, Optional[str]] = {}
        for name in names or [None]:
            by_signature.setdefault(self._scoped_signature(name, unit), name)
        best: Optional[PrivacyReport] = None
        for sig, name in by_signature.items():
            rdp, pld = self._evaluate(sig, method, delta)
            report = self._make_report(rdp, pld, method, delta, name)
            if best is None or report.epsilon > best.epsilon:
                best = report
        assert best is not None
        return best

    def metrics(self, prefix: str = "privacy/", *, central_covers_replies: bool = False) -> dict[str, float]:
        """Round metrics: the worst ε of the clients that followed the protocol (:meth:`protocol_report`; one
        client that sends a raw update must not set the federation's figure to ∞ for the rest of the run, its
        own ε stays ∞ in :meth:`epsilon` and the per-node figures) and δ, both accountants' values and the
        client count.

        With record-level bookings, a client's or central (:meth:`has_record_level`), also ``epsilon-record-level``
        (:meth:`record_level_report`) and ``epsilon-client-level`` (:meth:`client_level_report`, given
        ``central_covers_replies``); ``epsilon`` stays the composition of everything: at least each of
        the two, so a bound for a unit whenever that unit's figure is one, and the one to read when the
        record-level figure's conditions do not hold. Without record-level bookings the keys are those of a
        ledger without units."""
        rep = self.protocol_report()
        out = {
            f"{prefix}epsilon": float(rep.epsilon),
            f"{prefix}delta": float(rep.delta),
            f"{prefix}epsilon-rdp": float(rep.epsilon_rdp),
            f"{prefix}clients": float(rep.num_clients),
        }
        if math.isfinite(rep.epsilon_pld):
            out[f"{prefix}epsilon-pld"] = float(rep.epsilon_pld)
        if self.max_epsilon is not None:
            out[f"{prefix}max-epsilon"] = float(self.max_epsilon)
        if self.has_record_level():  # both units in one ledger: the two guarantees apart, next to their composition
            out[f"{prefix}epsilon-record-level"] = float(self.record_level_report().epsilon)
            out[f"{prefix}epsilon-client-level"] = float(
                self.client_level_report(central_covers_replies=central_covers_replies).epsilon
            )
        return out

    # ------------------------------------------------------------------ persistence
    def to_json(self) -> str:
        """Serialise the whole ledger (configuration, events, clients, rounds) as canonical JSON
        (no whitespace, ASCII, no NaN): the body a ledger file checksums. The record-level bookings go in
        a field ``record_level`` (client → event key → rounds, a part of ``clients``), the central ones in
        ``central_record_level`` (event key → rounds, a part of ``central``), each written only when there are
        any: a ledger without them has the body it had before units existed (before central record-level
        events existed)."""
        body: dict[str, object] = {
            "format": LEDGER_FORMAT,
            "target_delta": self.target_delta,
            "neighboring_relation": self.neighboring_relation,
            "max_epsilon": self.max_epsilon,
            "accounting": self.accounting,
            "events": {k: event_to_dict(e) for k, e in self._events.items()},
            "labels": self._labels,
            "central": self._central,
            "clients": self._clients,
        }
        if self._record:
            body["record_level"] = self._record
        if self._central_record:
            body["central_record_level"] = self._central_record
        return canonical_json(body)

    @classmethod
    def from_json(cls, text: Union[str, bytes]) -> "PrivacyLedger":
        """Restore a ledger written by :meth:`to_json`; anything malformed raises ``ValueError``.

        Strict JSON (no duplicate key, no NaN/Infinity), exactly the fields :meth:`to_json`
        writes, the configuration checked by the constructor, and every event rebuilt from
        the allow-list and registered through :meth:`_register` (so validated by
        :func:`~.event_validation.validate_event` and refused if it cannot be accounted under
        the ledger's relation). Bookings of event descriptions that turn out equal are merged. A body
        without ``record_level`` (every ledger saved before units existed) books every client's events as
        client-level, one without ``central_record_level`` every central event.
        """
        data = parse_body(text)
        if data["format"] != LEDGER_FORMAT:
            raise ValueError(f"unsupported ledger format {data['format']!r}, expected {LEDGER_FORMAT}")
        try:
            ledger = cls(
                data["target_delta"],
                neighboring_relation=data["neighboring_relation"],
                max_epsilon=data["max_epsilon"],
                accounting=data["accounting"],
            )
            keymap = {old: ledger._register(event_from_dict(ev)) for old, ev in data["events"].items()}
        except (TypeError, KeyError, AttributeError, RecursionError, OverflowError) as err:
            raise ValueError(f"invalid ledger content: {err}") from err
        for old, label in data["labels"].items():
            if label:
                ledger._labels.setdefault(keymap[old], label)
        for old, rounds in data["central"].items():
            ledger._central.setdefault(keymap[old], []).extend(rounds)
        for client, bookings in data["clients"].items():
            target = ledger._clients.setdefault(_client_id(client), {})
            for old, rounds in bookings.items():
                target.setdefault(keymap[old], []).extend(rounds)
        for client, bookings in data.get("record_level", {}).items():  # absent in files saved before units
            target = ledger._record.setdefault(_client_id(client), {})
            for old, rounds in bookings.items():
                target.setdefault(keymap[old], []).extend(rounds)
        for old, rounds in data.get("central_record_level", {}).items():  # absent without central record-level
            ledger._central_record.setdefault(keymap[old], []).extend(rounds)
        return ledger

    def save(
        self, path: Union[str, os.PathLike], *, key: Union[None, str, bytes] = None, max_bytes: Optional[int] = None
    ) -> None:
        """Write the ledger to ``path`` as the ledger file's ``main`` ledger (:mod:`.ledger_file`):
        checksummed, fsynced, atomic, under the file's lock.

        Refuses (:class:`~.ledger_file.LedgerFileError`) to overwrite a file that holds another
        ledger's events, i.e. one this ledger was neither loaded from nor last saved to. Other
        named ledgers in the file are kept. ``key``: HMAC key (default ``$FLWR_DP_LEDGER_KEY``).
        """
        store = LedgerStore(path, key=key, max_bytes=max_bytes)
        store.claim(MAIN, self, lambda: self)
        store.save()

    @classmethod
    def load(
        cls,
        path: Union[str, os.PathLike],
        *,
        name: str = "main",
        key: Union[None, str, bytes] = None,
        max_bytes: Optional[int] = None,
    ) -> "PrivacyLedger":
        """Read ledger ``name`` (default ``main``) of a file written by :meth:`save` or a strategy.

        Every fault (nothing there, a dangling link, an empty, oversized, corrupted, edited or
        invalid file) raises :class:`~.ledger_file.LedgerFileError` naming the file.
        """
        found = read_file(path, key=key, max_bytes=max_bytes)
        if found is None:
            raise LedgerFileError(path, "does not exist")
        bodies, checksum = found
        if name not in bodies:
            raise LedgerFileError(path, f"holds no ledger {name!r} (it holds {sorted(bodies)})")
        try:
            ledger = cls.from_json(bodies[name])
        except Exception as err:  # noqa: BLE001 - whatever fails, the content is not a valid ledger
            raise LedgerFileError(path, f"ledger {name!r} is not a valid ledger: {err}") from err
        _ORIGIN[ledger] = (os.path.realpath(os.path.abspath(os.fspath(path))), checksum)
        return ledger


@contextlib.contextmanager
def _quiet_numerics():
    """Silence NumPy's overflow / divide warnings inside an accountant: a valid event with a tiny noise
    multiplier legitimately gives an infinite RDP or loss, which the ledger reports as ε = ∞."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _upper_bound(epsilon: float) -> float:
    """An accountant's ε as a bound the ledger may report: NaN (an accountant failure) becomes ∞.

    Validated events have non-negative RDP curves and PLDs, so ε ≥ 0; a NaN can
    only come from a numerical failure and must never read as 0 or as a number.
    """
    return float("inf") if math.isnan(epsilon) else max(0.0, float(epsilon))


def non_private_event(event: dp_event.DpEvent) -> bool:
    """Whether ``event`` holds a release with no guarantee: a ``NonPrivateDpEvent`` itself, or one composed into it,
    self-composed at least once, or sampled into it with a positive probability or sample size. Its ε is then ∞ at
    the ledger's δ (for a sampled one, at every δ below the sampling probability: the ledger books it as ∞, an
    over-count where q ≤ δ), at every unit of privacy it reached."""
    if isinstance(event, dp_event.NonPrivateDpEvent):
        return True
    if isinstance(event, dp_event.ComposedDpEvent):
        return any(non_private_event(inner) for inner in event.events)
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return event.count > 0 and non_private_event(event.event)
    if isinstance(event, dp_event.PoissonSampledDpEvent):
        return event.sampling_probability > 0 and non_private_event(event.event)
    if isinstance(event, (dp_event.SampledWithReplacementDpEvent, dp_event.SampledWithoutReplacementDpEvent)):
        return event.sample_size > 0 and non_private_event(event.event)
    return False


def _of_unit(bookings: Mapping[str, list[int]], record: Mapping[str, list[int]], unit: str) -> dict[str, list[int]]:
    """The bookings of ``unit`` among ``bookings`` whose record-level part is ``record`` (rounds per event key)."""
    if unit == RECORD:
        return dict(record)
    rest: dict[str, list[int]] = {}
    for key, rounds in bookings.items():
        left = Counter(rounds) - Counter(record.get(key, []))
        if left:
            rest[key] = sorted(left.elements())
    return rest


def _client_id(client: object) -> str:
    """A client id as the ledger keys it: a node id (int) or a non-empty name, as a string."""
    if isinstance(client, bool) or not isinstance(client, (int, str, np.integer)) or client == "":
        raise ValueError(f"client must be an int node id or a non-empty str, got {client!r}")
    return str(client)


def _pld_interval(rdp_epsilon: float) -> float:
    """PLD discretisation interval: ≈ 1e-4·max(1, ε_RDP), rounded up to a power of two (cacheable).

    Any interval gives a valid (pessimistic) ε; a coarser one for large ε keeps
    the PLD support small, the power of two lets per-event PLDs be reused.
    """
    target = 1e-4 if not math.isfinite(rdp_epsilon) else max(1e-4, 1e-4 * rdp_epsilon)
    return 2.0 ** math.ceil(math.log2(target))


def privacy_metrics(ledger: PrivacyLedger, *, central_covers_replies: bool = False) -> dict[str, float]:
    """The helper every strategy calls: ``privacy/epsilon`` and ``privacy/delta`` (worst client so far), and the
    two scoped figures when the ledger holds record-level bookings (:meth:`PrivacyLedger.metrics`)."""
    return ledger.metrics(central_covers_replies=central_covers_replies)


__all__ = ["PrivacyLedger", "PrivacyReport", "PrivacyBudgetExceeded", "privacy_metrics"]
