"""Secure aggregation (SecAgg+) for Message-API strategies, on Flower's own crypto primitives.

* :mod:`.masks` - ChaCha20 masks mod 2^b (no Flower imports);
* :mod:`.protocol` - the stages and the records they travel in, and the rules both sides apply;
* :mod:`.identity` - Ed25519 node identities and the operator-signed roster (``flwr-dp roster``);
* :mod:`.client_protocol` - a client's state machine (used by ``client_mods.distributed_dp_mod``);
* :mod:`.server_protocol` - :class:`SecureAggregationRound`, one round over a ``Grid``
  (used by :class:`flwr_dp_strategies.DistributedDpFedAvg`).
"""

from .identity import NodeIdentity, Roster
from .masks import prg_mask
from .protocol import ProtocolError, Stage
from .server_protocol import PROTOCOL_REJECTION, SecureAggregationAborted, SecureAggregationRound

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
