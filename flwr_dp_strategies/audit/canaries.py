r"""Canary clients: a one-shot empirical privacy estimate of a federated run (Andrew et al., ICLR 2024).

Andrew, Kairouz, Oh, Oprea, McMahan, Suriyakumar, "One-shot Empirical Privacy Estimation for
Federated Learning" (ICLR 2024), Algorithms 1 and 2. In the *same* run that trains the model,
k canary clients take part; canary i always answers with the direction :math:`c_i` (a random unit
vector of the model's dimension d, reproducible from ``seed`` and the canary's node id) scaled to ``canary_norm``. After
the run, the cosine of each canary with the model's change is a score; k further *unseen* canaries,
never inserted, give the scores' null distribution. Because independent random directions in high
dimension are nearly orthogonal, the k canaries do not interfere with each other, so k samples of
"with this client" and k of "without it" come from a single run.

Threat model (what the numbers are about). A canary is a worst-case client: its update is a fixed
direction, known in advance, of norm at least the clipping norm C (default ``10·C``: the release clips
it to exactly C), so it has the largest influence any client can have on the release and no other
update is correlated with it. The estimate is ε of *that* client under the release actually run
(the real sampling, clipping, noise, secure aggregation and client mods, not the accountant's model
of them); an adversary sees either the final model (``final``, Algorithm 1) or every round's
model (``all-iterates``, Algorithm 2: the per-canary score is the max over rounds of the cosine with
that round's model delta). Canaries are offered to the strategy as ordinary nodes
(:class:`CanaryGrid`), so they are sampled exactly as clients: with Poisson sampling each canary is
in a round's sample with probability q, with fixed-size sampling they compete for the m slots.

What it costs. k extra clients: with fixed-size sampling they take slots (and their clipped updates
enter the average) as k extra clients would; with Poisson sampling of expected size m over N nodes
the population becomes N + k (q = m/(N + k) unless ``num_clients`` is given). A canary sampled for
evaluation answers with an error reply (it has no data), which every strategy skips as a failed reply:
the published evaluation means are the real clients' alone. To leave the real model untouched, run the audit as a separate *rehearsal* with the
same configuration (same strategy settings, same mods, same number of rounds) on the real or a proxy
federation, and train the real model without canaries.

Statistics (:mod:`flwr_dp_strategies.privacy.analyses.audit`). The estimate
(:func:`~flwr_dp_strategies.privacy.analyses.audit.estimate_epsilon`) fits a Gaussian to the inserted canaries' scores
and one to the k unseen canaries' scores and reports the ε at which the two Gaussians are
(ε, δ)-indistinguishable; it is an estimate, neither a bound nor conservative. Two lower bounds, each for the
final model and for all iterates, hold together with probability ``confidence``:
:func:`~flwr_dp_strategies.privacy.analyses.audit.epsilon_lower_bound` (Clopper–Pearson counts on the best threshold
test; no assumption on the scores' shape, but with k canaries it cannot exceed about log k − 2.5) and
:func:`~flwr_dp_strategies.privacy.analyses.audit.shift_lower_bound` (the same test under the additive-shift model:
an inserted canary's cosine is the exact null law shifted by its contribution, whatever the noise, so the
false-positive rate is exact and the true-positive rate follows from a confidence limit on the mean shift; it
is limited by the signal, not by k). Both treat the k canaries' scores as independent trials, which the
near-orthogonality of random directions makes approximately true (Andrew et al.'s argument), not exactly.

What it is not. The figures are about the canary client in this run only. None replaces the
ledger's ε, an upper bound for every client under the accountant's model. A lower bound *above*
the ledger's ε means the release is leakier than booked: a bug or a misconfiguration (a client
without its mod, a noise multiplier set wrong); the audit then logs a WARNING and sets
``AuditReport.alarm``.
"""

from __future__ import annotations

import copy
import math
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any, Optional
from uuid import uuid4

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.logger import log
from flwr.serverapp import Grid

from ..rounds.streaming_aggregation import single_threaded_blas

CANARY_ID_BASE = 2**62
"""Canary i has node id ``CANARY_ID_BASE + i`` (inserted: i < k; unseen: k ≤ i < 2k). Flower's node ids
are random 63-bit integers drawn by the SuperLink; the audit refuses to run if a real node id falls in
``[CANARY_ID_BASE, CANARY_ID_BASE + 2k)``."""
DEFAULT_CANARY_NORM_FACTOR = 10.0
"""``canary_norm`` default: this times the strategy's ``clipping_norm`` (the paper's canaries exceed C)."""
CANARY_EVALUATE_REASON = "a canary client takes no part in evaluation"
CHUNK = 64  # canary vectors generated at a time when scoring (memory: CHUNK·d floats)

