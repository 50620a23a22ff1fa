"""Secure aggregation (SecAgg+) for Message-API strategies, on Flower's own crypto primitives.

* :mod:`.masks` - ChaCha20 masks mod 2^b (no Flower imports);
* :mod:`.protocol` - the stages and the records they travel in, and the rules both sides apply;
* :mod:`.identity` - Ed25519 node identities and the operator-signed roster (``flwr-dp roster``);
* :mod:`.client_protocol` - a client's state machine (used by ``client_mods.distributed_dp_mod``);
* :mod:`.server_protocol` - :class:`SecureAggregationRound`, one round over a ``Grid``
  (used by :class:`flwr_dp_strategies.DistributedDpFedAvg`).
"""

from typing import TYPE_CHECKING

from .identity import NodeIdentity, Roster
from .masks import prg_mask
from .protocol import ProtocolError, Stage

#: the server's half, imported on first use: a client that imports the client protocol never loads it
_SERVER = ("PROTOCOL_REJECTION", "SecureAggregationAborted", "SecureAggregationRound")

if TYPE_CHECKING:
    from .server_protocol import PROTOCOL_REJECTION, SecureAggregationAborted, SecureAggregationRound


def __getattr__(name: str):
    if name in _SERVER:
        from . import server_protocol

        return getattr(server_protocol, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "NodeIdentity",
    "PROTOCOL_REJECTION",
    "ProtocolError",
    "Roster",
    "SecureAggregationAborted",
    "SecureAggregationRound",
    "Stage",
    "prg_mask",
]
