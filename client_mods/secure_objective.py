r"""Client side of :class:`flwr_dp_strategies.SecureObjectiveSum`: the exact FM objective, under secure aggregation.

Use in a ClientApp::

    trainer = SecureObjectiveTrainer(num_classes=10)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        features, labels = load_local_data(context)
        return trainer.train(msg, context, features, labels)

Every train message of the strategy is one SecAgg+ stage; the trainer answers it
(:func:`flwr_dp_strategies.secure_aggregation.client_protocol.answer_message`). At the
``collect`` stage it computes its **exact** Taylor coefficients
:math:`c_i = (\operatorname{vec}A_i, \operatorname{triu}S_i, n_i)` of the rows clipped to unit
norm, and uploads

.. math:: \mathrm{pack}_b\bigl(\mathrm{round}(s\,c_i) + \mathrm{Sk}(\mu/m) + \mathrm{masks} \bmod 2^b\bigr)

(:func:`flwr_dp_strategies.privacy.mechanisms.secure_objective.encode_objective`, with s and μ/m the
server's public parameters). Nothing else leaves the node: no count, no loss, no metric
(under add/remove the count is private; it travels inside the secure sum). The privacy
of the release is the server's single Skellam event (derivation:
:mod:`flwr_dp_strategies.privacy.mechanisms.secure_objective`); the client declares nothing, its
own vector being hidden by the masks.

What the client checks before it spends anything: the protocol's order and fields
(:mod:`~flwr_dp_strategies.secure_aggregation.client_protocol`), that the server's q, c
and loss are its own, the parameters' domains, and with ``min_noise_multiplier`` (default 1) that
the noise in any sum holding it that a server can unmask (at least n_min honest shares: the round's n_h
with a roster, 1 without; see ``client_mods.distributed_dp_mod``) is at least that many
times the add/remove integer sensitivity: :math:`\sqrt{n_{\min}\mu/(m-c)}/(sB + \sqrt D) \ge z_{\min}`.
``max_colluding_clients`` is the number of colluders this client assumes whatever the server declares.
Rounding and noise draw from OS entropy (``rng`` for tests).
"""

from __future__ import annotations


import numpy as np
from flwr.app import ConfigRecord, Context, Message, MessageType

from flwr_dp_strategies.privacy.mechanisms.functional_mechanism import quadratic_statistics
from flwr_dp_strategies.privacy.rng import RngLike, RngSource
from flwr_dp_strategies.privacy.mechanisms.secure_objective import (
    SecureObjectiveParams,
    encode_objective,
    integer_l2_sensitivity,
    record_l2_bound,
)
from flwr_dp_strategies.privacy.validation import check_int, check_nonnegative

from .distributed_dp_mod import DEFAULT_MIN_NOISE_MULTIPLIER, ClientPolicy, IdentitySource
from flwr_dp_strategies.secure_aggregation.client_protocol import answer_message, check_noise_floor
from flwr_dp_strategies.secure_aggregation.protocol import RECORD, ProtocolError, field
from flwr_dp_strategies.wire import SECURE_OBJECTIVE_FIELDS

OBJECTIVE_FIELDS = SECURE_OBJECTIVE_FIELDS
"""The public parameters of the collect stage (server → client), with their types."""


def objective_params_from_record(record: ConfigRecord, bits: int) -> tuple[SecureObjectiveParams, float]:
    """(the encoding parameters, the noise share μ/m) sent by the server; ValueError if out of domain."""
    values = {key: field(record, key, kind) for key, kind in OBJECTIVE_FIELDS.items()}
    params = SecureObjectiveParams(
        dim=values["fm-dim"],
        num_classes=values["fm-num-classes"],
        loss=values["fm-loss"],
        scale=values["fm-scale"],
        bits=bits,
    )
    return params, check_nonnegative("fm-noise-share", values["fm-noise-share"])


class SecureObjectiveTrainer:
    """Answer :class:`~flwr_dp_strategies.SecureObjectiveSum`'s protocol with the exact FM objective.

    Args:
        num_classes: c ≥ 2 of the head (must match the server's).
        loss: ``"softmax"`` or ``"logistic"``.
        min_noise_multiplier: z_min > 0 (module docstring, default 1); a server asking for less is refused.
        max_colluding_clients: c ≥ 0 this client assumes (it refuses thresholds that c colluders could meet).
        identity: the node's signing key and roster (as ``client_mods.make_distributed_dp_mod``'s; None: the
            node config's roster keys, else no roster: only the client's own share counts).
        rng: None (fresh OS entropy), an int seed or a Generator (tests only).
    """

    def __init__(
        self,
        *,
        num_classes: int,
        loss: str = "softmax",
        min_noise_multiplier: float = DEFAULT_MIN_NOISE_MULTIPLIER,
        max_colluding_clients: int = 0,
        identity: IdentitySource = None,
        rng: RngLike = None,
    ) -> None:
        self.num_classes = check_int("num_classes", num_classes, minimum=2)
        self.loss = loss
        record_l2_bound(self.num_classes, loss)  # validates loss
        self._policy = ClientPolicy(
            min_noise_multiplier=min_noise_multiplier, max_colluding_clients=max_colluding_clients, identity=identity
        )
        self.min_noise_multiplier = self._policy.floor
        self.max_colluding_clients = self._policy.colluders
        self._rng = RngSource(rng)

    def train(self, msg: Message, context: Context, features: np.ndarray, labels: np.ndarray) -> Message:
        """The reply to one protocol stage (only the protocol's records)."""
        if msg.metadata.message_type != MessageType.TRAIN or RECORD not in msg.content:
            raise ValueError(
                "SecureObjectiveTrainer answers SecureObjectiveSum's secure-aggregation train "
                "messages only; this message carries no protocol record"
            )
        floor, colluders, identity = self._policy.resolve(context)
        return answer_message(
            msg,
            context,
            lambda state: self._encode(msg, state, features, labels, floor),
            min_colluders=colluders,
            identity=identity,
        )

    def _encode(
        self, msg: Message, state: ConfigRecord, features: np.ndarray, labels: np.ndarray, floor: float
    ) -> np.ndarray:
        params, share = objective_params_from_record(msg.content[RECORD], int(state["bits"]))
        if (params.num_classes, params.loss) != (self.num_classes, self.loss):
            raise ProtocolError(
                f"the server's head (c={params.num_classes}, loss={params.loss!r}) is not this "
                f"client's (c={self.num_classes}, loss={self.loss!r})"
            )
        stats = quadratic_statistics(features, labels, num_classes=self.num_classes, loss=self.loss)
        if stats.dim != params.dim:
            raise ProtocolError(f"the server expects fm-dim = {params.dim} features, this client has {stats.dim}")
        sensitivity = integer_l2_sensitivity(params.scale, params.length, record_l2_bound(self.num_classes, self.loss))
        check_noise_floor(state, share, sensitivity, floor)
        return encode_objective(stats, params, local_noise_variance=share, rng=self._rng())


__all__ = ["OBJECTIVE_FIELDS", "SecureObjectiveTrainer", "objective_params_from_record"]