Direction = Callable[[int, int], np.ndarray]  # (canary node id, d) -> unit vector of length d


def flatten_arrays(arrays: ArrayRecord) -> np.ndarray:
    """The arrays' values as one float64 vector, keys in the record's order (the canaries' coordinates)."""
    parts = [np.asarray(arr.numpy(), dtype=np.float64).ravel() for arr in arrays.values()]
    return np.concatenate(parts) if parts else np.zeros(0)


def add_direction(arrays: ArrayRecord, vector: np.ndarray, scale: float) -> ArrayRecord:
    """``arrays + scale · vector``, the vector reshaped over the arrays' keys in order, each in its dtype."""
    out, offset = {}, 0
    for key, arr in arrays.items():
        values = arr.numpy()
        part = vector[offset : offset + values.size].reshape(values.shape)
        out[key] = Array((values.astype(np.float64) + scale * part).astype(values.dtype))
        offset += values.size
    if offset != vector.size:
        raise ValueError(f"the canary vector has {vector.size} coordinates, the model {offset}")
    return ArrayRecord(out)


def canary_client_app(
    direction: Direction, canary_norm: float, *, mods: Sequence[Any] = (), weighted_by_key: str = "num-examples"
) -> ClientApp:
    """The ClientApp every canary node runs, behind ``mods`` (the real clients' mods, e.g. ``distributed_dp_mod``).

    Train: replies with the received arrays + ``canary_norm · direction(node_id, d)`` (d = the model's size) and a
    MetricRecord ``{weighted_by_key: 1}``. Evaluate: a MetricRecord ``{weighted_by_key: 1}`` (what the screening of
    :mod:`flwr_dp_strategies.rounds.reply_screening` needs: one MetricRecord with a valid weight), for an app run
    outside :class:`CanaryGrid`, which never hands it an evaluate message (a canary's evaluate reply is an error).
    """
    app = ClientApp(mods=list(mods))

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        records = [r for r in msg.content.values() if isinstance(r, ArrayRecord)]
        if len(records) != 1:
            raise ValueError(f"a canary expects one ArrayRecord in a train message, got {len(records)}")
        arrays = records[0]
        dim = sum(int(np.prod(arr.shape)) for arr in arrays.values())
        vector = direction(int(context.node_id), dim)
        content = RecordDict(
            {"arrays": add_direction(arrays, vector, canary_norm), "metrics": MetricRecord({weighted_by_key: 1})}
        )
        return Message(content, reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"metrics": MetricRecord({weighted_by_key: 1})}), reply_to=msg)

    return app


