r"""Canary audit evidence (issue 28.4): ledger ε vs Andrew et al.'s one-shot ε estimate and lower bound.

    python flwr_dp_benchmarks/bench_audit.py [--quick | --tiny] [--out flwr_dp_benchmarks/results/audit]

Every row is one run of a strategy with :class:`~flwr_dp_strategies.audit.CanaryAudit` (Andrew, Kairouz, Oh,
Oprea, McMahan, Suriyakumar, ICLR 2024): k inserted canary clients (and k unseen ones for the null), the
strategy's real sampling, clipping, noise, secure aggregation and client mods; the report gives the ε estimate
and the 95 % lower bound for the final model and for all iterates, next to the ledger's ε after the run.

**Real clients.** ``real`` nodes, each with a private synthetic linear-regression shard (20 examples of the
model's ``dim`` features, a shared ground truth plus node noise, seeded by the node id), answer a train message
with ``LOCAL_STEPS`` steps of full-batch gradient descent from the received model; they are served in process by
:class:`LocalGrid` (the benchmark's own Grid: every node runs a real ClientApp with its own Context; the canaries
run behind :class:`~flwr_dp_strategies.audit.CanaryGrid` as the audit does in a deployment).

**Correct configurations** (z calibrated by bisection on the ledger's own accountant so that the planned rounds
compose to the target ε ∈ {1, 8} at δ = 1e-5; the ε reported is the ledger's after the run):

* ``AccountedPoissonFixedClipping`` and ``AccountedAdaptiveClipping``: Poisson sampling with q = ``POISSON_Q`` over
  the real nodes and the k canaries (the audit's population), ``PoissonSampled(q, Gaussian(z))`` per round.
* ``AccountedServerSideFixedClipping``: every node every round (fixed-size sample of N + k), ``Gaussian(z)``.
* ``DistributedDpFedAvg`` with ``distributed_dp_mod`` on the real nodes and the canaries (SecAgg+ and Skellam
  noise; ``min_survivors=1.0``: the noise is split over every sampled client, as the ledger books it).

**Broken configurations** (the alarm, a lower bound above the ledger's ε, should fire), claimed ε = 1:

* ``ddp, noise std ÷ 2 (client mod)``: every client (real and canary) runs ``distributed_dp_mod`` behind
  :func:`halved_noise_mod`, which rewrites the server's ``dp-noise-share`` (a variance) to a quarter before the mod
  reads it: each client adds half the declared noise std; the server books z.
* ``server books z, adds z/3`` (and ``z/10``, ``z/100``): ``UnderNoisedServer``, an
  ``AccountedServerSideFixedClipping`` whose ``_fixed_release`` uses ``z · fraction``.
* ``declared, never noised``: ``AccountedFedAvg``; every client's :class:`UnnoisedDeclaringMod` declares
  ``Gaussian(z)`` (``declare_release``, add-or-remove-one) on its reply and sends the update as it is.

What the audit can see is bounded by k: with k canaries a Clopper–Pearson lower bound at 95 % cannot exceed about
log(k) − 1.7 (≈ 1.8 for k = 50, ≈ 4.5 for k = 1 000), and a factor 2–3 on z moves a Gaussian mechanism's ε at
δ = 1e-5 by less than the bound's slack at these k (``expected_alarm`` in the rows says where it can fire).

``DpSgdTrainer`` (record-level DP inside a client) is audited separately with record-level canaries; it is not
here. Everything is seeded (``--seed``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402

NAME = "audit"
DELTA = 1e-5
CONFIDENCE = 0.95
CLIP = 1.0
POISSON_Q = 0.5
LOCAL_STEPS = 3
LOCAL_LR = 0.5
REAL_UPDATE_NORM = 0.1 * CLIP
EXAMPLES = 20
TARGETS = (1.0, 8.0)
BROKEN_TARGET = 1.0
DDP_BITS = 24

MODES: dict[str, dict[str, Any]] = {
    "full": {"canaries": 1000, "ddp_canaries": 150, "rounds": 10, "real": 20, "dim": 4096},
    "quick": {"canaries": 300, "ddp_canaries": 50, "rounds": 5, "real": 10, "dim": 2048},
    "tiny": {"canaries": 50, "ddp_canaries": 10, "rounds": 3, "real": 4, "dim": 2048},
}
RECORD_MODES: dict[str, dict[str, int]] = {
    "full": {"records": 1000, "canaries": 1000, "guesses": 250},
    "quick": {"records": 300, "canaries": 300, "guesses": 75},
    "tiny": {"records": 100, "canaries": 100, "guesses": 25},
}
"""Record-level audit of ``DpSgdTrainer`` (Steinke, Nasr, Jagielski 2023): n synthetic records (4 Gaussian clusters in
d = 50), m canary records each inserted w.p. ½, one round of 20 epochs at B = 16, lr 1, C = 1 on an MLP 50-32-4;
k+ = k− = ``guesses`` (the bound's cap is set by 2·guesses)."""
"""Sizes. DistributedDpFedAvg runs fewer canaries: SecAgg+ with n clients costs ~n log n key agreements a round in
pure Python (≈ 12 s a round at n = 120, ≈ 57 s at n = 320 on 2 cores), so k = 1 000 would take hours."""


# ============================================================================ the in-process federation
class LocalGrid:
    """The part of a Grid the strategies use: every message is answered in process by ``app`` with the node's own
    Context (kept for the run, as a SuperNode does), a failed ClientApp becoming an error reply."""

    def __init__(self, app: ClientApp, node_ids: Sequence[int]) -> None:
        self.app = app
        self.contexts = {
            int(n): Context(run_id=1, node_id=int(n), node_config={}, state=RecordDict(), run_config={})
            for n in node_ids
        }
        self.errors: list[str] = []

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Any, *, timeout: Optional[float] = None) -> list[Message]:
        from flwr.app import Error

        replies = []
        for msg in messages:
            node = int(msg.metadata.dst_node_id)
            try:
                reply = self.app(msg, self.contexts[node])
            except Exception as err:  # noqa: BLE001 - the runtime turns it into an error reply
                self.errors.append(f"{node}: {err}")
                reply = Message(Error(code=0, reason=str(err)), reply_to=msg)
            reply.metadata.__dict__["_src_node_id"] = node
            replies.append(reply)
        return replies


