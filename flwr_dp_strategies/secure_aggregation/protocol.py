"""The wire format of the Message-API SecAgg+ round: stages, record names and their validation.

Every message of the protocol is a Flower ``train`` message whose content holds the
ConfigRecord :data:`RECORD` with the key ``"stage"``; the client's protocol state
lives in ``context.state.config_records[STATE_RECORD]``. What travels in the clear,
stage by stage (nothing of it depends on the client's data):

=================  ===============================================  ==============================================
stage              server → client                                  client → server
=================  ===============================================  ==============================================
``setup``          round, threshold t, bits b                       two fresh ECDH public keys (pk1, pk2)
``share-keys``     the neighbours' node ids and public keys          Shamir shares of b_u and sk1, each encrypted
                                                                    for one neighbour (Fernet under ECDH(sk2, pk2))
``collect``        the model (Flower's train content), the           the masked vector (uint64 in [0, 2^b)) only:
                   ciphertexts addressed to this client, the         the ClientApp's metrics and ``num-examples`` are
                   public distributed-DP parameters                  dropped (they would leave un-noised)
``unmask``         which neighbours survived / dropped               the shares of b_v (survivors) or sk1_v
                                                                    (dropped), never both for one node
=================  ===============================================  ==============================================

Every validator raises :class:`ProtocolError` (a ``ValueError``) naming the field;
a client answers a malformed instruction with an error reply (the server counts
it as a dropout), the server rejects a malformed reply and treats its sender as
dropped.
"""

from __future__ import annotations

from typing import Any, Sequence

from flwr.app import ConfigRecord, RecordDict

RECORD = "secure-aggregation"
STATE_RECORD = "secure-aggregation-state"
MASKED_RECORD = "masked"
MASKED_KEY = "vector"
STAGE_KEY = "stage"


class Stage:
    """The four stages of one round, in order."""

    SETUP = "setup"
    SHARE_KEYS = "share-keys"
    COLLECT = "collect"
    UNMASK = "unmask"
    ORDER = (SETUP, SHARE_KEYS, COLLECT, UNMASK)


class ProtocolError(ValueError):
    """A protocol message that does not follow the protocol (the field is named in the message)."""


def stage_record(content: RecordDict) -> ConfigRecord:
    """The protocol record of ``content`` (ProtocolError if absent or not a ConfigRecord)."""
    if RECORD not in content or not isinstance(content[RECORD], ConfigRecord):
        raise ProtocolError(f"the message holds no ConfigRecord {RECORD!r}")
    return content[RECORD]


def stage_of(content: RecordDict) -> str:
    """The stage named by ``content`` (ProtocolError if unknown)."""
    stage = stage_record(content).get(STAGE_KEY)
    if stage not in Stage.ORDER:
        raise ProtocolError(f"{STAGE_KEY} must be one of {Stage.ORDER}, got {stage!r}")
    return str(stage)


def field(record: ConfigRecord, key: str, kind: type) -> Any:
    """``record[key]``, checked to be exactly of type ``kind`` (bool is not an int)."""
    if key not in record:
        raise ProtocolError(f"field {key!r} is missing")
    value = record[key]
    if type(value) is not kind:  # noqa: E721 - exact type: bool must not pass as int
        raise ProtocolError(f"field {key!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


def list_field(record: ConfigRecord, key: str, kind: type, *, length: int | None = None) -> list[Any]:
    """``record[key]`` as a list whose items are exactly of type ``kind`` (an empty list is accepted)."""
    if key not in record:
        raise ProtocolError(f"field {key!r} is missing")
    value = record[key]
    if not isinstance(value, list) or any(type(item) is not kind for item in value):  # noqa: E721
        raise ProtocolError(f"field {key!r} must be a list of {kind.__name__}")
    if length is not None and len(value) != length:
        raise ProtocolError(f"field {key!r} must have {length} items, got {len(value)}")
    return list(value)


def distinct(key: str, values: Sequence[Any]) -> None:
    """ProtocolError if ``values`` repeat."""
    if len(set(values)) != len(values):
        raise ProtocolError(f"field {key!r} repeats a value")


__all__ = ["MASKED_KEY", "MASKED_RECORD", "RECORD", "STAGE_KEY", "STATE_RECORD", "ProtocolError", "Stage",
           "distinct", "field", "list_field", "stage_of", "stage_record"]
