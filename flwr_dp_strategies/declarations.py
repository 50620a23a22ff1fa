"""Client privacy declarations: how a reply says what its client released.

A client-side mechanism (a mod, a trainer, a data wrapper) that releases
something computed from private data declares it in the reply it sends,
as one dp-accounting :class:`~dp_accounting.dp_event.DpEvent` per release::

    declare_release(reply.content, release.event, label="local-laplace/inference",
                    neighboring_relation="replace_one")

Every declaration states the neighbouring relation its sensitivity was computed
for (``neighboring_relation``, required): the server's ledger converts an
add/remove event soundly into a replace-one ledger (sensitivity doubled, or the
tighter ``replace_one_event`` the client gives) and refuses a replace-one event
in an add/remove ledger (see :mod:`flwr_dp_strategies.privacy.accounting.relations`). A
declaration without a relation is malformed.

Every declaration also has a unit of privacy (``unit``, :mod:`flwr_dp_strategies.privacy.accounting.units`):
``"client"`` (the default: the release is DP for the client's whole data, e.g. local DP on its update) or
``"record"`` (DP for one record of the client: DP-SGD, label DP, the functional mechanism). The server books
it with that unit, and a ledger holding record-level bookings publishes the two guarantees apart
(``privacy/epsilon-record-level``, ``privacy/epsilon-client-level``) beside their composition. Any other
value makes the declaration malformed.

The declarations travel in one :class:`flwr.app.ConfigRecord` under the key
:data:`PRIVACY_RECORD` (field ``"events"``: a list of JSON strings, each
``{"event": <event_to_dict>, "label": str, "relation": str}`` and optionally
``"replace_one_event"`` and ``"unit"``, written only when it is ``"record"``: a declaration without it
is client-level, as every declaration made before units existed). A ConfigRecord does not disturb
Flower's aggregation (FedAvg checks only ArrayRecords and MetricRecords).

The server reads them with :func:`read_declarations` and books them in its
:class:`~flwr_dp_strategies.privacy.PrivacyLedger` under the replying node id
(see :class:`flwr_dp_strategies.strategy.AccountedFedAvg`). Only event types on
the ledger's allow-list are accepted; anything else, oversized or malformed
makes the whole declaration invalid, and the strategy rejects that reply.

Trust: a client's ε protects that client's own data, so the client is the one
who declares it; a client that under-declares harms only itself. A server that
must not trust clients should instead derive the events from the parameters it
sends (e.g. the SignDS strategy records ``sign_eps`` itself).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional, Union

from dp_accounting.dp_event import DpEvent
from flwr.app import ConfigRecord, RecordDict

from .privacy import Release
from .privacy.accounting.events import event_from_dict, event_to_dict
from .privacy.accounting.event_validation import validate_event
from .privacy.accounting.relations import ADD_OR_REMOVE_ONE, check_relation
from .privacy.accounting.units import CLIENT, check_unit

PRIVACY_RECORD = "privacy-declarations"
EVENTS_FIELD = "events"
MAX_EVENTS = 64
MAX_EVENT_CHARS = 4096
MAX_JSON_DEPTH = 40


class MalformedDeclaration(ValueError):
    """A reply's privacy declaration cannot be read (wrong type, unknown event, too large)."""


@dataclass(frozen=True)
class Declaration:
    """One declared release: the event, a short label saying what it was, its relation and its unit.

    ``neighboring_relation`` is the relation ``event``'s sensitivity was computed
    for; ``replace_one_event`` an optional tighter form of an add/remove event
    under replacement; ``unit`` what one neighbour differs in (``"record"`` or ``"client"``).
    Pass them all to :meth:`PrivacyLedger.record`.
    """

    event: DpEvent
    label: str
    neighboring_relation: str
    replace_one_event: Optional[DpEvent] = None
    unit: str = CLIENT