def _shard(node: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Node ``node``'s synthetic regression data: X (EXAMPLES × dim), y = X·w* + noise (w* shared, seed 0)."""
    truth = np.random.default_rng(0).normal(size=dim) / math.sqrt(dim)
    rng = np.random.default_rng([1, node])
    x = rng.normal(size=(EXAMPLES, dim)) / math.sqrt(dim)  # rows of norm ≈ 1
    return x, x @ truth + 0.1 * rng.normal(size=EXAMPLES)


def real_client_app(dim: int, mods: Sequence[Any] = ()) -> ClientApp:
    """LOCAL_STEPS of gradient descent on the node's shard of 0.5·‖Xw − y‖², from the received model, the update
    scaled down to norm ≤ REAL_UPDATE_NORM (well below C: the canaries, not the real data, are what the audit
    measures, and the real updates only add spread to the null and inserted scores alike)."""
    app = ClientApp(mods=list(mods))
    shards: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        from flwr_dp_strategies.audit.canaries import add_direction, flatten_arrays

        node = int(context.node_id)
        if node not in shards:
            shards[node] = _shard(node, dim)
        x, y = shards[node]
        arrays = next(r for r in msg.content.values() if isinstance(r, ArrayRecord))
        w0 = flatten_arrays(arrays)
        w = w0.copy()
        for _ in range(LOCAL_STEPS):
            w -= LOCAL_LR * x.T @ (x @ w - y)
        update = w - w0
        norm = float(np.linalg.norm(update))
        if norm > REAL_UPDATE_NORM:
            update *= REAL_UPDATE_NORM / norm
        return Message(
            RecordDict(
                {"arrays": add_direction(arrays, update, 1.0), "metrics": MetricRecord({"num-examples": EXAMPLES})}
            ),
            reply_to=msg,
        )

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": EXAMPLES})}), reply_to=msg)

    return app


def initial_model(dim: int) -> ArrayRecord:
    half = dim // 2
    return ArrayRecord({"w": Array(np.zeros(half, np.float32)), "b": Array(np.zeros(dim - half, np.float32))})


class _TaskIdentity:
    """Messages need a run/node/task id, as inside a ServerApp; set one and restore the old on exit."""

    def __enter__(self) -> "_TaskIdentity":
        from flwr.supercore.task_identity import TaskIdentity

        self._saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
        return self

    def __exit__(self, *exc: Any) -> None:
        from flwr.supercore.task_identity import TaskIdentity

        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = self._saved


# ============================================================================ the broken pieces
def _under_noised_server(fraction: float) -> type:
    from flwr_dp_strategies import AccountedServerSideFixedClipping

    class UnderNoisedServer(AccountedServerSideFixedClipping):
        """Books ``Gaussian(z)`` (the ledger's event is untouched) but releases with ``z · release_fraction``."""

        release_fraction = fraction

        def _fixed_release(self, summed: Any, generator: np.random.Generator) -> ArrayRecord:
            z = self.noise_multiplier
            self.noise_multiplier = z * self.release_fraction
            try:
                return super()._fixed_release(summed, generator)
            finally:
                self.noise_multiplier = z

    return UnderNoisedServer


def halved_noise_mod(inner: Callable[..., Message]) -> Callable[..., Message]:
    """Wrap ``distributed_dp_mod``: the server's noise share (a variance) is quartered before the mod reads it, so
    the client adds half the noise std the server planned (and booked)."""
    from flwr_dp_strategies.secure_aggregation.protocol import RECORD

    def mod(msg: Message, ctxt: Context, call_next: Callable[..., Message]) -> Message:
        record = msg.content.config_records.get(RECORD) if RECORD in msg.content else None
        if record is not None and "dp-noise-share" in record:
            record["dp-noise-share"] = float(record["dp-noise-share"]) / 4.0
        return inner(msg, ctxt, call_next)

    return mod


class UnnoisedDeclaringMod:
    """Declares ``Gaussian(z)`` (add-or-remove-one, sensitivity the update's L2 bound) on every train reply and
    sends the update un-noised: the client's declaration is a lie the ledger cannot see."""

    def __init__(self, noise_multiplier: float) -> None:
        self.noise_multiplier = noise_multiplier

    def __call__(self, msg: Message, ctxt: Context, call_next: Callable[..., Message]) -> Message:
        from dp_accounting.dp_event import GaussianDpEvent

        from flwr_dp_strategies.declarations import declare_release

        reply = call_next(msg, ctxt)
        if msg.metadata.message_type.split(".")[0] == "train" and not reply.has_error():
            declare_release(
                reply.content,
                GaussianDpEvent(self.noise_multiplier),
                label="un-noised (broken)",
                neighboring_relation="add_or_remove_one",
            )
        return reply


# ============================================================================ calibration
def calibrated_z(event_of: Callable[[float], Any], rounds: int, target: float) -> float:
    """z whose ``rounds`` events ``event_of(z)`` compose to ``target`` on the ledger (PrivacyLedger, min RDP/PLD)."""
    from flwr_dp_benchmarks.bench_privacy_utility import calibrate, ledger_epsilon

    z, _ = calibrate(
        lambda x, how: ledger_epsilon("add_or_remove_one", [event_of(x)] * rounds, method=how),
        target,
        increasing=False,
        lo=0.05,
        hi=3000.0,
    )
    return z


def _ddp_event(z: float, n: int, dim: int) -> Any:
    from flwr_dp_strategies.privacy.mechanisms.distributed_dp import (
        DistributedDpParams,
        calibrate_skellam,
        scale_for_bits,
    )

    scale = scale_for_bits(bits=DDP_BITS, clip_norm=CLIP, dim=dim, n_clients=n, noise_multiplier=z, min_survivors=n)
    params = DistributedDpParams(dim=dim, clip_norm=CLIP, scale=scale, bits=DDP_BITS, rotation_seed=0)
    return calibrate_skellam(params, noise_multiplier=z, n_clients=n).event


# ============================================================================ one audited run
def configurations(size: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows to run: name, strategy kind, target ε, broken or not, what the client mods are."""
    rows = []
    for kind in ("poisson-fixed", "adaptive", "server-fixed", "ddp"):
        for target in TARGETS:
            rows.append({"kind": kind, "target": target, "broken": ""})
    rows += [
        {"kind": "ddp", "target": BROKEN_TARGET, "broken": "client-half-noise"},
        {"kind": "ddp", "target": 8.0, "broken": "client-half-noise"},
        {"kind": "server-fixed", "target": BROKEN_TARGET, "broken": "server-z/3", "fraction": 1 / 3},
        {"kind": "server-fixed", "target": BROKEN_TARGET, "broken": "server-z/10", "fraction": 0.1},
        {"kind": "server-fixed", "target": BROKEN_TARGET, "broken": "server-z/100", "fraction": 0.01},
        {"kind": "declared", "target": BROKEN_TARGET, "broken": "declared-unnoised"},
    ]
    return rows


LABELS = {
    "poisson-fixed": "AccountedPoissonFixedClipping",
    "adaptive": "AccountedAdaptiveClipping",
    "server-fixed": "AccountedServerSideFixedClipping",
    "ddp": "DistributedDpFedAvg + distributed_dp_mod",
    "declared": "AccountedFedAvg + declaring client mod",
}
BROKEN_LABELS = {
    "client-half-noise": "BROKEN: client mod adds noise std ÷ 2",
    "server-z/3": "BROKEN: server books z, adds z/3",
    "server-z/10": "BROKEN: server books z, adds z/10",
    "server-z/100": "BROKEN: server books z, adds z/100",
    "declared-unnoised": "BROKEN: client declares Gaussian(z), sends un-noised",
}


def build(cfg: dict[str, Any], size: dict[str, Any], seed: int, canaries: int) -> tuple[Any, dict[str, Any]]:
    """(strategy, audit keyword arguments and the real clients' mods) of one configuration, z calibrated."""
    from dp_accounting.dp_event import GaussianDpEvent, PoissonSampledDpEvent
    from flwr.serverapp.strategy import FedAvg

    import flwr_dp_strategies as fds

    rounds, n = size["rounds"], size["real"] + canaries
    kind, target = cfg["kind"], cfg["target"]
    rng = np.random.default_rng([seed, 7])
    extra: dict[str, Any] = {"canary_mods": [], "real_mods": [], "canary_norm": None}
    if kind in ("poisson-fixed", "adaptive"):
        m = max(1, round(POISSON_Q * n))
        z = calibrated_z(lambda x: PoissonSampledDpEvent(m / n, GaussianDpEvent(x)), rounds, target)
        if kind == "poisson-fixed":
            strategy = fds.AccountedPoissonFixedClipping(FedAvg(fraction_evaluate=0.0), z, CLIP, m, rng=rng)
        else:
            strategy = fds.AccountedAdaptiveClipping(
                FedAvg(fraction_evaluate=0.0),
                z,
                m,
                initial_clipping_norm=CLIP,
                target_clipped_quantile=0.5,
                clip_norm_lr=0.2,
                clipped_count_stddev=max(m / 20.0, z),
                rng=rng,
            )
            extra["canary_norm"] = 100.0 * CLIP  # above every C_t the run reaches (C grows ≤ e^0.1 a round)
    elif kind == "server-fixed":
        z = calibrated_z(GaussianDpEvent, rounds, target)
        cls = _under_noised_server(cfg["fraction"]) if cfg["broken"] else fds.AccountedServerSideFixedClipping
        strategy = cls(FedAvg(fraction_evaluate=0.0), z, CLIP, n, rng=rng)
    elif kind == "ddp":
        from client_mods.distributed_dp_mod import make_distributed_dp_mod
        from flwr_dp_strategies.secure_aggregation.identity import InProcessRoster

        z = calibrated_z(lambda x: _ddp_event(x, n, size["dim"]), rounds, target)
        roster = InProcessRoster(n + 2048)  # the real nodes and the canaries, all admitted by the operator
        strategy = fds.DistributedDpFedAvg(
            fraction_evaluate=0.0,
            noise_multiplier=z,
            clipping_norm=CLIP,
            bits=DDP_BITS,
            min_survivors=1.0,
            rotation_seed=seed,
        )
        for key, node_seed in (("canary_mods", 1), ("real_mods", 2)):
            # the floor these clients require: the booked z (the broken ones: the half they add)
            floor = z / 2.0 if cfg["broken"] else z
            mod = make_distributed_dp_mod(
                rng=np.random.default_rng([seed, node_seed]), min_noise_multiplier=floor * 0.999, identity=roster
            )
            extra[key] = [halved_noise_mod(mod) if cfg["broken"] else mod]
    else:  # declared
        z = calibrated_z(GaussianDpEvent, rounds, target)
        from flwr_dp_strategies.privacy import PrivacyLedger

        # add-or-remove-one, as declared (AccountedFedAvg's default ledger is replace-one: it would double z's
        # sensitivity and book ε ≈ 2 for the calibrated z)
        strategy = fds.AccountedFedAvg(
            fraction_evaluate=0.0,
            min_available_nodes=2,
            ledger=PrivacyLedger(DELTA, neighboring_relation="add_or_remove_one"),
        )
        extra["canary_mods"] = extra["real_mods"] = [UnnoisedDeclaringMod(z)]
        extra["canary_norm"] = CLIP
    extra["z"] = z
    return strategy, extra


def audited_run(cfg: dict[str, Any], size: dict[str, Any], seed: int) -> dict[str, Any]:
    """One configuration with the audit: the report's figures, the ledger's ε, z, participation, time."""
    import random

    from flwr_dp_strategies.audit import CanaryAudit

    canaries = size["ddp_canaries"] if cfg["kind"] == "ddp" else size["canaries"]
    random.seed(seed)  # Flower samples nodes with `random` and some noise with np.random
    np.random.seed(seed)
    strategy, extra = build(cfg, size, seed, canaries)
    real = LocalGrid(real_client_app(size["dim"], extra["real_mods"]), range(101, 101 + size["real"]))
    audit = CanaryAudit(
        strategy,
        num_canaries=canaries,
        canary_norm=extra["canary_norm"],
        canary_mods=extra["canary_mods"],
        seed=seed,
        confidence=CONFIDENCE,
        delta=DELTA,
    )
    t0 = time.perf_counter()
    with _TaskIdentity():
        _, report = audit.start(real, initial_model(size["dim"]), num_rounds=size["rounds"])
    seconds = time.perf_counter() - t0
    assert audit.grid is not None
    slots = sum(len(nodes) for nodes in audit.grid.canary_participation.values())
    return {
        "configuration": BROKEN_LABELS.get(cfg["broken"], LABELS[cfg["kind"]]),
        "kind": cfg["kind"],
        "broken": cfg["broken"],
        "target_epsilon": cfg["target"],
        "noise_multiplier": extra["z"],
        "ledger_epsilon": report.ledger_epsilon,
        "estimate_final": report.epsilon_estimate_final,
        "estimate_all_iterates": report.epsilon_estimate_all_iterates,
        "lower_bound_final": report.epsilon_lower_bound_final,
        "lower_bound_all_iterates": report.epsilon_lower_bound_all_iterates,
        "shift_bound_final": report.shift_lower_bound_final,
        "shift_bound_all_iterates": report.shift_lower_bound_all_iterates,
        "alarm": bool(report.alarm),
        "canaries": canaries,
        "rounds": size["rounds"],
        "real_clients": size["real"],
        "dim": size["dim"],
        "delta": DELTA,
        "confidence": CONFIDENCE,
        "seed": seed,
        "canary_participation_rate": slots / (canaries * size["rounds"]),
        "canary_errors": len(audit.grid.canary_errors),
        "real_errors": len(real.errors),
        "seconds": seconds,
    }


def baseline_seconds(cfg: dict[str, Any], size: dict[str, Any], seed: int) -> float:
    """The same configuration without canaries (the real clients only): the audit's cost is the ratio."""
    strategy, extra = build(cfg, size, seed, 0)
    real = LocalGrid(real_client_app(size["dim"], extra["real_mods"]), range(101, 101 + size["real"]))
    t0 = time.perf_counter()
    with _TaskIdentity():
        strategy.start(real, initial_model(size["dim"]), num_rounds=size["rounds"])
    return time.perf_counter() - t0


def audit_rows(
    *, canaries: int, ddp_canaries: int, rounds: int, real: int, dim: int, seed: int = 0, only: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """Every configuration's audited run (``only``: kinds or broken names to keep)."""
    from flwr_dp_benchmarks._common import quiet_loggers

    size = {"canaries": canaries, "ddp_canaries": ddp_canaries, "rounds": rounds, "real": real, "dim": dim}
    out = []
    with quiet_loggers():  # the audit's summary and the alarm's WARNING are in the rows
        for i, cfg in enumerate(configurations(size)):
            if only and cfg["kind"] not in only and cfg["broken"] not in only:
                continue
            out.append({**audited_run(cfg, size, seed + i), "index": i})
            print(
                f"[audit] {out[-1]['configuration']} ε={cfg['target']:g}: {out[-1]['seconds']:.1f} s",
                file=sys.stderr,
                flush=True,
            )
    return out


# ============================================================================ record level: DpSgdTrainer
def _record_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 1.5, (4, 50))
    y = rng.integers(0, 4, n)
    return (centers[y] + rng.normal(0.0, 1.0, (n, 50))).astype(np.float32), y.astype(np.int64)


def _record_model() -> Any:
    from torch import nn

    return nn.Sequential(nn.Linear(50, 32), nn.ReLU(), nn.Linear(32, 4))


def _record_round(z: float, size: dict[str, int], seed: int, *, noiseless: bool = False) -> Any:
    """One DP-SGD round on n records + the inserted canaries; the audit of its output beside the declared ε.
    ``noiseless``: the broken trainer (Opacus' noise replaced by zeros, its accountant still books z)."""
    import warnings
    from contextlib import nullcontext
    from unittest import mock

    import torch

    from client_mods.dp_sgd_trainer import DpSgdTrainer
    from client_mods.record_audit import insert_canaries, make_canary_records, record_audit_bound, score_canaries

    x, y = _record_data(size["records"], seed)
    canaries = make_canary_records(size["canaries"], (x, y), seed=seed + 1)
    data, mask = insert_canaries((x, y), canaries, seed=seed + 2)
    torch.manual_seed(seed)
    received = _record_model()
    trainer = DpSgdTrainer(
        received,
        noise_multiplier=z,
        local_epochs=20,
        lr=1.0,
        batch_size=16,
        max_grad_norm=1.0,
        target_delta=DELTA,
        device="cpu",
        seed=seed + 3,
    )
    patch = (
        mock.patch(
            "opacus.optimizers.optimizer._generate_noise",
            lambda std, reference, generator=None, secure_mode=False: torch.zeros_like(reference),
        )
        if noiseless
        else nullcontext()
    )
    with warnings.catch_warnings(), patch:
        warnings.simplefilter("ignore")
        result = trainer.train_round(received.state_dict(), data)
    trained = _record_model()
    trained.load_state_dict(result.state_dict)
    scores = score_canaries(trained, canaries, reference=received)
    k = size["guesses"]
    audit = record_audit_bound(
        scores, mask, k, k, confidence=CONFIDENCE, delta=result.delta, declared_epsilon=result.epsilon
    )
    return audit, result


def record_rows(size: dict[str, int], seed: int = 0) -> list[dict[str, Any]]:
    """DpSgdTrainer at declared ε ∈ TARGETS (z calibrated on the trainer's own accountant), and the broken trainer
    that declares z = the ε = 1 calibration but adds no noise."""
    import torch

    from client_mods.dp_sgd_accounting import history_epsilon

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _, probe = _record_round(1.0, size, seed)
        q, steps = probe.sample_rate, probe.steps

        def calibrated(target: float) -> float:
            lo, hi = 0.05, 200.0
            for _ in range(60):
                mid = math.sqrt(lo * hi)
                lo, hi = (mid, hi) if history_epsilon([(mid, q, steps)], DELTA) > target else (lo, mid)
            return hi

        rows = []
        for target, broken in [(t, False) for t in TARGETS] + [(BROKEN_TARGET, True)]:
            z = calibrated(target)
            t0 = time.perf_counter()
            audit, result = _record_round(z, size, seed, noiseless=broken)
            rows.append(
                {
                    "configuration": (
                        "BROKEN: DpSgdTrainer declares z, adds no noise" if broken else "DpSgdTrainer (record level)"
                    ),
                    "broken": "declared-unnoised-records" if broken else "",
                    "target_epsilon": target,
                    "noise_multiplier": z,
                    "declared_epsilon": result.epsilon,
                    "guesses_correct": audit.guesses_correct,
                    "guesses_made": audit.guesses_made,
                    "lower_bound": audit.epsilon_lower_bound,
                    "max_lower_bound": _one_run_cap(size),
                    "alarm": bool(audit.contradicts_declaration),
                    "seconds": time.perf_counter() - t0,
                    **size,
                }
            )
            print(f"[audit] {rows[-1]['configuration']} ε={target:g}: {rows[-1]['seconds']:.1f} s", file=sys.stderr)
        return rows
    finally:
        torch.set_num_threads(saved)


def _one_run_cap(size: dict[str, int]) -> float:
    from flwr_dp_strategies.privacy.analyses.audit import one_run_lower_bound

    r = 2 * size["guesses"]
    return float(one_run_lower_bound(r, r, size["canaries"], delta=DELTA, confidence=CONFIDENCE))


# ============================================================================ run.py rows and the table
def run(*, canaries: int, ddp_canaries: int, rounds: int, real: int, dim: int, seed: int = 0) -> list[dict]:
    """run.py's rows: per configuration, the audited run's wall time vs the same run without canaries; the audit's
    figures ride along in ``audit`` (and the notes)."""
    from flwr_dp_benchmarks._common import quiet_loggers, row

    size = {"canaries": canaries, "ddp_canaries": ddp_canaries, "rounds": rounds, "real": real, "dim": dim}
    rows = []
    for result in audit_rows(seed=seed, **size):
        i = result["index"]
        with quiet_loggers():
            base = baseline_seconds(configurations(size)[i], size, seed + i)
        params = {
            k: result[k]
            for k in (
                "kind",
                "broken",
                "target_epsilon",
                "noise_multiplier",
                "canaries",
                "rounds",
                "real_clients",
                "dim",
                "delta",
                "confidence",
                "seed",
            )
        }
        r = row(
            NAME,
            f"{result['configuration']}, ε={result['target_epsilon']:g}",
            params,
            metric="time_s",
            values=[result["seconds"]],
            baseline="the same run without canaries",
            baseline_values=[base],
            target="reported",
            notes=_note(result),
        )
        r["audit"] = result
        rows.append(r)
    return rows


def _note(r: dict[str, Any]) -> str:
    return (
        f"ledger ε {r['ledger_epsilon']:.3g}; estimate {r['estimate_final']:.3g} final / "
        f"{r['estimate_all_iterates']:.3g} all iterates; lower bound (counts) {r['lower_bound_final']:.3g} / "
        f"{r['lower_bound_all_iterates']:.3g}; lower bound (shift model) {r['shift_bound_final']:.3g} / "
        f"{r['shift_bound_all_iterates']:.3g}; alarm {'YES' if r['alarm'] else 'no'}"
    )


def max_lower_bound(k: int) -> float:
    """The largest count bound k canaries can give (perfect separation), at DELTA and CONFIDENCE shared by the
    report's four bounds (each at error (1 − CONFIDENCE)/4, as :class:`AuditReport` computes them)."""
    from flwr_dp_strategies.privacy.analyses.audit import epsilon_lower_bound

    level = 1.0 - (1.0 - CONFIDENCE) / 4.0
    return float(epsilon_lower_bound(np.ones(k), np.zeros(k), DELTA, confidence=level).epsilon)


def markdown(result: dict[str, Any]) -> str:
    size = result["size"]
    lines = [
        f"# Canary audit ({result['mode']} run, {result['created']})",
        "",
        f"Andrew et al. (ICLR 2024) one-shot audit, `CanaryAudit`: {size['canaries']} canaries "
        f"({size['ddp_canaries']} for DistributedDpFedAvg), {size['rounds']} rounds, {size['real']} real clients "
        f"(linear regression, {LOCAL_STEPS} GD steps), model dim {size['dim']}, C = {CLIP}, Poisson q = {POISSON_Q}, "
        f"δ = {DELTA:g}; the four lower bounds hold together at {CONFIDENCE:.0%} (ε_lo: Clopper–Pearson counts, "
        f"no shape assumption; ε_S: the additive-shift model, exact null, any noise; all "
        f"iterates: max over rounds for ε̂ and ε_lo, the matched filter Σ Δₜ/‖Δₜ‖² for ε_S). z calibrated on the "
        f"ledger for the target ε; ε below is the ledger's after the run. Largest count bound the canaries can "
        f"give (perfect separation): "
        f"{result['max_lower_bound']:.2f} (k = {size['canaries']}), {result['max_lower_bound_ddp']:.2f} "
        f"(k = {size['ddp_canaries']}). Machine: {result['machine']['cpu_count']} CPUs; total "
        f"{result['seconds']:.0f} s."
        + (" `DpSgdTrainer` (record level) is in the second table." if result.get("record_rows") else ""),
        "",
        "| configuration | target ε | z | ledger ε | ε̂ final | ε̂ all iterates | ε_lo final | ε_lo all iterates | "
        "ε_S final | ε_S all iterates | canary rate | alarm | s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        alarm = (
            ("**YES**" if r["alarm"] else "no") if r["broken"] else ("**YES (false alarm)**" if r["alarm"] else "no")
        )
        lines.append(
            f"| {r['configuration']} | {r['target_epsilon']:g} | {r['noise_multiplier']:.3g} | "
            f"{r['ledger_epsilon']:.3g} | {r['estimate_final']:.3g} | {r['estimate_all_iterates']:.3g} | "
            f"{r['lower_bound_final']:.3g} | {r['lower_bound_all_iterates']:.3g} | "
            f"{r['shift_bound_final']:.3g} | {r['shift_bound_all_iterates']:.3g} | "
            f"{r['canary_participation_rate']:.2f} | {alarm} | {r['seconds']:.0f} |"
        )
    records = result.get("record_rows") or []
    if records:
        size = records[0]
        lines += [
            "",
            f"Record level, `DpSgdTrainer` (Steinke, Nasr, Jagielski 2023, one run): {size['records']} records + "
            f"{size['canaries']} canary records each inserted w.p. ½, one round (20 epochs, B = 16, C = 1, MLP "
            f"50-32-4), {2 * size['guesses']} guesses (the top and bottom {size['guesses']} scores; all right gives "
            f"{size['max_lower_bound']:.2f}), one-run lower bound at {CONFIDENCE:.0%}, δ = {DELTA:g}. The estimate of "
            "Andrew et al. is client level and has no record-level counterpart here.",
            "",
            "| configuration | target ε | z | declared ε | correct / guesses | ε_lo (one run) | alarm | s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in records:
            alarm = "**YES**" if r["alarm"] else "no"
            if r["alarm"] and not r["broken"]:
                alarm = "**YES (false alarm)**"
            lines.append(
                f"| {r['configuration']} | {r['target_epsilon']:g} | {r['noise_multiplier']:.3g} | "
                f"{r['declared_epsilon']:.3g} | {r['guesses_correct']} / {r['guesses_made']} | "
                f"{r['lower_bound']:.3g} | {alarm} | {r['seconds']:.0f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    from flwr_dp_benchmarks._common import machine

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="*", default=(), help="kinds or broken names to run")
    parser.add_argument("--dim", type=int, default=None, help="override the mode's model dimension")
    parser.add_argument("--out", type=Path, default=ROOT / "flwr_dp_benchmarks" / "results" / "audit")
    args = parser.parse_args(argv)
    mode = "tiny" if args.tiny else ("quick" if args.quick else "full")
    size = dict(MODES[mode])
    if args.dim is not None:
        size["dim"] = args.dim
    t0 = time.perf_counter()
    rows = audit_rows(seed=args.seed, only=tuple(args.only), **size)
    records = record_rows(RECORD_MODES[mode], seed=args.seed) if not args.only or "record" in args.only else []
    result = {
        "mode": mode,
        "created": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": machine(),
        "size": size,
        "seconds": time.perf_counter() - t0,
        "max_lower_bound": max_lower_bound(size["canaries"]),
        "max_lower_bound_ddp": max_lower_bound(size["ddp_canaries"]),
        "rows": rows,
        "record_rows": records,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1, allow_nan=True, default=float))
    (args.out / "results.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
