r"""Client side of distributed DP under secure aggregation: run SecAgg+, upload only a masked, noised vector.

Use with :class:`flwr_dp_strategies.DistributedDpFedAvg`::

    app = ClientApp()

    @app.train(mods=[distributed_dp_mod])
    def train(msg: Message, context: Context) -> Message:
        ...  # unchanged: train on the received arrays, reply with the new ones

Train messages that carry no secure-aggregation record pass through untouched
(so do evaluate and query messages). For the protocol's messages the mod answers
the ``setup``, ``share-keys`` and ``unmask`` stages itself
(:mod:`flwr_dp_strategies.secure_aggregation.client_protocol`); at the ``collect``
stage it calls the train function, takes the update :math:`\Delta = w' - w`
(all float arrays of the reply's ArrayRecord minus those received, flattened in
the received order, float64) and sends

.. math:: \mathrm{pack}_b\Bigl(\mathrm{encode}(\Delta) + \mathrm{masks} \bmod 2^b\Bigr),

where ``encode`` is :func:`flwr_dp_strategies.privacy.mechanisms.distributed_dp.encode_update`
(clip to C, rotate, scale, conditional randomized rounding, Skellam share
:math:`\mathrm{Sk}(\mu/m)`, wrap) with the public parameters the server sent,
and the masks those of SecAgg+. The reply holds nothing else: the train
function's MetricRecords (loss, accuracy, ``num-examples``) are dropped, as they
would reach the server un-noised. Its noise and rounding use OS entropy
(``make_distributed_dp_mod(rng=...)`` for tests).

What the client owns (set by the mod's arguments or the node config, never by the server):
``min_noise_multiplier`` z_min (default 1, must be > 0), ``max_colluding_clients`` c and its
:class:`~flwr_dp_strategies.secure_aggregation.identity.NodeIdentity` (a long-term Ed25519 key and the
operator-signed roster of its peers, node-config keys ``dp-signing-key``, ``dp-roster``,
``dp-roster-signer``). What it enforces, against a server that controls every field of every message
(:mod:`flwr_dp_strategies.secure_aggregation.client_protocol` has the rules and why each holds):

* the noise floor: with n_min honest shares guaranteed in any sum holding its update (the round's n_h
  with a roster, 1 without: invented peers could surround it), it requires
  :math:`\sqrt{n_{\min}\,\sigma^2_{\text{share}}}/\tilde\Delta_2 \ge z_{\min}`; a server asking for less
  (a zero share included) gets an error reply and nothing else;
* peers: every neighbour's round keys signed by a roster member for this run, round and node id;
* the threshold 2t > h + c, one setup per round, the graph committed before the keys;
* before the unmask: it signs the survivor set only if its protected partners in it leave n_h honest
  shares, and reveals a peer's seed share only with that peer's signature on the same set.

The protocol's order and fields are checked too (an out-of-order or malformed instruction raises, and
Flower returns an error reply that the server counts as a dropout), and the DP parameters' domains
(:class:`~flwr_dp_strategies.privacy.mechanisms.distributed_dp.DistributedDpParams`).
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp.typing import ClientAppCallable

from flwr_dp_strategies.privacy.mechanisms.distributed_dp import DistributedDpParams, encode_update
from flwr_dp_strategies.privacy.rng import RngLike, resolve_rng
from flwr_dp_strategies.privacy.validation import check_int, check_nonnegative, check_positive
from flwr_dp_strategies.secure_aggregation.client_protocol import answer_message, check_noise_floor
from flwr_dp_strategies.secure_aggregation.identity import (
    NODE_CONFIG_KEY,
    NODE_CONFIG_ROSTER,
    NODE_CONFIG_SIGNER,
    NodeIdentity,
)
from flwr_dp_strategies.secure_aggregation.protocol import RECORD, field
from flwr_dp_strategies.wire import DISTRIBUTED_DP_FIELDS, flat_update

DP_FIELDS = DISTRIBUTED_DP_FIELDS
"""The public distributed-DP parameters of the collect stage (server → client), with their types."""


def params_from_record(record: ConfigRecord, bits: int) -> tuple[DistributedDpParams, float]:
    """(the encoding parameters, the noise share μ/m) sent by the server; ValueError if out of domain."""
    values = {key: field(record, key, kind) for key, kind in DP_FIELDS.items()}
    params = DistributedDpParams(
        dim=values["dp-dim"],
        clip_norm=values["dp-clip-norm"],
        scale=values["dp-scale"],
        bits=bits,
        rotation_seed=values["dp-rotation-seed"],
        beta=values["dp-beta"],
    )
    return params, check_nonnegative("dp-noise-share", values["dp-noise-share"])


def _single_array_record(content: RecordDict, what: str) -> ArrayRecord:
    records = [r for r in content.values() if isinstance(r, ArrayRecord)]
    if len(records) != 1:
        raise ValueError(f"the {what} must hold exactly one ArrayRecord, got {len(records)}")
    return records[0]


DEFAULT_MIN_NOISE_MULTIPLIER = 1.0
"""The noise multiplier a client requires, by default, in any sum holding its update that a server can unmask."""

NODE_CONFIG_FLOOR = "dp-min-noise-multiplier"
"""Node-config key overriding ``min_noise_multiplier`` (set by the node's operator, never by the server)."""
NODE_CONFIG_COLLUDERS = "dp-max-colluding-clients"
"""Node-config key overriding ``max_colluding_clients``."""

IdentitySource = Union[None, NodeIdentity, Callable[[Context], Optional[NodeIdentity]]]


class ClientPolicy:
    """What a client requires, resolved per message from the mod's arguments and the node config (client side
    only: nothing here is read from a server's message). Node-config keys win over the arguments:
    :data:`NODE_CONFIG_FLOOR`, :data:`NODE_CONFIG_COLLUDERS` and the roster's three keys
    (:meth:`~flwr_dp_strategies.secure_aggregation.identity.NodeIdentity.from_node_config`)."""

    def __init__(self, *, min_noise_multiplier: float, max_colluding_clients: int, identity: IdentitySource) -> None:
        self.floor = check_positive("min_noise_multiplier", min_noise_multiplier)
        self.colluders = check_int("max_colluding_clients", max_colluding_clients, minimum=0)
        if identity is not None and not isinstance(identity, NodeIdentity) and not callable(identity):
            raise TypeError(
                f"identity must be a NodeIdentity, a callable of the Context or None, got {type(identity).__name__}"
            )
        self.identity = identity
        self._loaded: dict[tuple[str, ...], Optional[NodeIdentity]] = {}

    def resolve(self, ctxt: Context) -> tuple[float, int, Optional[NodeIdentity]]:
        """(the noise floor, the colluders assumed, the node's identity) for this message."""
        config = ctxt.node_config
        floor = self.floor
        if NODE_CONFIG_FLOOR in config:
            floor = check_positive(NODE_CONFIG_FLOOR, config[NODE_CONFIG_FLOOR])
        colluders = self.colluders
        if NODE_CONFIG_COLLUDERS in config:
            colluders = check_int(NODE_CONFIG_COLLUDERS, config[NODE_CONFIG_COLLUDERS], minimum=0)
        return floor, colluders, self._identity(ctxt)

    def _identity(self, ctxt: Context) -> Optional[NodeIdentity]:
        keys = tuple(
            str(ctxt.node_config.get(k, "")) for k in (NODE_CONFIG_KEY, NODE_CONFIG_ROSTER, NODE_CONFIG_SIGNER)
        )
        if any(keys):
            if keys not in self._loaded:
                self._loaded[keys] = NodeIdentity.from_node_config(ctxt.node_config)
            return self._loaded[keys]
        if isinstance(self.identity, NodeIdentity) or self.identity is None:
            return self.identity
        return self.identity(ctxt)


def make_distributed_dp_mod(
    *,
    min_noise_multiplier: float = DEFAULT_MIN_NOISE_MULTIPLIER,
    max_colluding_clients: int = 0,
    identity: IdentitySource = None,
    rng: RngLike = None,
) -> Callable[[Message, Context, ClientAppCallable], Message]:
    """A ``distributed_dp_mod`` that requires noise multiplier ``min_noise_multiplier`` (> 0) in any sum holding
    its update that a server can unmask, assumes ``max_colluding_clients`` colluders at least, authenticates
    its peers with ``identity`` (a :class:`~flwr_dp_strategies.secure_aggregation.identity.NodeIdentity`
    with a roster, a callable of the Context returning one, or None: the node config's roster keys, and
    without them no roster) and draws from ``rng``.

    See the module docstring (:mod:`client_mods.distributed_dp_mod`) for what the mod sends and
    checks; ``client_mods.distributed_dp_mod`` is ``make_distributed_dp_mod()``.
    """
    policy = ClientPolicy(
        min_noise_multiplier=min_noise_multiplier, max_colluding_clients=max_colluding_clients, identity=identity
    )
    fixed = None if rng is None else resolve_rng(rng)  # None: fresh OS entropy for every message

    def distributed_dp_mod(msg: Message, ctxt: Context, call_next: ClientAppCallable) -> Message:
        """Answer the secure-aggregation stages of a train message; pass every other message on."""
        if msg.metadata.message_type != MessageType.TRAIN or RECORD not in msg.content:
            return call_next(msg, ctxt)
        floor, colluders, node_identity = policy.resolve(ctxt)
        return answer_message(
            msg,
            ctxt,
            lambda state: _encode(
                msg, ctxt, call_next, state, floor, fixed if fixed is not None else resolve_rng(None)
            ),
            min_colluders=colluders,
            identity=node_identity,
        )

    return distributed_dp_mod


def _encode(
    msg: Message,
    ctxt: Context,
    call_next: ClientAppCallable,
    state: ConfigRecord,
    floor: float,
    generator: np.random.Generator,
) -> np.ndarray:
    params, share = params_from_record(msg.content[RECORD], int(state["bits"]))
    check_noise_floor(state, share, params.rounding_bound, floor)
    received = _single_array_record(msg.content, "train message")
    reply = call_next(msg, ctxt)
    if reply.has_error():
        raise RuntimeError(f"the train function failed: {reply.error}")
    delta = flat_update(received, _single_array_record(reply.content, "train reply"))
    if delta.size != params.dim:
        raise ValueError(f"the update has {delta.size} values, the server expects dp-dim = {params.dim}")
    return encode_update(delta, params, local_noise_variance=share, rng=generator)


distributed_dp_mod = make_distributed_dp_mod()
"""The mod with the default floor (noise multiplier 1), its identity from the node config, OS entropy."""

__all__ = [
    "ClientPolicy",
    "DEFAULT_MIN_NOISE_MULTIPLIER",
    "DP_FIELDS",
    "NODE_CONFIG_COLLUDERS",
    "NODE_CONFIG_FLOOR",
    "distributed_dp_mod",
    "make_distributed_dp_mod",
    "params_from_record",
]
