r"""Privacy–utility: test accuracy at a calibrated ledger ε for each DP method, on digits and MNIST.

    python flwr_dp_benchmarks/bench_privacy_utility.py [--quick | --tiny] [--out flwr_dp_benchmarks/privacy_utility]
    python flwr_dp_benchmarks/bench_privacy_utility.py --report    # rebuild results.md and the plot from results.json

Writes ``results.json`` (machine, configuration, every run with its accuracy curve),
``results.md`` (one table: method, dataset, neighbouring relation, target ε, achieved
ledger ε, accuracy, notes) and ``accuracy_vs_epsilon.png`` (accuracy against ε, log x,
one line per method per dataset, non-private FedAvg as a dashed reference).

**Calibration.** For each target ε the noise parameter of the method (noise multiplier
z, per-round LDP ε, or the ε split of DELM) is found by bisection so that the
:class:`~flwr_dp_strategies.privacy.PrivacyLedger` (δ = 1e-5, ``accounting="best"``:
min of RDP and PLD) composes the events that the run will book to ``target·(1 − 0.3 %)
≤ ε ≤ target``. The calibration ledger is fed exactly the events the strategy/client
code emits (same DpEvent objects, same rounds); the **achieved** ε in the table is
read afterwards from the ledger of the strategy that ran, never from the calibration.

**The federation** is simulated in-process, without Ray: per round the strategy's
``configure_train`` produces the Flower ``Message`` s, each sampled client answers
with the same client-side function a ClientApp would call (``local_sgd`` +
``ldp_fl_update``, ``dp_sgd_train_reply``, ``covariance_reply``,
``FunctionalMechanismTrainer.train``), and the strategy's ``aggregate_train`` books
the declared releases in its ledger and aggregates. Clients hold equal-size IID
shards (equal FedAvg weights, as Flower's accountant requires).

**Methods** and their neighbouring relations (an ε is only comparable within a relation):

* ``ours-central-poisson`` -- :class:`~flwr_dp_strategies.strategy.AccountedPoissonFixedClipping`:
  local SGD, server-side clipping to C, fixed denominator m = qN, Gaussian noise,
  Poisson client sampling with rate q; the ledger composes
  ``PoissonSampled(q, Gaussian(z))`` per round (amplified). **User-level**, add or
  remove one client's whole data.
* ``ours-central-adaptive`` -- :class:`~flwr_dp_strategies.AccountedAdaptiveClipping`: the
  same Poisson sampling, fixed denominator and booked event as ``ours-central-poisson``
  (z is the combined multiplier of the clipped sum and the centred unclipped count), C
  learnt from C₀ = 0.1 toward the median update norm (Andrew et al. 2021); no C to tune.
  **User-level**, add or remove one client.
* ``flower-central`` -- Flower's ``DifferentialPrivacyServerSideFixedClipping`` (through
  :class:`~flwr_dp_strategies.strategy.AccountedServerSideFixedClipping`, which only
  books Flower's release in the ledger) over FedAvg sampling the same m = qN clients
  per round, with Flower's own ``RdpAccountant`` (``NO_AMPLIFICATION``, the only mode
  Flower allows with fixed clipping): each round is a plain ``Gaussian(z)``.
  **User-level**, add/remove one client (zero-out: fixed weights and denominator).
  Flower's own ε (RDP only) is in the notes.
* ``ldp-fl`` -- LDP-FL (:func:`flwr_dp_experiments.baselines.ldp_fl_update`): each client
  clips its update to C and adds analytic-Gaussian noise for (ε_round, δ) with Δ₂ = 2C,
  every round; ε_round is set so the R rounds compose to the target. **User-level local
  DP**, replace one client's update (ledger ``replace_one``).
* ``ours-delm-fm`` -- DELM (functional mechanism): a softmax head trained on a
  Gaussian-FM objective released once per client
  (:class:`client_mods.functional_mechanism.FunctionalMechanismTrainer`, smooth step
  1/L), on the pooled pixels with the whole budget (``fm_components = 0``, the best
  configuration of examples/delm); with ``fm_components = k`` LDP federated PCA
  first (Analyze Gauss, ε₁ = ε'/3) and FM on k components (ε₂ = 2ε'/3), ε' scaled so
  that the two releases compose to the target. **Record-level**, replace one record
  of a client's data (the paper's relation); ε does not grow with rounds.
* ``ours-delm-hog-sum`` -- the same single FM release per client, on histograms of
  oriented gradients (:func:`flwr_dp_experiments.feature_maps.hog_features`, data-independent)
  instead of pooled pixels, uploaded as the noisy objective itself and solved on the
  server (:class:`~flwr_dp_strategies.NoisyObjectiveSum`, noise-adapted ridge): examples/delm's
  ``delm-nopca-sum-hog``. **Record-level**, replace one record.
* ``dp-sgd`` -- DP-SGD on Opacus through :class:`client_mods.dp_sgd.DpSgdTrainer`
  (``dp_sgd_train_reply``), FedAvg via :class:`~flwr_dp_strategies.strategy.AccountedFedAvg`;
  each client's ledger composes its rounds'
  ``SelfComposed(PoissonSampled(q, Gaussian(z)), steps)``. **Record-level**, add or
  remove one record of a client's data. Opacus' own ε (RDP) is in the notes.
* ``fedavg`` (reference, ε = ∞) -- non-private FedAvg with the same local training.

Everything is seeded (``--seed``) for reproducibility: this is a benchmark, not a
deployment (seeded noise is not private in practice). ``torch.set_num_threads(1)``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from dp_accounting import dp_event  # noqa: E402

from flwr_dp_benchmarks._common import quiet_loggers  # noqa: E402

DELTA = 1e-5
EPSILONS = (0.1, 0.5, 1.0, 2.0, 8.0)
DATASETS = ("digits", "mnist")
METHODS = (
    "ours-central-poisson",
    "ours-central-adaptive",
    "flower-central",
    "ldp-fl",
    "ours-delm-fm",
    "ours-delm-hog-sum",
    "dp-sgd",
)
REFERENCE = "fedavg"
CALIBRATION_TOLERANCE = 3e-3  # achieved ε in [target·(1 − tol), target]

#: Neighbouring relation of each method, as stated in every row.
RELATIONS = {
    "ours-central-poisson": "user-level: add/remove one client (central DP, Poisson-sampled clients, amplified)",
    "ours-central-adaptive": "user-level: add/remove one client (central DP, adaptive C, Poisson, amplified)",
    "flower-central": "user-level: add/remove one client (central DP, zero-out, no amplification)",
    "ldp-fl": "user-level local DP: replace one client's update",
    "ours-delm-fm": "record-level: replace one record of a client's data",
    "ours-delm-hog-sum": "record-level: replace one record of a client's data",
    "dp-sgd": "record-level: add/remove one record of a client's data",
    "fedavg": "— (non-private, ε = ∞)",
}
LEDGER_RELATION = {
    "ours-central-poisson": "add_or_remove_one",
    "ours-central-adaptive": "add_or_remove_one",
    "flower-central": "add_or_remove_one",
    "ldp-fl": "replace_one",
    "ours-delm-fm": "replace_one",
    "ours-delm-hog-sum": "replace_one",
    "dp-sgd": "add_or_remove_one",
    "fedavg": "add_or_remove_one",
}
LABELS = {
    "ours-central-poisson": "ours: central DP, Poisson sampling",
    "ours-central-adaptive": "ours: central DP, adaptive clipping, Poisson",
    "flower-central": "Flower central DP",
    "ldp-fl": "LDP-FL",
    "ours-delm-fm": "ours: DELM functional mechanism",
    "ours-delm-hog-sum": "ours: FM on HOG, server-side solve",
    "dp-sgd": "DP-SGD (Opacus)",
    "fedavg": "FedAvg (non-private)",
}

#: Per-dataset federation and hyper-parameters (fixed across ε; chosen once, see results.md).
DATASET_CONFIG: dict[str, dict[str, Any]] = {
    "digits": dict(
        num_clients=20,
        hidden=64,
        local_lr=0.3,
        local_batch=16,
        local_epochs=3,
        central_fraction=0.5,
        central_clip=0.3,
        ldp_clip=1.0,
        dpsgd_batch=16,
        dpsgd_lr=0.5,
        dpsgd_clip=1.0,
        fm_pool=1,
        fm_components=0,
        fm_steps=5,
        fm_ridge=1e-4,
        fm_hog_cell=2,
    ),
    "mnist": dict(
        num_clients=100,
        hidden=64,
        local_lr=0.05,
        local_batch=32,
        local_epochs=1,
        central_fraction=0.5,
        central_clip=0.3,
        ldp_clip=1.0,
        dpsgd_batch=120,
        dpsgd_lr=1.0,
        dpsgd_clip=1.0,
        fm_pool=2,
        fm_components=0,
        fm_steps=5,
        fm_ridge=1e-4,
        fm_hog_cell=4,
    ),
}

#: kwargs of :func:`run` per mode ("tiny" is for the smoke test: toy sizes, meaningless accuracies).
MODES: dict[str, dict[str, Any]] = {
    "full": {"datasets": DATASETS, "epsilons": EPSILONS, "rounds": {"digits": 30, "mnist": 30}},
    "quick": {"datasets": DATASETS, "epsilons": EPSILONS, "rounds": {"digits": 15, "mnist": 10}},
    "tiny": {
        "datasets": ("digits",),
        "epsilons": (0.5, 8.0),
        "rounds": {"digits": 2},
        "overrides": {"digits": {"num_clients": 4, "max_train": 400}},
    },
}

Params = list[np.ndarray]
MLP_KEYS = ("0.weight", "0.bias", "2.weight", "2.bias")


# ============================================================================ data
@dataclass(frozen=True)
class Federation:
    """Equal-size IID client shards of a dataset's train split, and its test split."""

    dataset: str
    shards: tuple[tuple[np.ndarray, np.ndarray], ...]
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int

    @property
    def num_clients(self) -> int:
        return len(self.shards)

    @property
    def input_dim(self) -> int:
        return int(self.x_test.shape[1])

    @property
    def shard_size(self) -> int:
        return int(len(self.shards[0][1]))


