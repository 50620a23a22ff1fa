r"""SignDS with MagRR step-size tracking: a FedAvg whose clients upload a few indices and a sign.

Per round (MindSpore spec §2–3):

1. ``configure_train`` sends FedAvg's message plus the SignDS parameters and the
   current MagRR state (``signds-r-est``, ``signds-is-reached``, ...) in the
   train config; :func:`client_mods.signds_mod` encodes each update with them.
2. ``aggregate_train`` (the accounted round,
   :class:`~flwr_dp_strategies.rounds.template.AccountedRound`) screens every reply through the
   package's one screening path (:mod:`flwr_dp_strategies.rounds.reply_screening`, rejected and
   counted, the round goes on): identity, a finite weight in (0, ``max_weight``], finite metrics, exactly the
   ArrayRecord keys ``indices``, ``sign``, ``b-hat``; payloads no larger than
   ``max_dim_out`` int64 indices and one value each (``oversized``); integer
   indices (any width, signed or not: range-checked in their own dtype before any
   cast, so no wrap-around), 1-D, between 1 and ``max_dim_out`` of them, in
   [0, d), strictly increasing (``indices``); a sign exactly ±1 and b̂ exactly
   0 or 1 (``values``: NaN, inf and 1.99 are refused); real dtypes only
   (``shape``). Evaluate replies are screened like every evaluate reply
   (identity, one MetricRecord, finite bounded weight, finite metrics).
3. Rebuild and average: with :math:`g = ` ``step_ratio``·N·r_est (N the number of
   clients asked this round), client i's dense update is :math:`g s_i 1_{J_i}` and
   the new model is :math:`w + \sum_i n_i g s_i 1_{J_i} / \sum_i n_i`, summed in
   place into one float64 buffer by fancy-index addition (the screened indices
   are strictly increasing, hence distinct; no dense per-client vector is built,
   uploads and the current model are read zero-copy).
4. MagRR (:func:`flwr_dp_strategies.signds.update_state`) updates r_est and the
   phase from the received b̂ for the next round, or falls back to
   ``sign_global_lr`` if fewer than 5 % of N sent a bit.

Privacy (local DP, per client and round): the index set is ε-LDP with ε =
``sign_eps`` and b̂ is ε_rr-LDP (randomized response), composed in the ledger
(relation ``replace_one``: any two updates are neighbours). The server books at
least what it configured (issue 16, D7): ``round_event(sign_eps, rr_epsilon)``
for every upload it receives from a node it asked, declared or not. A
declaration equal to that event is booked once; any other declaration (smaller,
such as ``NoOpDpEvent``, or larger) is booked *in addition* to the configured
event, so a client can never lower its ε below what the server asked for. An
upload that declares nothing and is rejected is booked as ``NonPrivateDpEvent``
(its content reached the server but is not SignDS's encoding). MindSpore's
default (ε = 100, ε_rr = 5) spends 105 per round.

Round metrics: ``signds/r-est-used`` and ``signds/step`` (this round's),
``signds/r-est`` and ``signds/is-reached`` (after MagRR: the next round's),
``signds/majority``, ``signds/debiased-ones`` (absent in a fallback round), ``signds/fallback``,
``signds/values-per-client``, ``signds/payload-bytes-per-client`` (the arrays),
``signds/bytes-per-client`` (as serialised, .npy headers included),
``signds/dense-values``, plus ``privacy/*``. Replies of SuperNodes that died mid-round
and rejected uploads are counted in the server's log only (never in the metrics),
nothing is booked for a failed one, the round goes on with the others.

Step size. As in MindSpore, ``sign_global_lr`` is used only by the fallback; the
global step is ``magrr.step_ratio``·N·r_est. A vote moves a coordinate that is
consistently in the top-k by about step_ratio·N·E[v]/(2K) times FedAvg's move
(E[v] indices per client from the top-k set of size K): ≈ 1.5 for the seed's
LeNet, but ≫ 1 for small models (137 for a 2 410-parameter MLP with the
defaults), where MagRR's growth phase then feeds back and diverges. Lower
``step_ratio`` / ``initial_r_est``, or fix ``sign_dim_out``, for small models
(``examples/signds`` gives settings that match FedAvg within 1 point).
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import WARNING
from typing import Any, Optional, Unpack

import numpy as np
from dp_accounting.dp_event import NonPrivateDpEvent
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from ..rounds.options import AccountingOptions
from ..declarations import Declaration
from ..privacy.accounting.events import event_key
from ..signds import MAX_DIM_OUT, MagRRConfig, MagRRState, SignDSParams, check_global_lr, round_event, step_size
from ..signds import update_state
from ..privacy.validation import check_int
from ..rounds.client_accounting import ContentCheck
from ..rounds.metrics import aggregate_reply_metrics
from .accounted_fedavg import MetricsAggregationFn, fedavg_arguments
from ..rounds.reply_screening import check_weight, records_of, reply_arrays, reply_weight
from ..rounds.streaming_aggregation import npy_view, to_array
from ..rounds.template import AccountedRound, Booking, RoundRelease, Screened
from ..wire import SIGNDS_CONFIG_KEYS, SIGNDS_EVENT_LABEL

UPLOAD_KEYS = ("indices", "sign", "b-hat")
EVENT_LABEL = SIGNDS_EVENT_LABEL
NON_PRIVATE_LABEL = "signds/rejected-undeclared (non-private)"
HEADER_ALLOWANCE = 1024  # bytes of .npy header tolerated beyond a payload's largest valid size


class SignDS(AccountedRound, FedAvg):
    """SignDS + MagRR on Flower's FedAvg; clients must run :func:`client_mods.signds_mod`.

    Needs its client counterpart: every ClientApp adds ``client_mods.signds_mod`` to its train
    function (``@app.train(mods=[signds_mod])``), which replaces the trained weights by the SignDS
    upload. Without it no reply is usable and the model never changes: the first such round logs
    one WARNING saying so.

    Arguments: FedAvg's (``fraction_train`` ... ``evaluate_metrics_aggr_fn``, in FedAvg's order and
    meaning), then keyword-only: the SignDS parameters (domains as MindSpore), ``max_dim_out``
    (most indices a client may send), ``magrr`` (MagRR constants), and the accounting options
    (:class:`~flwr_dp_strategies.rounds.options.AccountingOptions`).
    """

    # pylint: disable=too-many-arguments,too-many-locals
    def __init__(
        self,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: Optional[MetricsAggregationFn] = None,
        evaluate_metrics_aggr_fn: Optional[MetricsAggregationFn] = None,
        *,
        sign_k: float = 0.01,
        sign_eps: float = 100.0,
        sign_thr_ratio: float = 0.6,
        sign_global_lr: float = 0.1,
        sign_dim_out: int = 0,
        max_dim_out: int = MAX_DIM_OUT,
        magrr: MagRRConfig = MagRRConfig(),
        **accounting: Unpack[AccountingOptions],
    ) -> None:
        super().__init__(**fedavg_arguments(locals()))
        self.params = SignDSParams(sign_k, sign_eps, sign_thr_ratio, sign_dim_out)
        self.sign_global_lr = check_global_lr(sign_global_lr)
        self.max_dim_out = check_int("max_dim_out", max_dim_out, minimum=1)
        self.magrr = magrr
        self.state = MagRRState(r_est=magrr.initial_r_est)
        self.init_accounted_round(
            **accounting,
        )
        self._current: Optional[ArrayRecord] = None
        self._asked = 0
        self._hinted = False  # the missing-client-mod WARNING, logged once

    # ------------------------------------------------------------------ configure
    def instruct_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """FedAvg's messages with the SignDS parameters and the MagRR state in the config."""
        config = ConfigRecord(dict(config))
        config.update(self.client_config())
        self._current = arrays
        messages = list(super().instruct_train(server_round, arrays, config, grid))
        self._asked = len(messages)
        return messages

    def client_config(self) -> dict[str, Any]:
        """The train-config entries :func:`client_mods.signds_mod` reads."""
        values = {
            "sign_k": float(self.params.sign_k),
            "sign_eps": float(self.params.sign_eps),
            "sign_thr_ratio": float(self.params.sign_thr_ratio),
            "sign_dim_out": int(self.params.sign_dim_out),
            "max_dim_out": int(self.max_dim_out),
            "r_est": float(self.state.r_est),
            "is_reached": int(self.state.is_reached),
            "rr_epsilon": float(self.magrr.rr_epsilon),
            "growth_margin": float(self.magrr.growth_margin),
            "shrink_margin": float(self.magrr.shrink_margin),
        }
        return {SIGNDS_CONFIG_KEYS[name]: value for name, value in values.items()}

    # ------------------------------------------------------------------ aggregate
    def skip_train(self, server_round: int) -> bool:
        """True before any ``configure_train`` (no model to rebuild the updates against)."""
        return self._current is None

    def train_check(self) -> Optional[ContentCheck]:
        """The SignDS upload check against the round's model (see the module docstring)."""
        assert self._current is not None
        d = int(sum(npy_view(a).size for a in self._current.values()))
        return lambda content: self._check(content, d)

    def release_train(self, server_round: int, screened: Screened) -> RoundRelease:
        """Rebuild the sign updates and average; MagRR for the next round. Bookings: the configured round event
        for each accepted upload that declared nothing, ``NonPrivateDpEvent`` for each rejected one that
        declared nothing (module docstring)."""
        assert self._current is not None
        keys = list(self._current.keys())
        current = [npy_view(self._current[k]) for k in keys]
        d = int(sum(a.size for a in current))
        accepted = screened.accepted
        if not accepted:
            self._hint_missing_mod(server_round, screened.replies, keys)
        r_est_used = self.state.r_est
        step = step_size(r_est_used, max(self._asked, 1), self.magrr)
        arrays = self._rebuild(current, keys, accepted, step) if accepted else None
        metrics = (
            aggregate_reply_metrics(self.train_metrics_aggr_fn, [r.content for r in accepted], self.weighted_by_key)
            if accepted
            else MetricRecord()
        )
        info = self._magrr_round(accepted)
        for key, value in {
            **info,
            "step": step,
            "r-est-used": r_est_used,
            "dense-values": float(d),
            **self._upload_sizes(accepted),
        }.items():
            metrics[f"signds/{key}"] = float(value)
        # the debiased count of ones and the fallback flag are functions of how many uploads arrived
        return RoundRelease(arrays, metrics, self._undeclared_bookings(screened)).keep_on_server(
            "signds/debiased-ones", "signds/fallback"
        )

    def _hint_missing_mod(self, server_round: int, replies: list[Message], model_keys: list[str]) -> None:
        """Once: say that replies carrying the model's own arrays come from clients without ``signds_mod``."""
        if self._hinted:
            return
        plain = [
            r
            for r in replies
            if not r.has_error()
            and any(set(record.keys()) == set(model_keys) for record in records_of(r.content, ArrayRecord))
        ]
        if plain:
            self._hinted = True
            log(
                WARNING,
                "SignDS: %d train replies of round %d carry the model's own arrays instead of the SignDS "
                "upload (%s), so they are rejected and the model is not updated: the ClientApps do not run "
                "client_mods.signds_mod. Add it to the train function: @app.train(mods=[signds_mod])",
                len(plain),
                server_round,
                ", ".join(UPLOAD_KEYS),
            )

    def declaration_bookings(self, node: int, declarations: list[Declaration], phase: Optional[str]) -> list[Booking]:
        """Train phase: the configured round event, once, plus any declaration that differs from it (D7)."""
        if phase != "train":
            return super().declaration_bookings(node, declarations, phase)
        event = round_event(self.params.sign_eps, self.magrr.rr_epsilon)
        configured = Booking(event, EVENT_LABEL, client=node)
        if [event_key(d.event) for d in declarations] == [event_key(event)] and declarations[
            0
        ].neighboring_relation == self.ledger.neighboring_relation:
            return [configured]
        return [configured, *super().declaration_bookings(node, declarations, phase)]

    def _check(self, content: RecordDict, d: int) -> Optional[str]:
        """A reason to reject this upload, or None (see the module docstring)."""
        array_records = records_of(content, ArrayRecord)
        if len(array_records) != 1:
            return "structure"
        reason = check_weight(content, self.weighted_by_key, self.max_weight)
        if reason is not None:
            return reason
        record = array_records[0]
        if sorted(record.keys()) != sorted(UPLOAD_KEYS):
            return "keys"
        if len(record["indices"].data) > 8 * self.max_dim_out + HEADER_ALLOWANCE or any(
            len(record[k].data) > 8 + HEADER_ALLOWANCE for k in ("sign", "b-hat")
        ):
            return "oversized"
        try:
            idx, sign, bit = (npy_view(record[k]) for k in UPLOAD_KEYS)
        except Exception:  # noqa: BLE001 - an undecodable payload is malformed
            return "shape"
        return check_upload(idx, sign, bit, d, self.max_dim_out)

    def _undeclared_bookings(self, screened: Screened) -> list[Booking]:
        """The uploads of asked nodes that declared nothing (identity-rejected and failed replies book
        nothing): a valid one still released what was asked, the configured round event; a rejected one
        reached the server raw, ``NonPrivateDpEvent``."""
        event = round_event(self.params.sign_eps, self.magrr.rr_epsilon)
        passed = {id(r) for r in screened.passed}
        bookings = []
        for reply in screened.replies:
            declarations = screened.declarations.get(id(reply))
            if declarations is None or declarations:  # not screened for content (identity, error), or declared
                continue
            node = int(reply.metadata.src_node_id)
            if id(reply) in passed:
                bookings.append(Booking(event, EVENT_LABEL, client=node))
            else:
                bookings.append(Booking(NonPrivateDpEvent(), NON_PRIVATE_LABEL, client=node))
        return bookings

    def _rebuild(self, current: list[np.ndarray], keys: list[str], accepted: list[Message], step: float) -> ArrayRecord:
        """w + g·Σ n_i s_i 1_{J_i} / Σ n_i, accumulated sparsely into one flat buffer."""
        total = np.zeros(sum(a.size for a in current), dtype=np.float64)
        weight_sum = 0.0
        for reply in accepted:
            record, weight = reply_arrays(reply), reply_weight(reply, self.weighted_by_key)
            total[npy_view(record["indices"])] += weight * float(npy_view(record["sign"])[0])  # distinct indices
            weight_sum += weight
        total *= step / weight_sum
        out, start = {}, 0
        for key, array in zip(keys, current):
            part = total[start : start + array.size].reshape(array.shape)
            np.add(part, array, out=part)  # in place, in float64
            out[key] = to_array(part.astype(array.dtype, copy=False))
            start += array.size
        return ArrayRecord(out)

    def _magrr_round(self, accepted: list[Message]) -> dict[str, float]:
        """Update r_est and the phase from this round's bits (for the next round)."""
        bits = [int(npy_view(reply_arrays(r)["b-hat"])[0]) for r in accepted]
        self.state, info = update_state(
            self.state,
            ones=sum(bits),
            total=len(bits),
            expected_participants=float(max(self._asked, 1)),
            global_lr=self.sign_global_lr,
            config=self.magrr,
        )
        return {**info, "r-est": self.state.r_est, "is-reached": float(self.state.is_reached)}

    @staticmethod
    def _upload_sizes(accepted: list[Message]) -> dict[str, float]:
        if not accepted:
            return {"values-per-client": 0.0, "bytes-per-client": 0.0, "payload-bytes-per-client": 0.0}
        records = [reply_arrays(r) for r in accepted]
        values = np.mean([sum(int(np.prod(a.shape)) for a in rec.values()) for rec in records])
        nbytes = np.mean([sum(len(a.data) for a in rec.values()) for rec in records])
        payload = np.mean([sum(npy_view(a).nbytes for a in rec.values()) for rec in records])
        return {
            "values-per-client": float(values),
            "bytes-per-client": float(nbytes),
            "payload-bytes-per-client": float(payload),
        }