class CanaryGrid(Grid):
    """A Grid proxy: the real nodes plus the canary nodes, whose messages are run in process by ``app``.

    ``get_node_ids()`` is the real grid's nodes followed by ``canary_ids``. Messages to a real node go to the real
    grid unchanged; a message to a canary never does: it gets a message id (a fresh UUID, as the SuperLink sets),
    a deep copy of it is handed to ``app`` with the canary's own :class:`Context` (kept for the whole run, so
    stateful client mods such as secure aggregation work across stages), and the reply is given the SuperLink's
    metadata (a message id, ``reply_to_message_id`` = the instruction's id, ``src_node_id`` = the canary). An app
    that raises answers with an error reply, as a SuperNode whose ClientApp failed.

    The proxy records, per round, the global model: the ArrayRecord of the first train message of that round that
    holds one (:attr:`models`, flattened float64, in the order sent), and which canaries were sent a train message
    (:attr:`canary_participation`). A round is a ``group_id`` when the messages have one, else one
    ``send_and_receive`` / ``push_messages`` call of train messages (keys ``batch-<n>``).
    """

    def __init__(self, grid: Grid, canary_ids: Iterable[int], app: ClientApp, *, run_id: int = 0) -> None:
        self.grid = grid
        self.canary_ids = [int(n) for n in canary_ids]
        self._canaries = set(self.canary_ids)
        self.app = app
        self.contexts = {
            n: Context(run_id=run_id, node_id=n, node_config={}, state=RecordDict(), run_config={})
            for n in self.canary_ids
        }
        self.models: dict[str, np.ndarray] = {}
        self.canary_participation: dict[str, set[int]] = {}
        self.canary_errors: list[str] = []
        self._pending: dict[str, Message] = {}
        self._delivered: set[str] = set()  # ids of the instructions run in process
        self._batches = 0

    # ------------------------------------------------------------------ Grid
    def set_run(self, run: Any) -> None:
        self.grid.set_run(run)

    @property
    def run(self) -> Any:
        return self.grid.run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: Optional[float] = None
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> list[int]:
        real = [int(n) for n in self.grid.get_node_ids()]
        clash = self._canaries.intersection(real)
        if clash:
            raise RuntimeError(f"real node ids {sorted(clash)[:3]} collide with canary ids")
        return real + list(self.canary_ids)

    def get_nodes(self) -> Any:
        return self.grid.get_nodes()  # type: ignore[attr-defined]

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        real, ids = [], []
        messages = list(messages)
        self._observe(messages)
        for msg in messages:
            if int(msg.metadata.dst_node_id) in self._canaries:
                ids.append(self._deliver(msg))
            else:
                real.append(msg)
        if real:
            ids.extend(self.grid.push_messages(real))
        return ids

    def pull_messages(
        self, reply_to_message_ids: Optional[Iterable[str]] = None, *, message_ids: Optional[Iterable[str]] = None
    ) -> list[Message]:
        """The replies to the instructions ``reply_to_message_ids`` (Flower 1.43's name; ``message_ids=``, the name
        of Flower 1.41-1.42, is accepted too); None: every reply not yet pulled (1.43: no filter)."""
        wanted = reply_to_message_ids if reply_to_message_ids is not None else message_ids
        if wanted is None:
            replies = list(self._pending.values())
            self._pending.clear()
            return replies + list(self.grid.pull_messages())
        ids = list(wanted)
        replies = [self._pending.pop(i) for i in ids if i in self._pending]
        real = [i for i in ids if i not in self._delivered]
        if real:
            replies.extend(self.grid.pull_messages(real))  # positional: the instructions' ids in every version
        return replies

    def send_and_receive(self, messages: Iterable[Message], *, timeout: Optional[float] = None) -> list[Message]:
        real, replies = [], []
        messages = list(messages)
        self._observe(messages)
        for msg in messages:
            if int(msg.metadata.dst_node_id) in self._canaries:
                replies.append(self._pending.pop(self._deliver(msg)))
            else:
                real.append(msg)
        if real:
            replies = list(self.grid.send_and_receive(real, timeout=timeout)) + replies
        return replies

    # ------------------------------------------------------------------ in process
    def _deliver(self, msg: Message) -> str:
        """Run a canary's ClientApp on ``msg``; the instruction's message id (its reply is kept until pulled)."""
        message_id = str(uuid4())
        msg.metadata.__dict__["_message_id"] = message_id
        node = int(msg.metadata.dst_node_id)
        from flwr.app import Error

        if msg.metadata.message_type.startswith(MessageType.EVALUATE):
            # a canary has no data: its reply must not enter the published evaluation means (nor dilute them), so
            # it answers as a node that cannot evaluate; the strategy skips it as a failed reply (server log only)
            reply = Message(Error(code=0, reason=CANARY_EVALUATE_REASON), reply_to=msg)
        else:
            try:
                reply = self.app(copy.deepcopy(msg), self.contexts[node])
            except Exception as err:  # noqa: BLE001 - a failed ClientApp becomes an error reply, as in Flower
                self.canary_errors.append(f"{node}: {err}")
                reply = Message(Error(code=0, reason=str(err)), reply_to=msg)
        reply.metadata.__dict__["_message_id"] = str(uuid4())
        reply.metadata.__dict__["_reply_to_message_id"] = message_id
        reply.metadata.__dict__["_src_node_id"] = node
        reply.metadata.__dict__["_dst_node_id"] = int(msg.metadata.src_node_id)
        self._pending[message_id] = reply
        self._delivered.add(message_id)
        return message_id

    def _observe(self, messages: list[Message]) -> None:
        """Record the round's model and the canaries asked to train, from one batch of instructions.

        A round is the messages' ``group_id`` when set (the secure-aggregation stages of one round share it), else
        the batch (Flower's FedAvg leaves ``group_id`` empty and sends a round's train instructions in one call)."""
        train = [m for m in messages if m.metadata.message_type.split(".")[0] == MessageType.TRAIN]
        if not train:
            return
        self._batches += 1
        for msg in train:
            group = str(msg.metadata.group_id) or f"batch-{self._batches}"
            if int(msg.metadata.dst_node_id) in self._canaries:
                self.canary_participation.setdefault(group, set()).add(int(msg.metadata.dst_node_id))
            if group not in self.models:
                records = [r for r in msg.content.values() if isinstance(r, ArrayRecord)]
                if len(records) == 1:
                    self.models[group] = flatten_arrays(records[0])


