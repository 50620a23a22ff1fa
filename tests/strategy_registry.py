"""Every exported strategy, once: how to build a small instance and how to drive a round of it.

The cross-cutting suites (``test_reply_fuzz.py`` and ``fuzz_census.py``, ``test_screening.py``,
``test_failed_replies.py``, ``test_restart.py``; ``test_drop_in.py`` checks that its app covers them) draw
their strategies from :data:`REGISTRY`, and ``test_strategy_registry.py`` checks that every ``flwr.serverapp.strategy.Strategy`` subclass in
``flwr_dp_strategies.__all__`` is covered by an entry: a new strategy cannot ship outside them.

An entry knows what a valid reply looks like (:meth:`Entry.train_replies`, :meth:`Entry.evaluate_content`)
and which grid its ``configure_train`` needs: the secure-aggregation strategies run setup and key
sharing inside ``configure_train`` and the unmasking inside ``aggregate_train``, so they get a
:class:`secagg_harness.LoopbackGrid` whose nodes run the real client app (``distributed_dp_mod``,
``SecureObjectiveTrainer``), and their valid train replies are that app's answers.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg, Strategy

import flwr_dp_strategies
import flwr_dp_strategies.strategy
from client_mods.secure_objective import SecureObjectiveTrainer
from flwr_dp_strategies import (
    AccountedAdaptiveClipping,
    AccountedBandedMatrixFactorization,
    AccountedClientSideAdaptiveClipping,
    AccountedFedAvg,
    AccountedPoissonFixedClipping,
    AccountedServerSideFixedClipping,
    ClusterEvaluation,
    DistributedDpFedAvg,
    MinDivergenceExpSampling,
    NoisyObjectiveSum,
    SecureObjectiveSum,
    ShuffleAmplifiedFedAvg,
    SignDS,
)
from flwr_dp_strategies.layer_shuffler import LayerShuffler
from flwr_dp_strategies.rounds.client_metrics import AccountedMetrics
from flwr_dp_strategies.strategy.client_side_adaptive_clipping import KEY_UNCLIPPED_BIT
from flwr_dp_strategies.strategy.noisy_objective_sum import LINEAR_KEY, QUADRATIC_KEY
import loopback
from secagg_harness import TEST_FLOOR, LazyRoster, LoopbackGrid, shifting_app

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "add-a-strategy"))
from noisy_clipped_mean import NoisyClippedMean  # noqa: E402  (the worked example of docs/architecture.md)

N = 4
"""Nodes of a round (the secure-aggregation entries use :data:`N_SECURE`)."""
N_SECURE = 5
"""Nodes of a secure-aggregation round: one rejected or silent node leaves 4, above its threshold."""
FIRST_NODE = 101


def kwargs(n: int = N) -> dict:
    """FedAvg's node counts for a round of ``n`` nodes, all of them evaluated."""
    return dict(min_train_nodes=n, min_available_nodes=n, min_evaluate_nodes=n, fraction_evaluate=1.0)


def dense_model() -> ArrayRecord:
    """The model of the dense entries: two float32 arrays (8 values)."""
    return ArrayRecord({"w.a": Array(np.zeros(6, np.float32)), "v.b": Array(np.zeros(2, np.float32))})


def dense_arrays(i: int) -> ArrayRecord:
    """Node i's trained model: norm 0.255 (i + 1), below every entry's clipping norm."""
    return ArrayRecord(
        {"w.a": Array(np.full(6, 0.1 * (i + 1), np.float32)), "v.b": Array(np.full(2, -0.05 * (i + 1), np.float32))}
    )


def head_model(dim: int = 3, width: int = 2) -> ArrayRecord:
    """The model of the objective entries: a (dim, width) head."""
    return ArrayRecord({"head.weight": Array(np.zeros((dim, width)))})


def _signds_arrays(i: int) -> ArrayRecord:
    return ArrayRecord(
        {
            "indices": Array(np.array([1, 2 + i], np.int64)),
            "sign": Array(np.array([1], np.int64)),
            "b-hat": Array(np.array([i % 2], np.int64)),
        }
    )


def _objective_arrays(i: int) -> ArrayRecord:
    rng = np.random.default_rng(i)
    q = rng.normal(size=(3, 3))
    return ArrayRecord({LINEAR_KEY: Array(rng.normal(size=(3, 2))), QUADRATIC_KEY: Array(q @ q.T + np.eye(3))})