def make_federation(
    dataset: str, num_clients: int, *, max_train: Optional[int] = None, seed: int = 42, data_dir: str = ""
) -> Federation:
    """``num_clients`` shards of ⌊n/num_clients⌋ examples of a seeded permutation (the rest is dropped)."""
    from flwr_dp_experiments.datasets import load_dataset

    x_tr, y_tr, x_te, y_te = load_dataset(dataset, data_dir)
    order = np.random.default_rng(seed).permutation(len(y_tr))
    if max_train is not None:
        order = order[:max_train]
    per = len(order) // num_clients
    if per < 1:
        raise ValueError(f"{len(order)} examples cannot be split into {num_clients} non-empty shards")
    shards = tuple((x_tr[idx], y_tr[idx]) for idx in order[: per * num_clients].reshape(num_clients, per))
    return Federation(dataset, shards, x_te, y_te, int(max(y_tr.max(), y_te.max()) + 1))


def fm_features(x: np.ndarray, dataset: str, pool: int) -> np.ndarray:
    """DELM's per-record input map: undo MNIST's public standardisation, average-pool, unit L2 rows.

    Every step is a fixed per-record function (no data-dependent constant), so it costs no privacy.
    """
    from flwr_dp_experiments.datasets import MNIST_MEAN, MNIST_STD

    out = np.asarray(x, dtype=np.float64)
    if dataset == "mnist":
        out = out * MNIST_STD + MNIST_MEAN
    if pool > 1:
        side = int(round(math.sqrt(out.shape[1])))
        out = out.reshape(-1, side // pool, pool, side // pool, pool).mean(axis=(2, 4)).reshape(len(out), -1)
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


# ============================================================================ calibration
def ledger_epsilon(
    relation: str,
    central: Sequence[dp_event.DpEvent] = (),
    per_client: Sequence[dp_event.DpEvent] = (),
    method: str = "best",
) -> float:
    """ε at δ = 1e-5 of a ledger holding ``central`` (round r = index + 1) and one client's events."""
    from flwr_dp_strategies.privacy import PrivacyLedger

    ledger = PrivacyLedger(DELTA, neighboring_relation=relation)
    for rnd, event in enumerate(central, start=1):
        ledger.record(event, server_round=rnd)
    for rnd, event in enumerate(per_client, start=1):
        ledger.record(event, server_round=rnd, client="client")
    return float(ledger.epsilon(method=method))


def calibrate(
    epsilon_of: Callable[[float, str], float],
    target: float,
    *,
    increasing: bool,
    lo: float,
    hi: float,
    tol: float = CALIBRATION_TOLERANCE,
) -> tuple[float, float]:
    """The parameter x with ``epsilon_of(x, "best")`` in [target·(1 − tol), target].

    ``epsilon_of(x, method)`` must be monotone in x (``increasing`` says which way) on
    [lo, hi]. Root finding on log ε − log target against log x (ε is close to a power of
    x, so the Illinois variant of regula falsi needs a handful of evaluations). A cheap
    RDP-only pass comes first: ε_best ≤ ε_RDP, so the RDP solution lies on the safe side
    and brackets the "best" solution with a point at most 4× away. Returns (x, ε_best(x)).
    """
    cache: dict[tuple[float, str], float] = {}

    def gap(x: float, method: str) -> float:
        if (x, method) not in cache:
            cache[(x, method)] = epsilon_of(x, method)
        eps = cache[(x, method)]
        return math.log(eps / target) if 0 < eps < math.inf else (50.0 if eps > 0 else -50.0)

    def solve(method: str, a: float, b: float, ga: float, gb: float) -> tuple[float, float]:
        # invariant: ga and gb have opposite signs (a, b in log space)
        if ga * gb > 0:
            raise RuntimeError(f"calibration: ε({math.exp(a):.4g})/ε({math.exp(b):.4g}) do not bracket {target}")
        side = 0
        for _ in range(100):
            u = (a * gb - b * ga) / (gb - ga)
            x = math.exp(u)
            g = gap(x, method)
            if math.log(1 - tol) <= g <= 0.0:
                return x, cache[(x, method)]
            if g * gb > 0:
                b, gb = u, g
                if side == -1:
                    ga /= 2
                side = -1
            else:
                a, ga = u, g
                if side == 1:
                    gb /= 2
                side = 1
            if abs(b - a) < 1e-12:
                break
        raise RuntimeError(f"calibration to ε={target} did not converge ({method})")

    a, b = math.log(lo), math.log(hi)
    x_rdp, _ = solve("rdp", a, b, gap(lo, "rdp"), gap(hi, "rdp"))
    g_rdp = gap(x_rdp, "best")
    if math.log(1 - tol) <= g_rdp <= 0.0:
        return x_rdp, cache[(x_rdp, "best")]
    # the best-ε solution needs less noise than the RDP one (at most 4× less here)
    other = x_rdp * 4.0 if increasing else x_rdp / 4.0
    return solve("best", math.log(x_rdp), math.log(other), g_rdp, gap(other, "best"))


# ============================================================================ Flower plumbing
class Grid:
    """The part of a Flower Grid that ``configure_train`` uses: node ids 101, 102, ..."""

    def __init__(self, num_nodes: int) -> None:
        self.node_ids = list(range(101, 101 + num_nodes))

    def get_node_ids(self) -> list[int]:
        """All connected node ids."""
        return list(self.node_ids)


class _TaskIdentity:
    """Messages need a run/node/task id, as inside a ServerApp; set one and restore the old on exit."""

    def __enter__(self) -> "_TaskIdentity":
        from flwr.supercore.task_identity import TaskIdentity

        self._saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
        return self

    def __exit__(self, *exc: object) -> None:
        from flwr.supercore.task_identity import TaskIdentity

        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = self._saved


ReplyFn = Callable[[int, Any, int], Any]  # (client index, train Message, round) -> reply Message


def fl_round(strategy: Any, rnd: int, arrays: Any, grid: Grid, reply_fn: ReplyFn) -> tuple[Any, Any]:
    """One Flower round in-process: configure_train → each sampled client's reply → aggregate_train."""
    from flwr.app import ConfigRecord

    replies = [
        reply_fn(int(msg.metadata.dst_node_id) - 101, msg, rnd)
        for msg in strategy.configure_train(rnd, arrays, ConfigRecord(), grid)
    ]
    new_arrays, metrics = strategy.aggregate_train(rnd, replies)
    if new_arrays is None:
        raise RuntimeError(f"round {rnd}: the strategy released no model ({metrics})")
    return new_arrays, metrics


def params_reply(
    msg: Any, params: Params, weight: float, declarations: Iterable[tuple[dp_event.DpEvent, str]] = ()
) -> Any:
    """A train reply carrying ``params`` under the MLP's keys, ``num-examples`` and the declared releases."""
    from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

    from flwr_dp_strategies.declarations import declare_release

    content = RecordDict(
        {
            "arrays": ArrayRecord({k: Array(np.asarray(p)) for k, p in zip(MLP_KEYS, params)}),
            "metrics": MetricRecord({"num-examples": float(weight)}),
        }
    )
    for event, label in declarations:
        declare_release(content, event, label=label, neighboring_relation="replace_one")  # LDP-FL: Δ₂ = 2C
    return Message(content, reply_to=msg)


def mlp_arrays(params: Params) -> Any:
    """An ArrayRecord of the MLP's params under ``state_dict`` keys."""
    from flwr.app import Array, ArrayRecord

    return ArrayRecord({k: Array(np.asarray(p)) for k, p in zip(MLP_KEYS, params)})


def arrays_params(arrays: Any) -> Params:
    """The MLP's params (numpy, in key order) of an ArrayRecord."""
    return [arrays[k].numpy() for k in MLP_KEYS]


# ============================================================================ methods
@dataclass
class RunResult:
    """What one (method, dataset, ε) run produced."""

    accuracy: list[float]
    ledger_epsilon: float
    ledger_epsilon_rdp: float
    params: dict[str, Any]
    own_epsilon: Optional[float] = None
    own_accountant: str = ""
    notes: str = ""


def _init_params(fed: Federation, cfg: dict[str, Any], seed: int) -> Params:
    from flwr_dp_experiments.baselines import get_params, make_mlp

    return get_params(make_mlp(fed.input_dim, cfg["hidden"], fed.num_classes, seed=seed))


def _local(fed: Federation, cfg: dict[str, Any], i: int, params: Params, rnd: int, seed: int) -> Params:
    """Client i's non-private local training (the ClientApp's ``local_sgd``)."""
    from flwr_dp_experiments.baselines import local_sgd

    x, y = fed.shards[i]
    return local_sgd(
        params,
        x,
        y,
        epochs=cfg["local_epochs"],
        lr=cfg["local_lr"],
        batch_size=cfg["local_batch"],
        seed=seed * 1_000_003 + rnd * 1009 + i,
    )


def _train_mlp(
    fed: Federation, cfg: dict[str, Any], strategy: Any, rounds: int, seed: int, reply_fn: ReplyFn
) -> list[float]:
    """Run ``rounds`` rounds of ``strategy`` on the MLP; test accuracy after each."""
    from flwr_dp_experiments.baselines import evaluate

    arrays, grid, acc = mlp_arrays(_init_params(fed, cfg, seed)), Grid(fed.num_clients), []
    for rnd in range(1, rounds + 1):
        arrays, _ = fl_round(strategy, rnd, arrays, grid, reply_fn)
        acc.append(float(evaluate(arrays_params(arrays), fed.x_test, fed.y_test)))
    return acc


def _ledger_pair(ledger: Any) -> tuple[float, float]:
    report = ledger.report()
    return float(report.epsilon), float(report.epsilon_rdp)


def run_fedavg(fed: Federation, cfg: dict[str, Any], target: float, rounds: int, seed: int) -> RunResult:
    """Non-private FedAvg (all clients every round): the accuracy ceiling of the MLP methods."""
    from flwr_dp_strategies import AccountedFedAvg, PrivacyLedger

    n = fed.num_clients
    strategy = AccountedFedAvg(
        fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n, min_available_nodes=n, ledger=PrivacyLedger(DELTA)
    )

    def reply(i: int, msg: Any, rnd: int) -> Any:
        new = _local(fed, cfg, i, arrays_params(msg.content["arrays"]), rnd, seed)
        return params_reply(msg, new, fed.shard_size)  # nothing declared: booked as non-private

    acc = _train_mlp(fed, cfg, strategy, rounds, seed, reply)
    eps, eps_rdp = _ledger_pair(strategy.ledger)
    return RunResult(acc, eps, eps_rdp, {"clients_per_round": n}, notes="no noise; ledger books ε = ∞")


def run_central_poisson(fed: Federation, cfg: dict[str, Any], target: float, rounds: int, seed: int) -> RunResult:
    """Ours: AccountedPoissonFixedClipping, z calibrated on PoissonSampled(q, Gaussian(z)) × rounds."""
    from dp_accounting.dp_event import GaussianDpEvent, PoissonSampledDpEvent
    from flwr.serverapp.strategy import FedAvg

    from flwr_dp_strategies import PrivacyLedger
    from flwr_dp_strategies.strategy import AccountedPoissonFixedClipping

    n = fed.num_clients
    m = max(1, int(round(cfg["central_fraction"] * n)))
    q = m / n

    def eps_of(z: float, method: str) -> float:
        return ledger_epsilon(
            "add_or_remove_one", [PoissonSampledDpEvent(q, GaussianDpEvent(z))] * rounds, method=method
        )

    z, _ = calibrate(eps_of, target, increasing=False, lo=0.1, hi=3000.0)
    strategy = AccountedPoissonFixedClipping(
        FedAvg(fraction_evaluate=0.0),
        z,
        cfg["central_clip"],
        m,
        num_clients=n,
        ledger=PrivacyLedger(DELTA),
        rng=np.random.default_rng([seed, 1]),
    )
    participants: dict[int, int] = {}

    def reply(i: int, msg: Any, rnd: int) -> Any:
        participants[rnd] = participants.get(rnd, 0) + 1
        new = _local(fed, cfg, i, arrays_params(msg.content["arrays"]), rnd, seed)
        return params_reply(msg, new, fed.shard_size)  # the central event covers the release

    acc = _train_mlp(fed, cfg, strategy, rounds, seed, reply)
    eps, eps_rdp = _ledger_pair(strategy.ledger)
    counts = [participants.get(rnd, 0) for rnd in range(1, rounds + 1)]
    return RunResult(
        acc,
        eps,
        eps_rdp,
        {
            "noise_multiplier": z,
            "clip": cfg["central_clip"],
            "sample_rate": q,
            "expected_clients_per_round": m,
            "noise_std": z * cfg["central_clip"] / m,
            "mean_clients_per_round": float(np.mean(counts)),
        },
        notes=f"q={q:g}, m={m}, z={z:.3g}, C={cfg['central_clip']:g}, σ=zC/m={z * cfg['central_clip'] / m:.3g}",
    )


def run_central_adaptive(fed: Federation, cfg: dict[str, Any], target: float, rounds: int, seed: int) -> RunResult:
    """Ours: AccountedAdaptiveClipping (Poisson q, fixed denominator m), z calibrated as for the fixed C."""
    from dp_accounting.dp_event import GaussianDpEvent, PoissonSampledDpEvent
    from flwr.serverapp.strategy import FedAvg

    from flwr_dp_strategies import AccountedAdaptiveClipping, PrivacyLedger

    n = fed.num_clients
    m = max(1, int(round(cfg["central_fraction"] * n)))
    q = m / n

    def eps_of(z: float, method: str) -> float:
        return ledger_epsilon(
            "add_or_remove_one", [PoissonSampledDpEvent(q, GaussianDpEvent(z))] * rounds, method=method
        )

    z, _ = calibrate(eps_of, target, increasing=False, lo=0.1, hi=3000.0)
    count_std = max(m / 20.0, z)  # the noise split needs z < 2σ_b
    strategy = AccountedAdaptiveClipping(
        FedAvg(fraction_evaluate=0.0),
        z,
        m,
        initial_clipping_norm=0.1,
        clipped_count_stddev=count_std,
        num_clients=n,
        ledger=PrivacyLedger(DELTA),
        rng=np.random.default_rng([seed, 1]),
    )

    def reply(i: int, msg: Any, rnd: int) -> Any:
        new = _local(fed, cfg, i, arrays_params(msg.content["arrays"]), rnd, seed)
        return params_reply(msg, new, fed.shard_size)

    acc = _train_mlp(fed, cfg, strategy, rounds, seed, reply)
    eps, eps_rdp = _ledger_pair(strategy.ledger)
    return RunResult(
        acc,
        eps,
        eps_rdp,
        {
            "noise_multiplier": z,
            "clipped_count_stddev": count_std,
            "sample_rate": q,
            "expected_clients_per_round": m,
            "final_clip": strategy.clipping_norm,
        },
        notes=f"q={q:g}, m={m}, z={z:.3g}, C0=0.1 → C={strategy.clipping_norm:.3g}, σ_b={count_std:.3g}",
    )


def run_flower_central(fed: Federation, cfg: dict[str, Any], target: float, rounds: int, seed: int) -> RunResult:
    """Flower's server-side fixed clipping (m clients sampled per round, no amplification), Flower's accountant."""
    from dp_accounting.dp_event import GaussianDpEvent
    from flwr.serverapp.strategy import FedAvg
    from flwr.supercore.privacy_accounting import NeighboringRelation, PrivacyConfig, SamplingMethod
    from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

    from flwr_dp_strategies import PrivacyLedger
    from flwr_dp_strategies.strategy import AccountedServerSideFixedClipping

    n = fed.num_clients
    m = max(1, int(round(cfg["central_fraction"] * n)))

    def eps_of(z: float, method: str) -> float:
        return ledger_epsilon("add_or_remove_one", [GaussianDpEvent(z)] * rounds, method=method)

    z, _ = calibrate(eps_of, target, increasing=False, lo=0.1, hi=3000.0)
    accountant = RdpAccountant(
        PrivacyConfig(
            target_delta=DELTA,
            population_size=n,
            neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
            sampling_method=SamplingMethod.NO_AMPLIFICATION,
        )
    )
    fedavg = FedAvg(fraction_train=m / n, fraction_evaluate=0.0, min_train_nodes=m, min_available_nodes=n)
    strategy = AccountedServerSideFixedClipping(
        fedavg, z, cfg["central_clip"], m, accountant=accountant, ledger=PrivacyLedger(DELTA)
    )

    def reply(i: int, msg: Any, rnd: int) -> Any:
        new = _local(fed, cfg, i, arrays_params(msg.content["arrays"]), rnd, seed)
        return params_reply(msg, new, fed.shard_size)

    random.seed(seed)  # Flower samples nodes with `random` and draws its noise from np.random
    np.random.seed(seed)
    acc = _train_mlp(fed, cfg, strategy, rounds, seed, reply)
    eps, eps_rdp = _ledger_pair(strategy.ledger)
    flower_eps = float(accountant.get_privacy_spent().epsilon)
    return RunResult(
        acc,
        eps,
        eps_rdp,
        {
            "noise_multiplier": z,
            "clip": cfg["central_clip"],
            "clients_per_round": m,
            "noise_std": z * cfg["central_clip"] / m,
        },
        own_epsilon=flower_eps,
        own_accountant="Flower RdpAccountant (no amplification)",
        notes=f"m={m} of {n}, z={z:.3g}, C={cfg['central_clip']:g}, σ=zC/m={z * cfg['central_clip'] / m:.3g}; "
        f"Flower's accountant: ε={flower_eps:.3g}",
    )


def run_ldp_fl(fed: Federation, cfg: dict[str, Any], target: float, rounds: int, seed: int) -> RunResult:
    """LDP-FL: every client, every round, clipped update + analytic Gaussian noise; ε_round calibrated."""
    from flwr_dp_strategies import AccountedFedAvg, PrivacyLedger
    from flwr_dp_experiments.baselines import ldp_fl_sigma, ldp_fl_update

    clip, n = cfg["ldp_clip"], fed.num_clients

    def eps_of(eps_round: float, method: str) -> float:
        z = ldp_fl_sigma(clip, eps_round, DELTA) / (2.0 * clip)
        return ledger_epsilon("replace_one", per_client=[dp_event.GaussianDpEvent(z)] * rounds, method=method)

    eps_round, _ = calibrate(eps_of, target, increasing=True, lo=1e-4, hi=max(target, 1.0) * 10)
    strategy = AccountedFedAvg(
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=n,
        min_available_nodes=n,
        ledger=PrivacyLedger(DELTA, neighboring_relation="replace_one"),
    )
    rngs = [np.random.default_rng([seed, 2, i]) for i in range(n)]

    def reply(i: int, msg: Any, rnd: int) -> Any:
        start = arrays_params(msg.content["arrays"])
        new = _local(fed, cfg, i, start, rnd, seed)
        noisy, event = ldp_fl_update(start, new, clip=clip, epsilon=eps_round, delta=DELTA, rng=rngs[i])
        return params_reply(msg, noisy, fed.shard_size, [(event, "ldp-fl/gaussian-update")])

    acc = _train_mlp(fed, cfg, strategy, rounds, seed, reply)
    eps, eps_rdp = _ledger_pair(strategy.ledger)
    sigma = ldp_fl_sigma(clip, eps_round, DELTA)
    return RunResult(
        acc,
        eps,
        eps_rdp,
        {"epsilon_per_round": eps_round, "clip": clip, "sigma": sigma},
        notes=f"ε/round={eps_round:.3g}, C={clip:g}, σ={sigma:.3g} per coordinate",
    )


def run_dp_sgd(fed: Federation, cfg: dict[str, Any], target: float, rounds: int, seed: int) -> RunResult:
    """DP-SGD clients (DpSgdTrainer via dp_sgd_train_reply) under AccountedFedAvg; z calibrated on the ledger."""
    import torch
    from flwr.app import Array, ArrayRecord, Context, RecordDict

    from client_mods.dp_sgd import EPSILON_METRIC, DpSgdTrainer, dp_sgd_event, dp_sgd_train_reply
    from flwr_dp_strategies import AccountedFedAvg, PrivacyLedger
    from flwr_dp_experiments.baselines import evaluate, make_mlp

    n, batch = fed.num_clients, cfg["dpsgd_batch"]
    # the shards' common size is public here: q = 1/⌈N/B⌉ as a public sample_rate, int(1/q) steps an epoch
    q = 1.0 / math.ceil(fed.shard_size / batch)
    steps = int(1.0 / q)

    def eps_of(z: float, method: str) -> float:
        return ledger_epsilon("add_or_remove_one", per_client=[dp_sgd_event([(z, q, steps)])] * rounds, method=method)

    z, _ = calibrate(eps_of, target, increasing=False, lo=0.3, hi=3000.0)

    def model_fn() -> torch.nn.Module:
        return make_mlp(fed.input_dim, cfg["hidden"], fed.num_classes, seed=seed)

    trainers = [
        DpSgdTrainer(
            model_fn,
            lr=cfg["dpsgd_lr"],
            noise_multiplier=z,
            max_grad_norm=cfg["dpsgd_clip"],
            batch_size=batch,
            sample_rate=q,
            device="cpu",
            seed=seed * 1000 + i,
        )
        for i in range(n)
    ]
    contexts = [Context(run_id=1, node_id=101 + i, node_config={}, state=RecordDict(), run_config={}) for i in range(n)]
    strategy = AccountedFedAvg(
        fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n, min_available_nodes=n, ledger=PrivacyLedger(DELTA)
    )
    opacus_eps: list[float] = []

    def reply(i: int, msg: Any, rnd: int) -> Any:
        out = dp_sgd_train_reply(msg, contexts[i], trainers[i], fed.shards[i], num_threads=None)
        opacus_eps.append(float(out.content["metrics"][EPSILON_METRIC]))
        return out

    arrays = ArrayRecord({k: Array(v.detach().numpy().copy()) for k, v in model_fn().state_dict().items()})
    grid, acc = Grid(n), []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for rnd in range(1, rounds + 1):
            arrays, _ = fl_round(strategy, rnd, arrays, grid, reply)
            acc.append(float(evaluate(arrays_params(arrays), fed.x_test, fed.y_test)))
    eps, eps_rdp = _ledger_pair(strategy.ledger)
    own = max(opacus_eps[-n:])
    return RunResult(
        acc,
        eps,
        eps_rdp,
        {
            "noise_multiplier": z,
            "clip": cfg["dpsgd_clip"],
            "batch_size": batch,
            "sample_rate": q,
            "steps_per_round": steps,
            "lr": cfg["dpsgd_lr"],
            "grad_sample_mode": trainers[0].grad_sample_mode,
        },
        own_epsilon=own,
        own_accountant="Opacus RDPAccountant",
        notes=f"B={batch}, q={q:.3g}, {steps} steps/round, z={z:.3g}, C={cfg['dpsgd_clip']:g}, "
        f"{trainers[0].grad_sample_mode}; Opacus: ε={own:.3g}",
    )


def run_delm_fm(fed: Federation, cfg: dict[str, Any], target: float, rounds: int, seed: int) -> RunResult:
    """DELM: a softmax head on a Gaussian functional-mechanism objective released once per client.

    ``fm_components = 0`` (the default, examples/delm's ``delm-nopca``): the FM
    gets the whole budget on the pooled pixels (a data-independent feature map).
    ``fm_components = k > 0``: LDP-FPCA first (Analyze Gauss, ε'/3), FM on the k
    private components with 2ε'/3. ``fm_features = "hog"``: HOG features instead of pixels;
    ``fm_aggregation = "sum"``: clients upload their noisy objective and
    :class:`~flwr_dp_strategies.NoisyObjectiveSum` solves the sum (no PCA).
    """
    from flwr.app import Array, ArrayRecord, Context, RecordDict

    from client_mods.federated_pca import COVARIANCE_KEY, covariance_reply, project
    from client_mods.functional_mechanism import FunctionalMechanismTrainer
    from flwr_dp_strategies import AccountedFedAvg, NoisyObjectiveSum, PrivacyLedger
    from flwr_dp_experiments.feature_maps import hog_features
    from flwr_dp_strategies.privacy import gaussian_sigma
    from flwr_dp_strategies.privacy.mechanisms.covariance import top_eigenvectors
    from flwr_dp_strategies.privacy.mechanisms.functional_mechanism import fm_noise_std

    n, c, k = fed.num_clients, fed.num_classes, cfg["fm_components"]
    hog, solve = cfg.get("fm_features") == "hog", cfg.get("fm_aggregation") == "sum"
    if solve and k > 0:
        raise ValueError("fm_aggregation='sum' runs without PCA (fm_components = 0)")

    def features(x: np.ndarray) -> np.ndarray:
        return hog_features(x, cell=cfg["fm_hog_cell"]) if hog else fm_features(x, fed.dataset, cfg["fm_pool"])

    feats = [features(x) for x, _ in fed.shards]
    dim = feats[0].shape[1]
    shares = (1.0 / 3.0, 2.0 / 3.0) if k > 0 else (0.0, 1.0)  # (FPCA, FM) shares of the budget

    def eps_of(total: float, method: str) -> float:
        events = [dp_event.GaussianDpEvent(gaussian_sigma(share * total, DELTA, 1.0)) for share in shares if share]
        return ledger_epsilon("replace_one", per_client=events, method=method)  # Gaussian: GaussianDpEvent(σ/Δ₂)

    total, _ = calibrate(eps_of, target, increasing=True, lo=target / 10.0, hi=target * 10.0)
    eps1, eps2 = shares[0] * total, shares[1] * total
    nodes = dict(
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=n,
        min_available_nodes=n,
        ledger=PrivacyLedger(DELTA, neighboring_relation="replace_one"),
    )
    strategy = (
        NoisyObjectiveSum(
            **nodes,
            num_classes=c,
            ridge_fraction=0.5,
            client_noise_std=fm_noise_std(dim, c, epsilon=eps2, noise="gaussian", delta=DELTA),
        )
        if solve
        else AccountedFedAvg(**nodes)
    )
    contexts = [Context(run_id=1, node_id=101 + i, node_config={}, state=RecordDict(), run_config={}) for i in range(n)]
    rngs = [np.random.default_rng([seed, 3, i]) for i in range(n)]
    grid = Grid(n)
    x_test = features(fed.x_test)
    first_round = 1
    if k > 0:  # round 1: LDP federated PCA, the server averages the noisy second moments (FedAvg, equal weights)
        k = min(k, dim)
        pca_arrays = ArrayRecord({COVARIANCE_KEY: Array(np.zeros((dim, dim)))})
        mean_cov, _ = fl_round(
            strategy,
            1,
            pca_arrays,
            grid,
            lambda i, msg, rnd: covariance_reply(
                msg, contexts[i], feats[i], epsilon=eps1, delta=DELTA, neighboring_relation="replace_one", rng=rngs[i]
            ),
        )
        basis = top_eigenvectors(mean_cov[COVARIANCE_KEY].numpy(), k)  # post-processing, sent to every client
        feats, x_test, first_round = [project(f, basis) for f in feats], project(x_test, basis), 2
    width = feats[0].shape[1]
    # learning_rate=None: each client's smooth step 1/L of its own noisy objective (post-processing)
    trainers = [
        FunctionalMechanismTrainer(
            eps2,
            num_classes=c,
            noise="gaussian",
            delta=DELTA,
            neighboring_relation="replace_one",
            local_steps=cfg["fm_steps"],
            learning_rate=None,
            ridge=cfg["fm_ridge"],
            rng=rngs[i],
            upload="objective" if solve else "head",
        )
        for i in range(n)
    ]
    labels = [y for _, y in fed.shards]
    arrays = ArrayRecord({"head.weight": Array(np.zeros((width, c)))})
    acc = []
    for rnd in range(first_round, first_round + rounds):
        arrays, _ = fl_round(
            strategy, rnd, arrays, grid, lambda i, msg, rnd: trainers[i].train(msg, contexts[i], feats[i], labels[i])
        )
        acc.append(float(np.mean(np.argmax(x_test @ arrays["head.weight"].numpy(), axis=1) == fed.y_test)))
    eps, eps_rdp = _ledger_pair(strategy.ledger)
    pca = f"k={k} LDP-PCA comps (ε_FPCA={eps1:.3g})" if k > 0 else "no PCA"
    pca += ", HOG features" if hog else ""
    pca += ", server-side solve of the summed objectives" if solve else ""
    return RunResult(
        acc,
        eps,
        eps_rdp,
        {
            "epsilon_fpca": eps1,
            "epsilon_fm": eps2,
            "components": k,
            "input_dim": dim,
            "pool": cfg["fm_pool"],
            "learning_rate": "smooth 1/L",
            "local_steps": cfg["fm_steps"],
            "ridge": cfg["fm_ridge"],
        },
        notes=f"inputs {dim}-d, {pca}; ε_FM={eps2:.3g} (Gaussian FM, once per client); {rounds} head rounds",
    )


RUNNERS: dict[str, Callable[[Federation, dict[str, Any], float, int, int], RunResult]] = {
    "fedavg": run_fedavg,
    "ours-central-poisson": run_central_poisson,
    "ours-central-adaptive": run_central_adaptive,
    "flower-central": run_flower_central,
    "ldp-fl": run_ldp_fl,
    "ours-delm-fm": run_delm_fm,
    "ours-delm-hog-sum": lambda fed, cfg, target, rounds, seed: run_delm_fm(
        fed, {**cfg, "fm_features": "hog", "fm_aggregation": "sum"}, target, rounds, seed
    ),
    "dp-sgd": run_dp_sgd,
}


# ============================================================================ driver
def run(
    *,
    datasets: Sequence[str] = DATASETS,
    epsilons: Sequence[float] = EPSILONS,
    methods: Sequence[str] = METHODS,
    rounds: Optional[dict[str, int]] = None,
    overrides: Optional[dict[str, dict[str, Any]]] = None,
    seed: int = 0,
    reference: bool = True,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> list[dict]:
    """One row per (dataset, method, target ε), plus a non-private FedAvg row per dataset.

    Row keys: method, label, dataset, neighbouring_relation, ledger_relation, target_epsilon,
    ledger_epsilon, ledger_epsilon_rdp, own_epsilon, own_accountant, accuracy (after the last
    round), accuracy_curve, rounds, num_clients, shard_size, params, notes, wall_s.
    """
    import importlib

    import torch

    importlib.import_module("flwr.serverapp.strategy")  # configures Flower's logger: quieten it afterwards

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows: list[dict] = []
    try:  # Flower's logger and dp-accounting's fractional-order warnings (absl) at ERROR
        with quiet_loggers("flwr", "absl"), _TaskIdentity(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for dataset in datasets:
                cfg = {**DATASET_CONFIG[dataset], **(overrides or {}).get(dataset, {})}
                fed = make_federation(dataset, cfg["num_clients"], max_train=cfg.get("max_train"))
                n_rounds = (rounds or {}).get(dataset, 10)
                jobs = ([(REFERENCE, math.inf)] if reference else []) + [(m, e) for m in methods for e in epsilons]
                for method, target in jobs:
                    t0 = time.perf_counter()
                    res = RUNNERS[method](fed, cfg, target, n_rounds, seed)
                    rows.append(_row(method, dataset, target, res, fed, n_rounds, time.perf_counter() - t0))
                    log(
                        f"[{dataset}] {method:22s} target ε={target:<5g} ledger ε={res.ledger_epsilon:.4g} "
                        f"acc={res.accuracy[-1]:.3f} ({time.perf_counter() - t0:.1f} s)"
                    )
    finally:
        torch.set_num_threads(threads)
    return rows


def _row(method: str, dataset: str, target: float, res: RunResult, fed: Federation, rounds: int, wall: float) -> dict:
    return {
        "method": method,
        "label": LABELS[method],
        "dataset": dataset,
        "neighbouring_relation": RELATIONS[method],
        "ledger_relation": LEDGER_RELATION[method],
        "target_epsilon": target,
        "ledger_epsilon": res.ledger_epsilon,
        "ledger_epsilon_rdp": res.ledger_epsilon_rdp,
        "delta": DELTA,
        "own_epsilon": res.own_epsilon,
        "own_accountant": res.own_accountant,
        "accuracy": res.accuracy[-1],
        "accuracy_curve": res.accuracy,
        "rounds": rounds,
        "num_clients": fed.num_clients,
        "shard_size": fed.shard_size,
        "params": res.params,
        "notes": res.notes,
        "wall_s": wall,
    }


# ============================================================================ output
def _fmt_eps(x: Optional[float]) -> str:
    if x is None:
        return "—"
    return "∞" if not math.isfinite(x) else f"{x:.4g}"


def markdown(result: dict) -> str:
    """The results table (one row per run) with the set-up and the relations spelled out."""
    m = result["machine"]
    lines = [
        f"# Privacy–utility ({result['mode']} run, {result['created']})",
        "",
        *[
            f"Rows of {', '.join(r['methods'])} rerun on {r['created']} (load {r['load_average']}); "
            "the other rows are from the run above."
            for r in result.get("reran", [])
        ],
        *([""] if result.get("reran") else []),
        f"Machine: {m['platform']}, {m['cpu_count']} CPUs; torch {m.get('torch')}, flwr {m.get('flwr')}, "
        f"dp-accounting {m.get('dp-accounting')}, opacus {m.get('opacus')}; torch threads 1; seed {result['seed']}.",
        "",
        "Every ε is the `PrivacyLedger` ε at δ = 1e-5 (min of RDP and PLD) of the worst client, read from the "
        "ledger of the strategy that ran, after calibrating the method's noise so that the ledger composes to "
        "the target. **ε values are comparable only within one neighbouring relation**: user-level ε protects a "
        "client's whole data set, record-level ε one example of it. Accuracy is on the test split after the last "
        "round. Federations: "
        + "; ".join(
            f"{d}: {c['num_clients']} clients × {c['shard_size']} examples, {c['rounds']} rounds"
            for d, c in result["federations"].items()
        )
        + ".",
        "",
        "| method | dataset | neighbouring relation | target ε | achieved ledger ε | accuracy | notes |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['label']} | {r['dataset']} | {r['neighbouring_relation']} | "
            f"{_fmt_eps(r['target_epsilon'])} | {_fmt_eps(r['ledger_epsilon'])} | {r['accuracy']:.3f} | "
            f"{r['notes']} |"
        )
    lines += [
        "",
        "Methods (the neighbouring relation of each is in its rows):",
        "",
        "- **ours: central DP, Poisson sampling** — `AccountedPoissonFixedClipping`: each client is sampled "
        "with probability q, its local-SGD update clipped to C, the sum divided by the fixed m = qN, "
        "Gaussian noise σ = zC/m; the ledger composes `PoissonSampled(q, Gaussian(z))` per round "
        "(amplification by sampling).",
        "- **Flower central DP** — Flower's `DifferentialPrivacyServerSideFixedClipping` (booked in a ledger by "
        "`AccountedServerSideFixedClipping`) over FedAvg sampling the same m clients per round; Flower's "
        "accountant allows no amplification with fixed clipping, so each round is `Gaussian(z)`: for the same "
        "ε and m its noise is larger than ours. Flower's own (RDP-only) ε is in the notes.",
        "- **LDP-FL** — each client clips its update to C and adds analytic-Gaussian noise for (ε/round, δ) with "
        "Δ₂ = 2C every round (`baselines.ldp_fl_update`); ε/round is set so the rounds compose to the target.",
        "- **ours: DELM functional mechanism** — a softmax head on a Gaussian functional-mechanism objective "
        "of the pooled pixels, released once per client with the whole budget (no PCA: examples/delm's "
        "best configuration, `delm-nopca`); later rounds are post-processing (the ledger books "
        "`NoOpDpEvent`).",
        "- **ours: FM on HOG, server-side solve** — the same single FM release per client, on histograms of "
        "oriented gradients (`feature_maps.hog_features`, data-independent) and uploaded as the noisy "
        "objective; `NoisyObjectiveSum` repairs and solves the sum of the objectives (examples/delm's "
        "`delm-nopca-sum-hog`).",
        "- **DP-SGD (Opacus)** — `DpSgdTrainer` (Poisson batches, per-sample clipping C, noise z) on every "
        "client every round, FedAvg by `AccountedFedAvg`; the ledger composes each client's "
        "`SelfComposed(PoissonSampled(q, Gaussian(z)), steps)` per round. Opacus' own (RDP-only) ε is in "
        "the notes.",
        "",
        "All noise is seeded (benchmark reproducibility, not a deployment setting): the same noise directions "
        "recur, scaled, at every ε, which is why a method that has not learnt anything can sit consistently "
        "below chance (e.g. Flower on digits).",
        "",
        "Hyper-parameters per dataset (fixed across ε; picked by a few pilot runs at ε = 1 and 8 on this "
        "test accuracy: the central clip C from {0.1, 0.3, 1, 3}, DP-SGD's learning rate and batch from two "
        "choices each, the local SGD of digits for the non-private FedAvg; DELM uses the recommended "
        "configuration of examples/delm, LDP-FL the DELM paper's C = 1): ",
    ]
    for dataset, cfg in result["config"].items():
        lines.append(f"- {dataset}: " + ", ".join(f"{k}={v}" for k, v in cfg.items()))
    lines += [
        "",
        "Wall time: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in result["durations_s"].items())
        + (f"; CPU time of the process {result['cpu_s']:.0f} s" if "cpu_s" in result else "")
        + (f"; load average at the end {result['load_average']}" if "load_average" in result else ""),
        "",
    ]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """Accuracy vs target ε (log x): colour = method, solid = MNIST, dashed = digits; grey = non-private."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    styles = {"mnist": "-", "digits": "--"}
    colors = {method: f"C{i}" for i, method in enumerate(METHODS)}  # one colour per method, however many
    fig, ax = plt.subplots(figsize=(12, 5.5))
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        for method in METHODS:
            pts = sorted(
                (r["target_epsilon"], r["accuracy"]) for r in rows if r["dataset"] == dataset and r["method"] == method
            )
            if pts:
                ax.plot(
                    *zip(*pts),
                    styles.get(dataset, ":"),
                    marker="o",
                    ms=4,
                    color=colors[method],
                    label=f"{LABELS[method]} ({RELATIONS[method].split(':')[0]}), {dataset}",
                )
        left = min((r["target_epsilon"] for r in rows if math.isfinite(r["target_epsilon"])), default=1.0)
        for r in rows:
            if r["dataset"] == dataset and r["method"] == REFERENCE:
                ax.axhline(r["accuracy"], color="grey", lw=0.8, ls=styles.get(dataset, ":"))
                ax.annotate(
                    f"non-private FedAvg, {dataset}: {r['accuracy']:.3f}",
                    (left, r["accuracy"]),
                    fontsize=7,
                    color="grey",
                    va="bottom",
                )
    ax.set_xscale("log")
    ticks = sorted({r["target_epsilon"] for r in rows if math.isfinite(r["target_epsilon"])})
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("ε (ledger, δ = 1e-5; user-level or record-level as labelled)")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    ax.set_title(f"Privacy–utility ({result['mode']}): solid MNIST, dashed digits")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(result: dict, out: Path) -> list[Path]:
    """results.json, results.md and accuracy_vs_epsilon.png in ``out``."""
    from flwr_dp_benchmarks._common import write_outputs

    return write_outputs(result, out, "accuracy_vs_epsilon.png", markdown, plot)


def run_mode(mode: str, seed: int = 0, methods: Sequence[str] = METHODS) -> dict:
    """Run ``MODES[mode]`` (only ``methods``) and wrap the rows with the machine, configuration and timings."""
    from flwr_dp_benchmarks._common import machine

    kwargs = MODES[mode]
    t0, c0 = time.perf_counter(), time.process_time()
    rows = run(
        **kwargs,
        seed=seed,
        methods=tuple(m for m in methods if m != REFERENCE),
        reference=REFERENCE in methods or tuple(methods) == METHODS,
    )
    overrides = kwargs.get("overrides", {})
    config = {d: {**DATASET_CONFIG[d], **overrides.get(d, {})} for d in kwargs["datasets"]}
    feds = {
        d: {
            "num_clients": next(r["num_clients"] for r in rows if r["dataset"] == d),
            "shard_size": next(r["shard_size"] for r in rows if r["dataset"] == d),
            "rounds": kwargs["rounds"][d],
        }
        for d in kwargs["datasets"]
    }
    durations = {d: sum(r["wall_s"] for r in rows if r["dataset"] == d) for d in kwargs["datasets"]}
    durations["total"] = time.perf_counter() - t0
    load = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    return {
        "mode": mode,
        "seed": seed,
        "machine": machine(),
        "created": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "cpu_s": time.process_time() - c0,
        "load_average": load,
        "delta": DELTA,
        "calibration_tolerance": CALIBRATION_TOLERANCE,
        "config": config,
        "federations": feds,
        "relations": RELATIONS,
        "durations_s": durations,
        "rows": rows,
    }


def merge_rerun(old: dict, new: dict, methods: Sequence[str]) -> dict:
    """``old`` with the rows of ``methods`` replaced by those of ``new`` (a rerun of the same mode and seed)."""
    if (old["mode"], old["seed"]) != (new["mode"], new["seed"]):
        raise ValueError(
            f"cannot merge a {new['mode']} run (seed {new['seed']}) into a {old['mode']} "
            f"results file (seed {old['seed']})"
        )
    order = {m: i for i, m in enumerate((REFERENCE,) + METHODS)}
    rows = sorted(
        [r for r in old["rows"] if r["method"] not in methods] + new["rows"],
        key=lambda r: (DATASETS.index(r["dataset"]), order[r["method"]], r["target_epsilon"]),
    )
    reran = old.get("reran", []) + [
        {
            "methods": list(methods),
            "created": new["created"],
            "load_average": new["load_average"],
            "config": new["config"],
        }
    ]
    return {**old, "rows": rows, "config": new["config"], "reran": reran}


def main(argv: Optional[list[str]] = None) -> int:
    """Command line: ``[--quick | --tiny] [--out DIR] [--seed N]`` or ``--report [--out DIR]``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="fewer rounds (≈ 10 min on 2 cores)")
    group.add_argument("--tiny", action="store_true", help="toy sizes for the smoke test (≈ 20 s)")
    parser.add_argument("--out", type=Path, default=ROOT / "flwr_dp_benchmarks" / "privacy_utility")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--report",
        action="store_true",
        help="only rebuild results.md and the plot from OUT/results.json (nothing is run)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=METHODS + (REFERENCE,),
        help="rerun only these methods and replace their rows in OUT/results.json "
        "(same mode and seed as the file; the other rows are kept as they are)",
    )
    args = parser.parse_args(argv)
    if args.report:
        result = json.loads((args.out / "results.json").read_text())
        for path in write(result, args.out):
            print(path)
        return 0
    mode = "tiny" if args.tiny else ("quick" if args.quick else "full")
    if args.methods:
        result = merge_rerun(
            json.loads((args.out / "results.json").read_text()), run_mode(mode, args.seed, args.methods), args.methods
        )
    else:
        result = run_mode(mode, args.seed)
    for path in write(result, args.out):
        print(path)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