@dataclass
class AuditReport:
    """What :meth:`CanaryAudit.start` measured (ε at ``delta``; the estimates are Andrew et al. 2024's Gaussian fit).

    Four lower bounds, which hold *together* with probability ≥ ``confidence`` (each is computed at error
    (1 − confidence)/4, Bonferroni): ``epsilon_lower_bound_*`` (Clopper–Pearson counts, no assumption on the
    scores' shape) and ``shift_lower_bound_*`` (the additive-shift model: the inserted cosine is the exact null
    law shifted by the canary's contribution, whatever the noise). ``alarm``: one of them exceeds
    ``ledger_epsilon``; for a correctly booked run that happens with probability ≤ 1 − confidence.
    ``shift_lower_bound_all_iterates`` scores each canary against Σₜ Δₜ/‖Δₜ‖² (the matched filter of the
    per-round deltas, :meth:`CanaryAudit.exposures`), whose null is exact too; the estimate and the count bound
    use the max over rounds (Andrew et al.'s Algorithm 2).
    """

    epsilon_estimate_final: float
    epsilon_estimate_all_iterates: float
    epsilon_lower_bound_final: float
    epsilon_lower_bound_all_iterates: float
    confidence: float
    delta: float
    ledger_epsilon: float
    num_canaries: int
    seed: int
    alarm: bool = False
    shift_lower_bound_final: float = 0.0
    shift_lower_bound_all_iterates: float = 0.0
    inserted_final: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    null_final: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    inserted_all_iterates: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    null_all_iterates: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)

    def metric_record(self) -> MetricRecord:
        """The figures as a MetricRecord (floats; ``audit/alarm`` is 1.0 or 0.0)."""
        return MetricRecord(
            {
                "audit/epsilon-estimate/final": float(self.epsilon_estimate_final),
                "audit/epsilon-estimate/all-iterates": float(self.epsilon_estimate_all_iterates),
                "audit/epsilon-lower-bound/final": float(self.epsilon_lower_bound_final),
                "audit/epsilon-lower-bound/all-iterates": float(self.epsilon_lower_bound_all_iterates),
                "audit/epsilon-lower-bound-shift/final": float(self.shift_lower_bound_final),
                "audit/epsilon-lower-bound-shift/all-iterates": float(self.shift_lower_bound_all_iterates),
                "audit/ledger-epsilon": float(self.ledger_epsilon),
                "audit/alarm": 1.0 if self.alarm else 0.0,
            }
        )