def _objective_app(nodes: list[int]) -> ClientApp:
    """Node n answers with ``SecureObjectiveTrainer(rng=n)`` on 12 records of its own."""
    app = ClientApp()
    roster = LazyRoster(len(nodes) + 8)
    trainers = {
        n: SecureObjectiveTrainer(num_classes=2, rng=n, min_noise_multiplier=TEST_FLOOR, identity=roster) for n in nodes
    }
    data = {n: (np.random.default_rng(n).normal(size=(12, 3)), np.arange(12) % 2) for n in nodes}

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        node = int(context.node_id)
        return trainers[node].train(msg, context, *data[node])

    return app


def _secure_grid(kind: str, n: int) -> LoopbackGrid:
    nodes = list(range(FIRST_NODE, FIRST_NODE + n))
    if kind == "secagg-dense":
        deltas = {node: np.linspace(-0.1, 0.1, 8) * (1 + i) for i, node in enumerate(nodes)}
        return LoopbackGrid(shifting_app(deltas, rng=5), nodes)
    return LoopbackGrid(_objective_app(nodes), nodes)


@dataclass(frozen=True)
class Entry:
    """One exported strategy (``covers``) in one configuration.

    ``kind`` says what its train replies carry: ``dense`` (a model like :func:`dense_model`'s),
    ``clipped-bit`` (dense, plus the client's unclipped bit), ``signds`` (SignDS's sparse upload),
    ``objective`` (NoisyObjectiveSum's coefficients), ``secagg-dense`` / ``secagg-objective``
    (the secure-aggregation stages, answered by the real client app). ``randomised``: the released
    model depends on how many replies there are (a permutation, noise), so a round with one rejected
    reply is not bit-identical to the round without it.

    ``make(**kw)`` passes ``kw`` (``ledger_path``, ``resume``, ``restart``'s overrides) to the constructor: the
    restart suite (``test_restart.py``) builds every non-secure entry on a ledger file, restarts it and compares
    with an uninterrupted run. ``restart``: constructor overrides for that suite (a configuration with state to
    carry). ``resumes_stream``: an int ``rng`` makes each release's randomness a function of its index, so the
    restarted run must release exactly the uninterrupted run's model.
    """

    name: str
    covers: type
    make: Callable[[], Any]
    kind: str = "dense"
    nodes: int = N
    randomised: bool = False
    xfail: Optional[str] = None
    restart: dict = field(default_factory=dict)
    resumes_stream: bool = False
    central: bool = False
    """A central-DP wrapper (its ``make(inner=...)`` wraps that Flower strategy instead of FedAvg)."""
    drop_in: Optional[str] = None
    """The one line an ordinary Flower app changes to use this strategy: an expression over ``FedAvg``,
    ``FEDAVG_ARGS`` (FedAvg's node counts for ``NODES`` = 4 nodes) and the package's exports, evaluated by
    ``tests/plain_app/app.py`` (``test_drop_in.py`` runs every such line in one ``flwr run``)."""
    not_drop_in: Optional[str] = None
    """Why no plain app can run this strategy unchanged (its clients need a protocol or another reply)."""

    @property
    def wraps(self) -> bool:
        """``make(inner=...)`` wraps that Flower strategy (the wrapped-configure suite derives its cases from it)."""
        return "inner" in inspect.signature(self.make).parameters

    @property
    def secure(self) -> bool:
        return self.kind.startswith("secagg")

    def build(self, **kw: Any) -> Any:
        """``make(**kw)`` publishing Flower's mean of the evaluate metrics (``evaluate_metrics="flower"``, booked
        non-private): for the suites that check screening through the published mean; the default (accounted,
        declared metrics only) is tested in ``test_evaluate_metrics.py`` and ``test_published_keys.py``."""
        return self.make(**{"evaluate_metrics": "flower", **kw})

    def grid(self) -> Any:
        """The grid ``configure_*`` get: a client-less loopback grid, or a secagg LoopbackGrid running the client app."""
        return _secure_grid(self.kind, self.nodes) if self.secure else loopback.LoopbackGrid.of(self.nodes)

    def model(self) -> ArrayRecord:
        return head_model() if self.kind in ("objective", "secagg-objective") else dense_model()

    def train_content(self, i: int) -> RecordDict:
        """A valid train reply of node i (not for the secure-aggregation kinds)."""
        if self.kind == "signds":
            return RecordDict({"arrays": _signds_arrays(i), "metrics": MetricRecord({"num-examples": 10})})
        if self.kind == "objective":
            return RecordDict({"arrays": _objective_arrays(i), "metrics": MetricRecord({"num-examples": 12})})
        metrics = {"num-examples": 10, "loss": 0.5}
        if self.kind == "clipped-bit":
            metrics[KEY_UNCLIPPED_BIT] = 1
        return RecordDict({"arrays": dense_arrays(i), "metrics": MetricRecord(metrics)})

    def train_replies(self, grid: Any, messages: list[Message]) -> list[Message]:
        """A valid reply to each train instruction, in order (secure kinds: the client app's answers)."""
        if not self.secure:
            return [Message(self.train_content(i), reply_to=m) for i, m in enumerate(messages)]
        replies = []
        for msg in messages:
            node = int(msg.metadata.dst_node_id)
            reply = grid.app(msg, grid.contexts[node])
            reply.metadata.__dict__["_src_node_id"] = node
            replies.append(reply)
        return replies

    @staticmethod
    def evaluate_content(i: int) -> RecordDict:
        """A valid evaluate reply of node i: metrics and an inference vector (ClusterEvaluation scores it)."""
        probs = np.roll(np.array([0.8, 0.15, 0.05]), i)
        return RecordDict(
            {"metrics": MetricRecord({"num-examples": 10, "acc": 0.5}), "inference": ArrayRecord({"0": Array(probs)})}
        )


