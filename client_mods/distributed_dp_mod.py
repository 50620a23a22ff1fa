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

where ``encode`` is :func:`flwr_dp_strategies.privacy.distributed_dp.encode_update`
(clip to C, rotate, scale, conditional randomized rounding, Skellam share
:math:`\mathrm{Sk}(\mu/m)`, wrap) with the public parameters the server sent,
and the masks those of SecAgg+. The reply holds nothing else: the train
function's MetricRecords (loss, accuracy, ``num-examples``) are dropped, as they
would reach the server un-noised. Its noise and rounding use OS entropy
(``make_distributed_dp_mod(rng=...)`` for tests).

What the client checks before it spends anything: the protocol's order and
fields (an out-of-order or malformed instruction raises, and Flower returns an
error reply that the server counts as a dropout), the DP parameters' domains
(:class:`~flwr_dp_strategies.privacy.distributed_dp.DistributedDpParams`), and,
with ``min_noise_multiplier``, that the noise in any sum a server lying about dropouts
can unmask is at least that: the client's rules guarantee
:math:`n_{\min}` honest shares in it
(:func:`~flwr_dp_strategies.secure_aggregation.protocol.honest_shares_bound`: the
complete graph's counting bound, 1 in a sparse graph), so it checks
:math:`\sqrt{n_{\min}\mu/(m-c)}/\tilde\Delta_2 \ge z_{\min}` (a server that asks for less
noise is refused). ``max_colluding_clients`` is the number of colluders the client
assumes whatever the server declares (it refuses thresholds they could meet).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp.typing import ClientAppCallable

from flwr_dp_strategies.privacy.distributed_dp import DistributedDpParams, encode_update
from flwr_dp_strategies.privacy.rng import RngLike, resolve_rng
from flwr_dp_strategies.privacy.validation import check_int, check_nonnegative
from flwr_dp_strategies.secure_aggregation.client_protocol import answer_message, check_noise_floor
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


def make_distributed_dp_mod(
    *, min_noise_multiplier: float = 0.0, max_colluding_clients: int = 0, rng: RngLike = None
) -> Callable[[Message, Context, ClientAppCallable], Message]:
    """A ``distributed_dp_mod`` that refuses noise below ``min_noise_multiplier`` in any sum it can be
    unmasked in, assumes ``max_colluding_clients`` colluders at least, and draws from ``rng``.

    See the module docstring (:mod:`client_mods.distributed_dp_mod`) for what the mod sends and
    checks; ``client_mods.distributed_dp_mod`` is ``make_distributed_dp_mod()``.
    """
    floor = check_nonnegative("min_noise_multiplier", min_noise_multiplier)
    colluders = check_int("max_colluding_clients", max_colluding_clients, minimum=0)
    fixed = None if rng is None else resolve_rng(rng)  # None: fresh OS entropy for every message

    def distributed_dp_mod(msg: Message, ctxt: Context, call_next: ClientAppCallable) -> Message:
        """Answer the secure-aggregation stages of a train message; pass every other message on."""
        if msg.metadata.message_type != MessageType.TRAIN or RECORD not in msg.content:
            return call_next(msg, ctxt)
        return answer_message(
            msg,
            ctxt,
            lambda state: _encode(
                msg, ctxt, call_next, state, floor, fixed if fixed is not None else resolve_rng(None)
            ),
            min_colluders=colluders,
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
"""The mod with no noise floor, drawing from OS entropy."""

__all__ = ["DP_FIELDS", "distributed_dp_mod", "make_distributed_dp_mod", "params_from_record"]