class CanaryAudit:
    """Run ``strategy`` with ``num_canaries`` canary clients and estimate ε empirically (module docstring).

    Not a Flower ``Strategy``: it wraps one and drives its ``start`` through a :class:`CanaryGrid`.

    Args:
        strategy: any strategy of this package (it must have ``.ledger``; the canaries go through its sampling,
            screening and release as real clients do).
        num_canaries: k ≥ 1 inserted canaries (and k unseen ones for the null distribution).
        canary_norm: the canary update's L2 norm; default ``10 × strategy.clipping_norm`` (clipped to C by the
            release). Required (ValueError naming it) for a strategy without ``clipping_norm``.
        canary_mods: the client mods the canaries run, the same as the real clients' (``distributed_dp_mod`` with
            distributed DP: the canary then adds its noise share and joins secure aggregation).
        seed: the canaries' seed (default: 63 bits of OS entropy, kept in the report to regenerate the vectors).
        confidence: of the lower bounds, in (0, 1).
        delta: δ of every ε reported (default ``strategy.ledger.target_delta``).
    """

    def __init__(
        self,
        strategy: Any,
        *,
        num_canaries: int,
        canary_norm: Optional[float] = None,
        canary_mods: Sequence[Any] = (),
        seed: Optional[int] = None,
        confidence: float = 0.95,
        delta: Optional[float] = None,
    ) -> None:
        from flwr.serverapp.strategy import Strategy

        if not isinstance(strategy, Strategy):
            raise ValueError(f"strategy must be a Flower Strategy, got {type(strategy).__name__}")
        if getattr(strategy, "ledger", None) is None:
            raise ValueError(f"strategy must have a privacy ledger (.ledger), {type(strategy).__name__} has none")
        if isinstance(num_canaries, bool) or not isinstance(num_canaries, int) or num_canaries < 1:
            raise ValueError(f"num_canaries must be an integer >= 1, got {num_canaries!r}")
        if canary_norm is None:
            clipping_norm = getattr(strategy, "clipping_norm", None)
            if clipping_norm is None:
                raise ValueError(
                    f"canary_norm is required: {type(strategy).__name__} has no clipping_norm to derive it from"
                )
            canary_norm = DEFAULT_CANARY_NORM_FACTOR * float(clipping_norm)
        if (
            isinstance(canary_norm, bool)
            or not isinstance(canary_norm, (int, float))
            or not math.isfinite(canary_norm)
            or canary_norm <= 0
        ):
            raise ValueError(f"canary_norm must be a finite number > 0, got {canary_norm!r}")
        if seed is None:
            seed = secrets.randbits(63)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be None or an integer >= 0, got {seed!r}")
        if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
        if delta is None:
            delta = strategy.ledger.target_delta
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
            raise ValueError(f"delta must be None or in (0, 1), got {delta!r}")
        self.strategy = strategy
        self.num_canaries = num_canaries
        self.canary_norm = float(canary_norm)
        self.canary_mods = tuple(canary_mods)
        self.seed = int(seed)
        self.confidence = float(confidence)
        self.delta = float(delta)
        self.inserted_ids = [CANARY_ID_BASE + i for i in range(num_canaries)]
        self.unseen_ids = [CANARY_ID_BASE + num_canaries + i for i in range(num_canaries)]
        self.grid: Optional[CanaryGrid] = None
        self.report: Optional[AuditReport] = None

    # ------------------------------------------------------------------ canaries
    def vectors(self, canary_ids: Sequence[int], dim: int) -> np.ndarray:
        """The unit canary vectors of ``canary_ids`` (rows), reproducible from ``(seed, id)``."""
        from ..privacy.analyses.audit import canary_vectors

        return np.asarray(canary_vectors(list(canary_ids), dim, self.seed), dtype=np.float64)

    def direction(self, canary_id: int, dim: int) -> np.ndarray:
        """One canary's unit vector (what its ClientApp adds, times ``canary_norm``)."""
        return self.vectors([canary_id], dim)[0]

    def make_grid(self, grid: Grid) -> CanaryGrid:
        """The proxy :meth:`start` hands the strategy."""
        inner = getattr(self.strategy, "strategy", self.strategy)
        key = getattr(inner, "weighted_by_key", "num-examples")
        app = canary_client_app(self.direction, self.canary_norm, mods=self.canary_mods, weighted_by_key=key)
        try:
            run_id = int(grid.run.run_id)
        except Exception:  # noqa: BLE001 - a grid without a run (tests): any run id
            run_id = 0
        return CanaryGrid(grid, self.inserted_ids, app, run_id=run_id)

    # ------------------------------------------------------------------ the run
    def start(
        self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600, **kwargs: Any
    ) -> tuple[Any, AuditReport]:
        """``strategy.start(CanaryGrid(grid, ...), initial_arrays, num_rounds, timeout, **kwargs)`` (``train_config``,
        ``evaluate_config``, ``evaluate_fn`` pass through), then the audit; returns ``(result, report)`` (the report
        is also :attr:`report`; :meth:`AuditReport.metric_record` gives it as a MetricRecord). The result's round
        keys are the strategy's own: nothing of the audit is written into them."""
        self.grid = self.make_grid(grid)
        result = self.strategy.start(self.grid, initial_arrays, num_rounds=num_rounds, timeout=timeout, **kwargs)
        final = result.arrays if len(result.arrays) else initial_arrays
        self.report = self.audit(flatten_arrays(initial_arrays), self.iterates(initial_arrays), flatten_arrays(final))
        log_report(self.report)
        return result, self.report

    def iterates(self, initial_arrays: ArrayRecord) -> list[np.ndarray]:
        """The models of the run in order: the initial model, then each round's model as sent to clients (a model
        equal to the one before it, e.g. round 1's, is left out: no release happened in between)."""
        assert self.grid is not None
        out = [flatten_arrays(initial_arrays)]
        for model in self.grid.models.values():
            if model.size == out[0].size and not np.array_equal(model, out[-1]):
                out.append(model)
        return out

    def scores(self, deltas: Sequence[np.ndarray], canary_ids: Sequence[int]) -> np.ndarray:
        """``(len(deltas), len(canary_ids))`` cosines of each canary with each model delta (0 for a zero delta)."""
        from ..privacy.analyses.audit import canary_cosines

        dim = deltas[0].size
        out = np.zeros((len(deltas), len(canary_ids)))
        for start in range(0, len(canary_ids), CHUNK):
            chunk = canary_ids[start : start + CHUNK]
            vectors = self.vectors(chunk, dim)
            for t, delta in enumerate(deltas):
                if np.linalg.norm(delta) > 0:
                    out[t, start : start + len(chunk)] = np.asarray(canary_cosines(delta, vectors), dtype=np.float64)
        return out

    def exposures(self, final: np.ndarray) -> Optional[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """Per training round (in the order the grid saw them): the release Δₜ (the next round's model, or the
        final one, minus this round's) and the inserted canaries asked to train in it. Returns the number of
        rounds with a release, the matched filter V = Σₜ Δₜ/‖Δₜ‖², and each inserted canary's exposure in the
        final model (rounds taken part in) and in V (Σ over its rounds of 1/‖Δₜ‖²); None when a round's model
        was not seen (a strategy that sends no ArrayRecord)."""
        assert self.grid is not None
        groups = list(self.grid.models)
        if not groups:
            return None
        models = [self.grid.models[g] for g in groups] + [final]
        if any(m.shape != final.shape for m in models):
            return None
        index = {cid: i for i, cid in enumerate(self.inserted_ids)}
        matched = np.zeros_like(final)
        expo_final = np.zeros(len(self.inserted_ids))
        expo_matched = np.zeros(len(self.inserted_ids))
        rounds = 0
        for j, group in enumerate(groups):
            step = models[j + 1] - models[j]
            energy = float(step @ step)
            if energy == 0.0:
                continue  # no release between these models
            rounds += 1
            matched += step / energy
            members = [index[c] for c in self.grid.canary_participation.get(group, ()) if c in index]
            expo_final[members] += 1.0
            expo_matched[members] += 1.0 / energy
        return rounds, matched, expo_final, expo_matched

    @single_threaded_blas  # the ServerApp shares the cores with the clients: one BLAS thread (8x faster when busy)
    def audit(self, initial: np.ndarray, iterates: Sequence[np.ndarray], final: np.ndarray) -> AuditReport:
        """The report of a run with these models (``iterates``: initial, then every later round's model)."""
        from ..privacy.analyses.audit import epsilon_lower_bound, estimate_epsilon, shift_lower_bound

        models = list(iterates) + [final]
        steps = [b - a for a, b in zip(models[:-1], models[1:])]
        final_delta = [final - initial]
        inserted_final = self.scores(final_delta, self.inserted_ids)[0]
        null_final = self.scores(final_delta, self.unseen_ids)[0]
        inserted_all = self.scores(steps, self.inserted_ids).max(axis=0)
        null_all = self.scores(steps, self.unseen_ids).max(axis=0)
        ledger_epsilon = float(self.strategy.ledger.epsilon(delta=self.delta))
        estimate_final = estimate_epsilon(inserted_final, null_final, self.delta).epsilon
        estimate_all = estimate_epsilon(inserted_all, null_all, self.delta).epsilon
        level = 1.0 - (1.0 - self.confidence) / 4.0  # four bounds, valid together at ``confidence``
        bound_final = epsilon_lower_bound(inserted_final, null_final, self.delta, confidence=level).epsilon
        bound_all = epsilon_lower_bound(inserted_all, null_all, self.delta, confidence=level).epsilon
        shift_final = shift_all = 0.0
        exposures = self.exposures(final)
        if exposures is not None and self.num_canaries >= 3:
            rounds, matched, expo_final, expo_matched = exposures
            dim = int(initial.size)
            if np.any(expo_final > 0):
                shift_final = shift_lower_bound(inserted_final, self.delta, level, dim=dim, exposure=expo_final).epsilon
                inserted_matched = self.scores([matched], self.inserted_ids)[0]
                shift_all = shift_lower_bound(
                    inserted_matched, self.delta, level, dim=dim, exposure=expo_matched
                ).epsilon
        alarm = max(bound_final, bound_all, shift_final, shift_all) > ledger_epsilon
        return AuditReport(
            float(estimate_final),
            float(estimate_all),
            float(bound_final),
            float(bound_all),
            self.confidence,
            self.delta,
            ledger_epsilon,
            self.num_canaries,
            self.seed,
            alarm,
            float(shift_final),
            float(shift_all),
            inserted_final,
            null_final,
            inserted_all,
            null_all,
        )


def log_report(report: AuditReport) -> None:
    """The summary block (INFO), and the WARNING when a lower bound exceeds the ledger's ε."""
    pct = f"{100 * report.confidence:g}%"
    log(
        INFO,
        "Canary audit (Andrew et al. 2024), %d canaries, seed %d, delta=%g:",
        report.num_canaries,
        report.seed,
        report.delta,
    )
    log(INFO, "\t├──> ledger epsilon: %.4f", report.ledger_epsilon)
    log(
        INFO,
        "\t├──> epsilon estimate: final model %.4f, all iterates %.4f",
        report.epsilon_estimate_final,
        report.epsilon_estimate_all_iterates,
    )
    log(
        INFO,
        "\t├──> epsilon lower bounds (all four together at %s confidence): counts (Clopper-Pearson) final model "
        "%.4f, all iterates %.4f; shift model final model %.4f, all iterates %.4f",
        pct,
        report.epsilon_lower_bound_final,
        report.epsilon_lower_bound_all_iterates,
        report.shift_lower_bound_final,
        report.shift_lower_bound_all_iterates,
    )
    log(
        INFO,
        "\t└──> the audit gives an estimate and a lower bound for a worst-case canary client in this run, "
        "never a replacement for the ledger's epsilon",
    )
    if report.alarm:
        log(
            WARNING,
            "Canary audit: a lower bound on epsilon (%.4f) exceeds the ledger's epsilon (%.4f): the release "
            "leaks more than booked; a bug or misconfiguration is likely (a client without its mod, a noise "
            "multiplier set wrong)",
            max(
                report.epsilon_lower_bound_final,
                report.epsilon_lower_bound_all_iterates,
                report.shift_lower_bound_final,
                report.shift_lower_bound_all_iterates,
            ),
            report.ledger_epsilon,
        )


def plot_audit(report: AuditReport, path: Any) -> None:
    """Histograms of the inserted vs null (unseen) canary cosines, final model and all iterates, saved to ``path``;
    the titles hold the ledger's ε, the estimates and the largest lower bound of each kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (name, inserted, null, estimate) in zip(
        axes,
        [
            ("final model", report.inserted_final, report.null_final, report.epsilon_estimate_final),
            (
                "all iterates (max over rounds)",
                report.inserted_all_iterates,
                report.null_all_iterates,
                report.epsilon_estimate_all_iterates,
            ),
        ],
    ):
        values = np.concatenate([inserted, null]) if inserted.size + null.size else np.zeros(1)
        bins = np.linspace(values.min(), values.max() + 1e-12, 30)
        ax.hist(null, bins=bins, alpha=0.6, label="unseen (null)")
        ax.hist(inserted, bins=bins, alpha=0.6, label="inserted")
        ax.set_title(f"{name}: ε estimate {estimate:.3g}")
        ax.set_xlabel("cosine with model delta")
        ax.legend()
    fig.suptitle(
        f"Canary audit: ledger ε {report.ledger_epsilon:.3g}, δ={report.delta:g}, {report.num_canaries} canaries; "
        f"lower bounds ({100 * report.confidence:g}% together): shift "
        f"{max(report.shift_lower_bound_final, report.shift_lower_bound_all_iterates):.3g}, counts "
        f"{max(report.epsilon_lower_bound_final, report.epsilon_lower_bound_all_iterates):.3g}"
        + (" — ALARM" if report.alarm else ""),
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


__all__ = [
    "AuditReport",
    "CANARY_ID_BASE",
    "CanaryAudit",
    "CanaryGrid",
    "DEFAULT_CANARY_NORM_FACTOR",
    "add_direction",
    "canary_client_app",
    "flatten_arrays",
    "log_report",
    "plot_audit",
]