def _entries() -> list[Entry]:
    n, s = N, N_SECURE
    return [
        Entry(
            "AccountedFedAvg",
            AccountedFedAvg,
            lambda **kw: AccountedFedAvg(**kwargs(), **kw),
            drop_in="AccountedFedAvg(**FEDAVG_ARGS)",
        ),
        Entry(
            "ShuffleAmplifiedFedAvg",
            ShuffleAmplifiedFedAvg,
            lambda **kw: ShuffleAmplifiedFedAvg(**kwargs(), shuffler=LayerShuffler(0), **kw),
            randomised=True,
            drop_in="ShuffleAmplifiedFedAvg(**FEDAVG_ARGS)",
        ),
        Entry(
            "MinDivergenceExpSampling",
            MinDivergenceExpSampling,
            lambda **kw: MinDivergenceExpSampling(num_selected=2, epsilon=None, **kwargs(), **kw),
            drop_in="MinDivergenceExpSampling(num_selected=NODES, epsilon=1.0, **FEDAVG_ARGS)",
        ),
        Entry(
            "SignDS",
            SignDS,
            lambda **kw: SignDS(sign_k=0.05, sign_eps=10.0, **kwargs(), **kw),
            kind="signds",
            drop_in="SignDS(sign_k=0.05, sign_eps=10.0, **FEDAVG_ARGS)",
        ),
        Entry(
            "NoisyObjectiveSum",
            NoisyObjectiveSum,
            lambda **kw: NoisyObjectiveSum(num_classes=2, ridge=1e-3, **kwargs(), **kw),
            kind="objective",
            not_drop_in="its clients upload objective coefficients, not a model (examples/delm)",
        ),
        Entry(
            "ClusterEvaluation(FedAvg)",
            ClusterEvaluation,
            lambda inner=None, **kw: ClusterEvaluation(
                inner or FedAvg(**kwargs()), book_unaccounted_training=False, **kw
            ),
            drop_in="ClusterEvaluation(FedAvg(**FEDAVG_ARGS))",
        ),
        Entry(
            "ClusterEvaluation(AccountedFedAvg)",
            ClusterEvaluation,
            lambda evaluate_metrics=AccountedMetrics(), **kw: ClusterEvaluation(
                AccountedFedAvg(**kwargs(), evaluate_metrics=evaluate_metrics), **kw
            ),
        ),
        Entry(
            "AccountedServerSideFixedClipping",
            AccountedServerSideFixedClipping,
            lambda inner=None, **kw: AccountedServerSideFixedClipping(
                inner or FedAvg(**kwargs()), 1.0, 1.0, n, **{"rng": 7, **kw}
            ),
            central=True,
            drop_in="AccountedServerSideFixedClipping(FedAvg(**FEDAVG_ARGS), 1.0, 1.0, NODES)",
        ),
        Entry(
            "AccountedPoissonFixedClipping",
            AccountedPoissonFixedClipping,
            lambda inner=None, **kw: AccountedPoissonFixedClipping(
                inner or FedAvg(**kwargs()), 1.0, 1.0, n, **{"num_clients": n, "rng": 7, **kw}
            ),
            central=True,
            drop_in="AccountedPoissonFixedClipping(FedAvg(**FEDAVG_ARGS), 1.0, 1.0, 2)",
        ),
        Entry(
            "AccountedAdaptiveClipping",
            AccountedAdaptiveClipping,
            lambda inner=None, **kw: AccountedAdaptiveClipping(
                inner or FedAvg(**kwargs()),
                1.0,
                n,
                initial_clipping_norm=0.5,
                clipped_count_stddev=1.0,
                num_clients=n,
                rng=7,
                **kw,
            ),
            central=True,
            drop_in="AccountedAdaptiveClipping(FedAvg(**FEDAVG_ARGS), 0.1, NODES)",
        ),
        Entry(
            "AccountedClientSideAdaptiveClipping",
            AccountedClientSideAdaptiveClipping,
            lambda inner=None, **kw: AccountedClientSideAdaptiveClipping(
                inner or FedAvg(**kwargs()),
                1.0,
                n,
                initial_clipping_norm=2.0,
                clipped_count_stddev=1.0,
                num_clients=n,
                rng=7,
                **kw,
            ),
            kind="clipped-bit",
            central=True,
            drop_in="AccountedClientSideAdaptiveClipping(FedAvg(**FEDAVG_ARGS), 0.1, NODES)",
        ),
        Entry(  # b = 1: every node in every round (the suites expect all N nodes); b > 1 in test_bandmf_strategy.py
            "AccountedBandedMatrixFactorization",
            AccountedBandedMatrixFactorization,
            lambda inner=None, **kw: AccountedBandedMatrixFactorization(
                inner or FedAvg(**kwargs()), 1.0, 1.0, n, **{"num_bands": 1, "num_rounds": 3, "rng": 7, **kw}
            ),
            central=True,
            randomised=True,
            restart={"num_bands": 2},  # the restart suite: a noise buffer and a participation rule to continue
            resumes_stream=True,
            drop_in="AccountedBandedMatrixFactorization(FedAvg(**FEDAVG_ARGS), 1.0, 1.0, NODES // 2, num_bands=2, num_rounds=2)",
        ),
        Entry(
            "DistributedDpFedAvg",
            DistributedDpFedAvg,
            lambda **kw: DistributedDpFedAvg(
                **kwargs(s), noise_multiplier=0.5, clipping_norm=1.0, bits=20, rotation_seed=3, min_survivors=0.6, **kw
            ),
            kind="secagg-dense",
            nodes=s,
            not_drop_in="its clients run the secure-aggregation protocol (distributed_dp_mod)",
        ),
        Entry(
            "SecureObjectiveSum",
            SecureObjectiveSum,
            lambda **kw: SecureObjectiveSum(
                **kwargs(s), num_classes=2, max_records=50, epsilon=5.0, bits=32, min_survivors=0.6, **kw
            ),
            kind="secagg-objective",
            nodes=s,
            not_drop_in="its clients run the secure-aggregation protocol (SecureObjectiveTrainer)",
        ),
    ]


