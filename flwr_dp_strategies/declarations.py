"""Client privacy declarations: how a reply says what its client released.

A client-side mechanism (a mod, a trainer, a data wrapper) that releases
something computed from private data declares it in the reply it sends,
as one dp-accounting :class:`~dp_accounting.dp_event.DpEvent` per release::

    declare_release(reply.content, release.event, label="local-laplace/inference")

The declarations travel in one :class:`flwr.app.ConfigRecord` under the key
:data:`PRIVACY_RECORD` (field ``"events"``: a list of JSON strings, each
``{"event": <event_to_dict>, "label": str}``). A ConfigRecord does not disturb
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
from typing import Union

from dp_accounting.dp_event import DpEvent
from flwr.app import ConfigRecord, RecordDict

from .privacy import Release, event_from_dict, event_to_dict

PRIVACY_RECORD = "privacy-declarations"
EVENTS_FIELD = "events"
MAX_EVENTS = 64
MAX_EVENT_CHARS = 4096


class MalformedDeclaration(ValueError):
    """A reply's privacy declaration cannot be read (wrong type, unknown event, too large)."""


@dataclass(frozen=True)
class Declaration:
    """One declared release: the event and a short label saying what it was."""

    event: DpEvent
    label: str


def declare_release(content: RecordDict, event: Union[DpEvent, Release], *, label: str) -> None:
    """Append ``event`` (or a Release's event) to the declarations in ``content``."""
    if isinstance(event, Release):
        event = event.event
    entry = json.dumps({"event": event_to_dict(event), "label": str(label)}, separators=(",", ":"))
    record = content.config_records.get(PRIVACY_RECORD)
    if record is None:
        content[PRIVACY_RECORD] = ConfigRecord({EVENTS_FIELD: [entry]})
        return
    entries = list(record.get(EVENTS_FIELD, []))  # type: ignore[arg-type]
    record[EVENTS_FIELD] = entries + [entry]


def read_declarations(content: RecordDict) -> list[Declaration]:
    """The declarations in ``content`` ([] if there are none).

    Raises :class:`MalformedDeclaration` if the record is not a list of at most
    :data:`MAX_EVENTS` JSON strings of at most :data:`MAX_EVENT_CHARS` characters,
    each holding a known event type with valid parameters.
    """
    record = content.config_records.get(PRIVACY_RECORD)
    if record is None:
        return []
    entries = record.get(EVENTS_FIELD)
    if not isinstance(entries, list) or len(entries) > MAX_EVENTS:
        raise MalformedDeclaration(f"{PRIVACY_RECORD}.{EVENTS_FIELD} must be a list of at most {MAX_EVENTS} strings")
    return [_parse(entry) for entry in entries]


def _parse(entry: object) -> Declaration:
    if not isinstance(entry, str) or len(entry) > MAX_EVENT_CHARS:
        raise MalformedDeclaration(f"each declaration must be a JSON string of at most {MAX_EVENT_CHARS} characters")
    try:
        data = json.loads(entry)
        event = event_from_dict(data["event"])
        label = data.get("label", "")
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise MalformedDeclaration(f"unreadable privacy declaration: {err}") from err
    if not isinstance(label, str):
        raise MalformedDeclaration("a declaration's label must be a string")
    return Declaration(event=event, label=label[:200])


__all__ = [
    "Declaration",
    "EVENTS_FIELD",
    "MAX_EVENTS",
    "MalformedDeclaration",
    "PRIVACY_RECORD",
    "declare_release",
    "read_declarations",
]