def declare_release(
    content: RecordDict,
    event: Union[DpEvent, Release],
    *,
    label: str,
    neighboring_relation: str,
    replace_one_event: Optional[DpEvent] = None,
    unit: str = CLIENT,
) -> None:
    """Append ``event`` (or a Release's event) to the declarations in ``content``.

    Args:
        content: the reply's RecordDict.
        event: what was released (validated here: a client cannot send what a server refuses).
        label: a short description (at most 200 characters are kept).
        neighboring_relation: ``"add_or_remove_one"`` or ``"replace_one"``, the relation the
            event's sensitivity was computed for.
        replace_one_event: optional tighter replace-one form of an add/remove event.
        unit: ``"client"`` (default: the event bounds what the client's whole data changes) or ``"record"``
            (it bounds what one record of the client changes: DP-SGD, label DP, the functional mechanism).
    """
    if isinstance(event, Release):
        event = event.event
    validate_event(event)
    relation = check_relation(neighboring_relation)
    unit = check_unit(unit)
    data = {"event": event_to_dict(event), "label": str(label), "relation": relation}
    if unit != CLIENT:
        data["unit"] = unit
    if replace_one_event is not None:
        if relation != ADD_OR_REMOVE_ONE:
            raise ValueError("replace_one_event is only meaningful with neighboring_relation='add_or_remove_one'")
        data["replace_one_event"] = event_to_dict(validate_event(replace_one_event))
    entry = json.dumps(data, separators=(",", ":"))
    record = content.config_records.get(PRIVACY_RECORD)
    if record is None:
        content[PRIVACY_RECORD] = ConfigRecord({EVENTS_FIELD: [entry]})
        return
    entries = list(record.get(EVENTS_FIELD, []))  # type: ignore[arg-type]
    record[EVENTS_FIELD] = entries + [entry]


def read_declarations(content: RecordDict) -> list[Declaration]:
    """The declarations in ``content`` ([] if there are none).

    Raises :class:`MalformedDeclaration` if the record is not a list of at most
    :data:`MAX_EVENTS` JSON strings of at most :data:`MAX_EVENT_CHARS` characters
    nested at most :data:`MAX_JSON_DEPTH` deep, each holding a known event type with
    valid parameters (:func:`~flwr_dp_strategies.privacy.accounting.event_validation.validate_event`)
    and a neighbouring relation, and no unit other than ``"record"`` or ``"client"``.
    """
    record = content.config_records.get(PRIVACY_RECORD)
    if record is None:
        return []
    entries = record.get(EVENTS_FIELD)
    if not isinstance(entries, list) or len(entries) > MAX_EVENTS:
        raise MalformedDeclaration(f"{PRIVACY_RECORD}.{EVENTS_FIELD} must be a list of at most {MAX_EVENTS} strings")
    return [_parse(entry) for entry in entries]


def _json_depth(text: str) -> int:
    """The maximal bracket nesting of ``text`` outside strings (an upper bound of the JSON depth)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _parse(entry: object) -> Declaration:
    if not isinstance(entry, str) or len(entry) > MAX_EVENT_CHARS:
        raise MalformedDeclaration(f"each declaration must be a JSON string of at most {MAX_EVENT_CHARS} characters")
    if _json_depth(entry) > MAX_JSON_DEPTH:
        raise MalformedDeclaration(f"a declaration may nest at most {MAX_JSON_DEPTH} levels")
    try:
        data = json.loads(entry)
        if not isinstance(data, dict):
            raise ValueError("a declaration must be a JSON object")
        event = validate_event(event_from_dict(data["event"]))
        relation = check_relation(data.get("relation"), "declaration relation")
        tighter = data.get("replace_one_event")
        replace_one_event = None if tighter is None else validate_event(event_from_dict(tighter))
        if replace_one_event is not None and relation != ADD_OR_REMOVE_ONE:
            raise ValueError("replace_one_event given for an event not calibrated under 'add_or_remove_one'")
        label = data.get("label", "")
        unit = check_unit(data.get("unit", CLIENT), "declaration unit")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
        raise MalformedDeclaration(f"unreadable privacy declaration: {err}") from err
    if not isinstance(label, str):
        raise MalformedDeclaration("a declaration's label must be a string")
    return Declaration(
        event=event,
        label=label[:200],
        neighboring_relation=relation,
        replace_one_event=replace_one_event,
        unit=unit,
    )


__all__ = [
    "Declaration",
    "EVENTS_FIELD",
    "MAX_EVENTS",
    "MalformedDeclaration",
    "PRIVACY_RECORD",
    "declare_release",
    "read_declarations",
]