def _example_entries() -> list[Entry]:
    """Strategies written against the template outside the package (docs/architecture.md's worked example):
    one registry line puts them through every cross-cutting suite."""
    return [
        Entry(
            "NoisyClippedMean (example)",
            NoisyClippedMean,
            lambda **kw: NoisyClippedMean(
                **kwargs(), clipping_norm=1.0, noise_multiplier=1.0, num_sampled_clients=N, **{"rng": 7, **kw}
            ),
            randomised=True,
            not_drop_in="the worked example of docs/architecture.md, outside the package",
        ),
    ]


REGISTRY: dict[str, Entry] = {entry.name: entry for entry in _entries() + _example_entries()}


def exported_strategies() -> set[type]:
    """Every Strategy subclass that ``flwr_dp_strategies`` or ``flwr_dp_strategies.strategy`` exports."""
    return {
        obj
        for module in (flwr_dp_strategies, flwr_dp_strategies.strategy)
        for name in module.__all__
        if isinstance(obj := getattr(module, name), type) and issubclass(obj, Strategy)
    }


def rejection_counts(strategy: Any, metrics: Any, phase: str) -> dict[str, int]:
    """``{reason: count}`` of the replies ``strategy`` rejected in its last round of ``phase`` (failed
    replies under ``error``), read where the strategy keeps them for the server's operator
    (:attr:`~flwr_dp_strategies.rounds.client_accounting.ClientAccountingMixin.rejections`); they must
    never be in the round's ``metrics``."""
    assert not any(key.startswith(("rejected/", "replies/")) for key in (metrics or {})), sorted(metrics)
    return {reason: int(n) for reason, n in strategy.rejections.get(phase, {}).items() if n}


def entries(*kinds: str) -> dict[str, Entry]:
    """The registry's entries of these kinds (all when none is named)."""
    return {name: e for name, e in REGISTRY.items() if not kinds or e.kind in kinds}


__all__ = [
    "Entry",
    "N",
    "N_SECURE",
    "REGISTRY",
    "dense_model",
    "entries",
    "exported_strategies",
    "kwargs",
    "rejection_counts",
]