def check_upload(idx: np.ndarray, sign: np.ndarray, bit: np.ndarray, d: int, max_dim_out: int) -> Optional[str]:
    """None if the upload is valid, else the reason (see the module docstring).

    Indices: 1-D, of an integer dtype (bool refused), 1..max_dim_out of them, in
    [0, d), strictly increasing. The range is checked in the indices' own dtype
    before they are cast to int64 (a uint64 above 2^63 or an int8 would otherwise
    wrap around). Sign exactly ±1, bit exactly 0 or 1, each of shape (1,) and a real dtype.
    """
    if idx.ndim != 1 or idx.dtype.kind not in "iu" or not 1 <= idx.size <= max_dim_out:
        return "shape"
    if sign.shape != (1,) or bit.shape != (1,) or sign.dtype.kind not in "iuf" or bit.dtype.kind not in "iuf":
        return "shape"
    if idx.dtype.kind == "u" and bool((idx > np.uint64(d - 1)).any()):
        return "indices"
    wide = idx.astype(np.int64)  # every remaining value fits: signed ints of any width, unsigned < d
    if bool((wide < 0).any()) or bool((wide >= d).any()) or bool((np.diff(wide) <= 0).any()):
        return "indices"
    if float(sign[0]) not in (1.0, -1.0) or float(bit[0]) not in (0.0, 1.0):
        return "values"  # NaN, inf, 1.99 compare unequal to every allowed value
    return None


_check_upload = check_upload  # former private name


__all__ = ["EVENT_LABEL", "SignDS", "UPLOAD_KEYS", "check_upload"]
