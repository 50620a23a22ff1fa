r"""Distributed DP under secure aggregation against central DP at the same noise: accuracy, bytes, round time.

    python flwr_dp_benchmarks/bench_distributed_dp.py [--quick | --tiny] [--rounds T] [--jobs K]
        [--out flwr_dp_benchmarks/distributed_dp]
    python flwr_dp_benchmarks/bench_distributed_dp.py --secagg-scale [--secagg-clients 100,300,1000]

**(a) Accuracy** (the setting of ``bench_user_level.py``, whose data, model and local
training this reuses: MNIST split IID over N = 1 000 clients of 60 examples, the
784-64-10 MLP, 2 local epochs of SGD, batch 20, rate 0.1). Every round the server
draws m = 100 clients uniformly (fixed size: under secure aggregation the server
picks the sample, so there is no amplification by sampling against it); the same
clients and the same local-training seeds in every method. For each target
ε ∈ {1, 2, 8} at δ = 1e-5 over the T rounds, z is the noise multiplier for which a
:class:`~flwr_dp_strategies.privacy.PrivacyLedger` holding one ``SkellamDpEvent`` per
round (the event :class:`~flwr_dp_strategies.DistributedDpFedAvg` books, from
``calibrate_skellam`` at the parameters ``scale_for_bits`` picks for b = 20) reaches ε
(regula-falsi bisection of ``bench_privacy_utility.calibrate`` on the ledger). Then,
at that same z, the same C and the same clients:

* ``central``: the clipped updates' sum plus N(0, (zC)²) per coordinate, divided by m;
* ``ddp-b`` for each b: every client runs ``encode_update`` (clip C, rotation, scale s =
  ``scale_for_bits(b, ...)``, conditional rounding, Sk(μ/m) with μ from
  ``calibrate_skellam``, wrap mod 2^b), the server forms ``modular_sum`` and
  ``decode_sum`` and divides by m. That sum is exactly what the secure round reveals
  (``tests/test_secure_aggregation.py`` proves the protocol's sum exact under dropouts),
  so the masks are left out here and timed in (c). Where ``scale_for_bits`` raises
  (b bits cannot hold the sum at that z) the row says so and gives the largest z that b
  bits hold;
* ``central-redraw``: ``central`` again with another noise draw (same clients, same
  local-training seeds): at z = 14-26 one run's accuracy moves by points from the noise
  draw alone, and a difference between methods means something only beyond this spread;
* ``fedavg``: the plain mean of the unclipped updates (ε = ∞).

Accuracy is reported after the last round and as the mean over the last 5 rounds (less
noisy; the Δ column uses it).

Reported per row: the ledger ε of what was released (Skellam RDP for ``ddp-b``,
Gaussian for ``central``, both without amplification), the ε the same central
release would have with Poisson sampling at q = m/N (what secure aggregation gives up),
the effective noise multiplier (noise std / C; ≥ z for ``ddp-b``: the rounding
inflates the sensitivity when s is small) and the final test accuracy.

**(b) Upload bytes** per client: ⌈D·b/8⌉ (D = d: the rotation pads nothing since issue 29), the
size of the packed masked vector, against the dense float32 update 4·d.

**(c) Round wall time** of one full secure round with real crypto: ``DistributedDpFedAvg``
(b = 20) on ``tests/secagg_harness.LoopbackGrid``, which runs a real ClientApp behind
``distributed_dp_mod`` for each of n = 100 nodes in this process (ECDH, Shamir, Fernet,
ChaCha20 masks), with the complete graph and with a SecAgg+ neighbourhood of k = 21;
against a Flower ``FedAvg`` round and an ``AccountedServerSideFixedClipping`` (central DP)
round on the same grid and ClientApp (the same local training). Rounds of the
strategies alternate (ABCD, DCBA, ...); the ratio is median(subject)/median(FedAvg).
The secure round's time is split into the clients' local training, encoding
(``encode_update``), the rest of the clients' work (crypto: key generation and
agreement, Shamir shares, Fernet, ChaCha20 masks, packing) and the server's own time
(of which the unmask stage and decoding, in ``aggregate_train``).

**(d) Secure aggregation at scale** (``--secagg-scale``, written to ``OUT/secagg_scale.{md,json}``,
nothing else touched): one full secure round of ``DistributedDpFedAvg`` (b = 20, k and t from the
strategy's defaults for 5 % dropout) at 100, 300 and 1 000 clients per round (``--secagg-clients``),
5 % of them dying after sharing their keys, every client played serially in this process; server
unmask seconds, client crypto seconds per client and upload bytes against dense float32, with our
primitives (prime-field Shamir, batched key agreement, streamed masks) and, back to back, with
Flower's own (``crypto.shamir`` and per-pair ``generate_shared_key``) as the peer baseline; plus the
Shamir sharing and reconstruction alone at the same sizes.

**Choices.** T = 40 rounds (``--rounds``), as in ``bench_user_level.py`` so the central
rows can be read against its unamplified Flower row. C = 0.3: the best C of that
benchmark's grid (0.3, 1, 3) for fixed clipping without amplification, at every ε (the
noise here is as large; not tuned again). b = 14 is added to the issue's 20/16/12 to show
where the quantisation cost starts. All clients survive (no dropouts), so each adds
μ/m with m = the clients per round (``DistributedDpFedAvg``'s default min_survivors =
0.8 would add 1.25× the variance for robustness to dropouts).

Everything is seeded (``--seed``): a benchmark, not a deployment.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import json
import math
import os
import random
import statistics
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Optional

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import numpy as np  # noqa: E402

from flwr_dp_benchmarks._common import quiet_loggers  # noqa: E402
from flwr_dp_benchmarks.bench_privacy_utility import (  # noqa: E402
    DELTA,
    Federation,
    _TaskIdentity,
    arrays_params,
    calibrate,
    ledger_epsilon,
    make_federation,
    mlp_arrays,
    params_reply,
)
from flwr_dp_benchmarks.bench_user_level import CONFIG as USER_LEVEL_CONFIG  # noqa: E402
from flwr_dp_benchmarks.bench_user_level import _local, _Serial  # noqa: E402

EPSILONS = (1.0, 2.0, 8.0)
BITS = (20, 16, 14, 12)
CALIBRATION_BITS = 20  # z is calibrated on the Skellam event at this b (the others' ε are reported as they come)

CONFIG: dict[str, Any] = dict(
    {k: USER_LEVEL_CONFIG[k] for k in ("num_clients", "hidden", "local_lr", "local_batch", "local_epochs")},
    clients_per_round=100,
    rounds=40,
    clip=0.3,
    epsilons=EPSILONS,
    bits=BITS,
    timing_clients=100,
    timing_shares=(None, 21),
    timing_bits=20,
    timing_repeats=2,
)
MODES: dict[str, dict[str, Any]] = {
    "full": {},
    "quick": {"epsilons": (8.0,), "rounds": 20, "timing_shares": (21,), "timing_repeats": 1},
    "tiny": {
        "num_clients": 50,
        "clients_per_round": 5,
        "max_train": 3000,
        "rounds": 2,
        "epsilons": (8.0,),
        "bits": (20, 12),
        "timing_clients": 4,
        "timing_shares": (None,),
        "timing_repeats": 1,
    },
}


@functools.lru_cache(maxsize=2)
def _federation(num_clients: int, max_train: Optional[int]) -> Federation:
    """``make_federation('mnist', ...)``, loaded once per process; for the toy sizes of ``--tiny`` on a
    checkout without ``../shared/data``, scikit-learn's embedded digits drawn on MNIST's 28×28 canvas."""
    try:
        return make_federation("mnist", num_clients, max_train=max_train)
    except FileNotFoundError:
        if max_train is None:  # a real run needs MNIST: say so
            raise
        return _digits_on_mnist_canvas(num_clients, max_train)


def _digits_on_mnist_canvas(num_clients: int, max_train: int) -> Federation:
    """Digits (8×8) upscaled ×3 and padded to 28×28 = 784 features, split as ``make_federation`` does."""
    from flwr_dp_experiments.datasets import load_dataset

    def canvas(x: np.ndarray) -> np.ndarray:
        big = np.kron(x.reshape(-1, 8, 8), np.ones((3, 3)))
        return np.pad(big, ((0, 0), (2, 2), (2, 2))).reshape(len(x), 28 * 28).astype(np.float32)

    x_tr, y_tr, x_te, y_te = load_dataset("digits")
    order = np.random.default_rng(42).permutation(len(y_tr))[:max_train]
    per = len(order) // num_clients
    shards = tuple((canvas(x_tr[idx]), y_tr[idx]) for idx in order[: per * num_clients].reshape(num_clients, per))
    return Federation("digits-28x28", shards, canvas(x_te), y_te, 10)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Flower's logger at ERROR and warnings off inside the call; both restored after it."""
    with quiet_loggers(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _one_thread() -> tuple[int, Any]:
    """torch and BLAS at one thread (a small MLP on 20 examples, norms of 5e4 floats: a thread pool only spins
    on a shared 2-core box; OpenBLAS' ``nrm2`` in ``np.linalg.norm`` kept both cores busy). Undo with
    :func:`_restore_threads`."""
    import torch
    from threadpoolctl import threadpool_limits

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    return threads, threadpool_limits(1)


def _restore_threads(saved: tuple[int, Any]) -> None:
    import torch

    torch.set_num_threads(saved[0])
    saved[1].restore_original_limits()


# ============================================================================ calibration
def _ddp_parameters(bits: int, z: float, cfg: dict[str, Any], dim: int) -> tuple[Any, Any]:
    """(DistributedDpParams, SkellamCalibration) of a round: s from ``scale_for_bits``; ValueError if b cannot hold it."""
    from flwr_dp_strategies.privacy.mechanisms.distributed_dp import (
        DistributedDpParams,
        calibrate_skellam,
        scale_for_bits,
    )

    m = cfg["clients_per_round"]
    scale = scale_for_bits(bits=bits, clip_norm=cfg["clip"], dim=dim, n_clients=m, noise_multiplier=z, min_survivors=m)
    params = DistributedDpParams(dim=dim, clip_norm=cfg["clip"], scale=scale, bits=bits, rotation_seed=0)
    return params, calibrate_skellam(params, noise_multiplier=z, n_clients=m)


@functools.lru_cache(maxsize=None)
def _ledger_eps(
    kind: str, z: float, rounds: int, bits: int, clip: float, m: int, n: int, dim: int, method: str = "best"
) -> float:
    """ε at δ of ``rounds`` releases: ``skellam`` (ddp at b bits), ``gaussian`` or ``poisson`` (q = m/n)."""
    from dp_accounting.dp_event import GaussianDpEvent, PoissonSampledDpEvent

    if kind == "skellam":
        cfg = {"clients_per_round": m, "clip": clip}
        event = _ddp_parameters(bits, z, cfg, dim)[1].event
    elif kind == "gaussian":
        event = GaussianDpEvent(z)
    else:
        event = PoissonSampledDpEvent(m / n, GaussianDpEvent(z))
    return ledger_epsilon("add_or_remove_one", [event] * rounds, method=method)


def noise_multiplier_for(target: float, cfg: dict[str, Any], dim: int) -> float:
    """z whose ``rounds`` Skellam events (b = CALIBRATION_BITS) compose to ``target`` on the ledger."""
    key = (cfg["rounds"], CALIBRATION_BITS, cfg["clip"], cfg["clients_per_round"], cfg["num_clients"], dim)
    z, _ = calibrate(
        lambda x, how: _ledger_eps("skellam", x, *key, method=how), target, increasing=False, lo=0.3, hi=300.0
    )
    return z


def largest_z_for_bits(bits: int, cfg: dict[str, Any], dim: int) -> float:
    """The largest z at which ``scale_for_bits`` finds a scale for b bits (bisection on the ValueError)."""
    lo, hi = 1e-3, 1e4
    try:
        _ddp_parameters(bits, lo, cfg, dim)
    except ValueError:
        return 0.0
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        try:
            _ddp_parameters(bits, mid, cfg, dim)
            lo = mid
        except ValueError:
            hi = mid
    return lo


# ============================================================================ (a) accuracy
def _flat(params: list) -> np.ndarray:
    return np.concatenate([np.asarray(p, dtype=np.float64).ravel() for p in params])


def _unflat(vector: np.ndarray, like: list) -> list:
    out, offset = [], 0
    for p in like:
        out.append(vector[offset : offset + p.size].reshape(p.shape).astype(p.dtype))
        offset += p.size
    return out


def _clip(x: np.ndarray, c: float) -> np.ndarray:
    norm = float(np.sqrt(np.dot(x, x)))
    return x * (c / norm) if norm > c else x


@_quiet()
def run_accuracy(method: str, target: float, z: float, cfg: dict[str, Any], seed: int) -> dict:
    """T rounds of one method (``fedavg``, ``central`` or ``ddp-<b>``) at noise multiplier z; accuracy per round."""
    from flwr_dp_experiments.baselines import evaluate, get_params, make_mlp

    from flwr_dp_strategies.privacy.mechanisms.distributed_dp import decode_sum, encode_update, modular_sum

    fed = _federation(cfg["num_clients"], cfg.get("max_train"))
    n, m, rounds, clip = fed.num_clients, cfg["clients_per_round"], cfg["rounds"], cfg["clip"]
    params = get_params(make_mlp(fed.input_dim, cfg["hidden"], fed.num_classes, seed=seed))
    dim = sum(p.size for p in params)
    row: dict[str, Any] = {
        "method": method,
        "target_epsilon": target,
        "noise_multiplier": z,
        "clip": clip,
        "rounds": rounds,
        "num_clients": n,
        "clients_per_round": m,
        "dim": dim,
    }
    ddp = None
    if method.startswith("ddp-"):
        bits = int(method[4:])
        row["bits"] = bits
        try:
            ddp, calibration = _ddp_parameters(bits, z, cfg, dim)
        except ValueError as err:
            return {
                **row,
                "status": "bits cannot hold the sum",
                "error": str(err),
                "largest_z_for_bits": largest_z_for_bits(bits, cfg, dim),
                "accuracy": math.nan,
                "accuracy_curve": [],
                "ledger_epsilon": math.nan,
                "wall_s": 0.0,
            }
        row.update(
            scale=ddp.scale,
            padded_dim=ddp.padded_dim,
            mu=calibration.mu,
            local_mu=calibration.local_mu,
            l2_sensitivity=calibration.l2_sensitivity,
            l1_sensitivity=calibration.l1_sensitivity,
            effective_noise_multiplier=calibration.effective_noise_multiplier,
            bits_needed_worst_case=calibration.bits_needed,
            largest_z_for_bits=largest_z_for_bits(bits, cfg, dim),
        )
    elif method in ("central", "central-redraw"):
        row["effective_noise_multiplier"] = z
    # "central-redraw": the central run again with another noise draw (same clients, same local training): the
    # run-to-run spread that any difference between methods has to exceed
    rng = np.random.default_rng(
        [seed, 8 if method == "central-redraw" else 7, int(1000 * (z if math.isfinite(z) else 0))]
    )
    threads = _one_thread()
    accuracy, encode_s, t0 = [], 0.0, time.perf_counter()
    try:
        from dp_accounting.dp_event import GaussianDpEvent

        from flwr_dp_strategies.privacy import PrivacyLedger

        ledger = PrivacyLedger(DELTA)
        for rnd in range(1, rounds + 1):
            sample = np.random.default_rng([seed, rnd]).choice(n, size=m, replace=False)  # same in every method
            base = _flat(params)
            updates = [_flat(_local(fed, cfg, int(i), params, rnd, seed)) - base for i in sample]
            if method == "fedavg":
                mean = np.mean(updates, axis=0)
            elif method in ("central", "central-redraw"):
                total = np.sum([_clip(u, clip) for u in updates], axis=0)
                mean = (total + rng.normal(0.0, z * clip, size=dim)) / m
                ledger.record(GaussianDpEvent(z), server_round=rnd, neighboring_relation="add_or_remove_one")
            else:
                assert ddp is not None
                t1 = time.perf_counter()
                encoded = [encode_update(u, ddp, local_noise_variance=calibration.local_mu, rng=rng) for u in updates]
                encode_s += time.perf_counter() - t1
                mean = decode_sum(modular_sum(encoded, ddp), ddp) / m
                ledger.record(calibration.event, server_round=rnd, neighboring_relation="add_or_remove_one")
            params = _unflat(base + mean, params)
            accuracy.append(float(evaluate(params, fed.x_test, fed.y_test)))
    finally:
        _restore_threads(threads)
    eps = math.inf if method == "fedavg" else float(ledger.epsilon())
    row.update(
        status="ok",
        accuracy=accuracy[-1],
        accuracy_curve=accuracy,
        ledger_epsilon=eps,
        accuracy_last5=float(np.mean(accuracy[-5:])),
        wall_s=time.perf_counter() - t0,
        encode_s=encode_s,
    )
    if method != "fedavg":
        row["central_poisson_epsilon"] = _ledger_eps("poisson", z, rounds, 0, clip, m, n, dim)
        row["central_no_amplification_epsilon"] = _ledger_eps("gaussian", z, rounds, 0, clip, m, n, dim)
        row["central_no_amplification_epsilon_rdp"] = _ledger_eps("gaussian", z, rounds, 0, clip, m, n, dim, "rdp")
    return row


def accuracy_jobs(cfg: dict[str, Any], dim: int) -> list[tuple[str, float, float]]:
    """(method, target ε, z) of every accuracy run; z calibrated once per ε."""
    jobs: list[tuple[str, float, float]] = [("fedavg", math.inf, math.nan)]
    for eps in cfg["epsilons"]:
        z = noise_multiplier_for(eps, cfg, dim)
        jobs += [("central", eps, z), ("central-redraw", eps, z)] + [(f"ddp-{b}", eps, z) for b in cfg["bits"]]
    return jobs


# ============================================================================ (b) bytes
def upload_bytes(cfg: dict[str, Any], dim: int) -> list[dict]:
    """⌈D·b/8⌉ per b (the strategy's own ``upload_bytes``; D = d, the rotation pads nothing) against 4·d."""
    from flwr_dp_strategies.strategy.distributed_dp_fedavg import DistributedDpFedAvg  # not exported (report)
    from flwr_dp_strategies.privacy.mechanisms.distributed_dp import DistributedDpParams

    rows = []
    for b in sorted(set(cfg["bits"]) | {cfg["timing_bits"]}, reverse=True):
        strategy = DistributedDpFedAvg(noise_multiplier=1.0, clipping_norm=1.0, bits=b, rotation_seed=0)
        sent = strategy.upload_bytes(dim)
        padded = DistributedDpParams(dim, 1.0, 1.0, b, 0).padded_dim
        assert sent == math.ceil(padded * b / 8)
        rows.append(
            {
                "bits": b,
                "dim": dim,
                "padded_dim": padded,
                "bytes": sent,
                "dense_float32_bytes": 4 * dim,
                "ratio": sent / (4 * dim),
            }
        )
    return rows


# ============================================================================ (c) round time
class _Clock:
    """Accumulated seconds per label."""

    def __init__(self) -> None:
        self.s: dict[str, float] = defaultdict(float)

    def wrap(self, label: str, fn: Callable) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.s[label] += time.perf_counter() - t0

        return timed


def _timing_app(fed: Federation, cfg: dict[str, Any], seed: int, clock: _Clock, updates: dict[int, np.ndarray]) -> Any:
    """A ClientApp: local SGD on node i's shard (node ids 101, ...), behind ``distributed_dp_mod``.

    ``updates[node]`` keeps each node's last raw update (flattened), for the end-to-end noise check.
    """
    from flwr.app import Context, Message
    from flwr.clientapp import ClientApp

    from client_mods.distributed_dp_mod import make_distributed_dp_mod
    from flwr_dp_strategies.secure_aggregation.identity import InProcessRoster

    app = ClientApp()
    roster = InProcessRoster(4096)  # every node admitted by the operator (all played in this process)
    floor = float(cfg.get("noise_multiplier", 1e-3)) * 0.999

    @app.train(
        mods=[
            make_distributed_dp_mod(rng=np.random.default_rng([seed, 11]), min_noise_multiplier=floor, identity=roster)
        ]
    )
    def train(msg: Message, context: Context) -> Message:
        t0 = time.perf_counter()
        rnd = int(msg.metadata.group_id or 0)
        received = arrays_params(msg.content["arrays"])
        trained = _local(fed, cfg, int(context.node_id) - 101, received, rnd, seed)
        updates[int(context.node_id)] = _flat(trained) - _flat(received)
        reply = params_reply(msg, trained, fed.shard_size)
        clock.s["client train"] += time.perf_counter() - t0
        return reply

    return app


class _TimedApp:
    """The ClientApp as LoopbackGrid calls it, timed per protocol stage (``plain`` for FedAvg's messages)."""

    def __init__(self, app: Any, clock: _Clock) -> None:
        self.app, self.clock = app, clock

    def __call__(self, msg: Any, context: Any) -> Any:
        from secagg_harness import stage_of_message

        stage = stage_of_message(msg) or "plain"
        t0 = time.perf_counter()
        try:
            return self.app(msg, context)
        finally:
            self.clock.s[f"client app: {stage}"] += time.perf_counter() - t0


#: (module, attribute, label): the library functions timed by wrapping them for the duration of (c).
PROBES = (
    ("client_mods.distributed_dp_mod", "encode_update", "client encode"),
    ("flwr_dp_strategies.secure_aggregation.shamir", "split", "client Shamir split"),
    ("flwr_dp_strategies.secure_aggregation.client_protocol", "generate_key_pairs", "client key generation"),
    ("flwr_dp_strategies.secure_aggregation.client_protocol", "pairwise_keys", "ECDH + HKDF (client and server)"),
    ("flwr_dp_strategies.secure_aggregation.client_protocol", "encrypt", "client Fernet"),
    ("flwr_dp_strategies.secure_aggregation.client_protocol", "decrypt", "client Fernet"),
    ("flwr_dp_strategies.secure_aggregation.client_protocol", "add_prg_mask", "client ChaCha20 masks"),
    ("flwr_dp_strategies.secure_aggregation.client_protocol", "pack_bits", "client packing"),
    ("flwr_dp_strategies.secure_aggregation.shamir", "reconstruct_many", "server Shamir combine"),
    ("flwr_dp_strategies.secure_aggregation.server_protocol", "add_prg_mask", "server ChaCha20 masks"),
    ("flwr_dp_strategies.secure_aggregation.server_protocol", "unpack_bits", "server unpacking"),
    ("flwr_dp_strategies.strategy.distributed_dp_fedavg", "decode_sum", "server decode"),
)


class _Probes:
    """Wrap each of :data:`PROBES` with the clock; restore the originals on exit (nothing else is changed)."""

    def __init__(self, clock: _Clock) -> None:
        self.clock, self.saved = clock, []

    def __enter__(self) -> "_Probes":
        import importlib

        for module_name, attribute, label in PROBES:
            module = importlib.import_module(module_name)
            original = getattr(module, attribute)
            self.saved.append((module, attribute, original))
            setattr(module, attribute, self.clock.wrap(label, original))
        return self

    def __exit__(self, *exc: object) -> None:
        for module, attribute, original in reversed(self.saved):
            setattr(module, attribute, original)


def _strategies(cfg: dict[str, Any], z: float, n: int) -> dict[str, Callable[[], Any]]:
    """Fresh strategies for the timed rounds: every node is sampled (fraction 1), the same n each."""
    from flwr.serverapp.strategy import FedAvg

    import flwr_dp_strategies as fds
    from flwr_dp_strategies.strategy.distributed_dp_fedavg import DistributedDpFedAvg  # not exported at the top

    def fedavg() -> Any:
        return FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n, min_available_nodes=n)

    out: dict[str, Callable[[], Any]] = {
        "FedAvg": fedavg,
        "central DP": lambda: fds.AccountedServerSideFixedClipping(fedavg(), z, cfg["clip"], n, rng=0),
    }
    for k in sorted(cfg["timing_shares"], key=lambda k: k is None):  # the complete graph last
        label = "secure, complete graph" if k is None else f"secure, k = {k}"
        out[label] = functools.partial(
            DistributedDpFedAvg,
            fraction_train=1.0,
            fraction_evaluate=0.0,
            min_train_nodes=n,
            min_available_nodes=n,
            noise_multiplier=z,
            clipping_norm=cfg["clip"],
            bits=cfg["timing_bits"],
            num_shares=1.0 if k is None else min(k, n),
            min_survivors=n,
            rotation_seed=int(cfg.get("seed", 0)),
            stage_timeout=None,
        )
    return out


@_quiet()
def time_rounds(cfg: dict[str, Any], z: float, seed: int) -> dict:
    """Wall time of single rounds of each strategy on one LoopbackGrid (alternated), split by who does what.

    Passes: one warm-up pass (imports, caches; not kept), then ``timing_repeats`` passes, every other one
    in reverse order. The complete graph (~4 min a round for 100 clients on 2 cores, nearly all of it
    pure-Python Shamir arithmetic, nothing to warm up) plays only in the first timed pass.
    """
    from flwr.app import ConfigRecord
    from flwr_dp_experiments.baselines import evaluate, get_params, make_mlp
    from secagg_harness import LoopbackGrid

    from flwr_dp_strategies.secure_aggregation.protocol import MASKED_KEY, MASKED_RECORD

    n = cfg["timing_clients"]
    fed = _federation(cfg["num_clients"], cfg.get("max_train"))
    init = mlp_arrays(get_params(make_mlp(fed.input_dim, cfg["hidden"], fed.num_classes, seed=seed)))
    base = _flat(arrays_params(init))
    clock, updates = _Clock(), {}
    grid = LoopbackGrid(_TimedApp(_timing_app(fed, cfg, seed, clock, updates), clock), list(range(101, 101 + n)))
    makers = _strategies(cfg, z, n)
    names = list(makers)
    once = {"secure, complete graph"} if cfg["timing_clients"] > 10 else set()
    samples: dict[str, list[dict]] = {name: [] for name in names}
    order = []
    for rep in range(cfg["timing_repeats"] + 1):
        order += [(rep, name) for name in (names if rep % 2 == 0 else names[::-1]) if name not in once or rep == 1]
    threads = _one_thread()
    try:
        with _TaskIdentity(), _Probes(clock):
            for server_round, (rep, name) in enumerate(order, start=1):
                # a new round number for each measurement: the clients set up each round once
                strategy = makers[name]()
                clock.s.clear()
                updates.clear()
                grid.sent.clear()
                t0 = time.perf_counter()
                messages = list(strategy.configure_train(server_round, init, ConfigRecord(), grid))
                t1 = time.perf_counter()
                replies = grid.send_and_receive(messages)
                t2 = time.perf_counter()
                arrays, metrics = strategy.aggregate_train(server_round, replies)
                t3 = time.perf_counter()
                if arrays is None or grid.errors:
                    raise RuntimeError(f"{name}: the round released nothing ({grid.errors[-3:]})")
                first = replies[0].content
                upload = (
                    len(first[MASKED_RECORD][MASKED_KEY].data)
                    if MASKED_RECORD in first
                    else sum(len(a.data) for a in first["arrays"].values())
                )
                split = dict(clock.s)
                client_total = sum(v for k, v in split.items() if k.startswith("client app"))
                sample = {
                    "round_s": t3 - t0,
                    "configure_s": t1 - t0,
                    "clients_phase_s": t2 - t1,
                    "aggregate_s": t3 - t2,
                    "client_app_s": client_total,
                    "client_train_s": split.get("client train", 0.0),
                    "client_encode_s": split.get("client encode", 0.0),
                    "server_s": (t3 - t0) - client_total,
                    "server_aggregate_s": (t3 - t2) - split.get("client app: unmask", 0.0),
                    "stages": split,
                    "upload_bytes_per_client": float(upload),
                    "accuracy_after": float(evaluate(arrays_params(arrays), fed.x_test, fed.y_test)),
                }
                sample["client_crypto_s"] = client_total - sample["client_train_s"] - sample["client_encode_s"]
                sample.update(_noise_check(name, arrays, metrics, base, updates, cfg, z, n))
                if rep > 0:
                    samples[name].append(sample)
    finally:
        _restore_threads(threads)
    fedavg = statistics.median(s["round_s"] for s in samples["FedAvg"])
    rows = []
    for name in names:
        med = {key: statistics.median(s[key] for s in samples[name]) for key in samples[name][0] if key != "stages"}
        stages = {
            key: statistics.median(s["stages"].get(key, 0.0) for s in samples[name])
            for key in samples[name][0]["stages"]
        }
        rows.append(
            {
                "strategy": name,
                **med,
                "ratio_to_fedavg": med["round_s"] / fedavg,
                "stages": stages,
                "timed_rounds": len(samples[name]),
                "rounds": [s["round_s"] for s in samples[name]],
            }
        )
    return {"clients": n, "bits": cfg["timing_bits"], "noise_multiplier": z, "rows": rows}


def _noise_check(
    name: str,
    arrays: Any,
    metrics: Any,
    base: np.ndarray,
    updates: dict[int, np.ndarray],
    cfg: dict[str, Any],
    z: float,
    n: int,
) -> dict:
    """End to end: (released − initial − mean of the clipped raw updates) against the noise the method claims.

    The local training is seeded per node and round, so the raw updates are the same in every strategy's
    round; for a DP round ‖deviation‖/(σ·√d) should be ≈ 1, σ = z_eff·C/n the claimed noise std of the mean
    (z_eff: the strategy's ``dp/noise-multiplier`` metric for the secure rounds, z for central DP).
    """
    if name == "FedAvg" or len(updates) != n:
        return {}
    clipped = np.mean([_clip(u, cfg["clip"]) for u in updates.values()], axis=0)
    deviation = _flat(arrays_params(arrays)) - base - clipped
    z_eff = float(metrics["dp/noise-multiplier"]) if metrics is not None and "dp/noise-multiplier" in metrics else z
    sigma = z_eff * cfg["clip"] / n
    return {
        "noise_ratio": float(np.linalg.norm(deviation) / (sigma * math.sqrt(deviation.size))),
        "claimed_effective_z": z_eff,
    }


# ============================================================================ (d) secure aggregation at scale
SCALE_CLIENTS = (100, 300, 1000)
SCALE_DROPOUT = 0.05
SCALE_Z = 23.6  # the issue's z for ε = 1 over 40 rounds with all 1 000 clients (timing barely depends on it)


class FlowerShamir:
    """The baseline's sharing: Flower's own ``crypto.shamir`` (pycryptodome, GF(2^128), one polynomial per
    16-byte chunk and per secret; shares carry a 4-byte little-endian index = the holder's x), behind the
    interface of :data:`flwr_dp_strategies.secure_aggregation.shamir.SCHEME`. Reconstruction is one
    ``combine_shares`` per secret (Flower recomputes its Lagrange interpolation each time)."""

    name = "Flower crypto.shamir (GF(2^128), pycryptodome)"

    @staticmethod
    def split(secrets_: list[bytes], threshold: int, holders: int) -> list[list[bytes]]:
        from flwr.common.secure_aggregation.crypto.shamir import create_shares

        per_secret = [create_shares(secret, threshold, holders) for secret in secrets_]
        return [list(row) for row in zip(*per_secret)]

    @staticmethod
    def x_of(share: bytes) -> int:
        if len(share) < 20:
            raise ValueError("a Flower share has a 4-byte index and 16-byte chunks")
        return int.from_bytes(share[:4], "little")

    @staticmethod
    def reconstruct(xs: Any, shares: list[list[bytes]], length: int) -> list[bytes]:
        from flwr.common.secure_aggregation.crypto.shamir import combine_shares

        return [combine_shares(list(row)) for row in shares]


def _per_pair_keys(private_key: bytes, public_keys: list[bytes]) -> list[bytes]:
    """The baseline's key agreement: Flower's ``generate_shared_key`` on keys parsed anew for every pair, as
    Flower's ``secaggplus_mod`` does (keys kept as bytes in the state)."""
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
    from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key

    return [generate_shared_key(bytes_to_private_key(private_key), bytes_to_public_key(pk)) for pk in public_keys]


class _FlowerPrimitives:
    """Within the block, the package's SecAgg+ runs on Flower's Shamir and per-pair key agreement."""

    def __enter__(self) -> "_FlowerPrimitives":
        from flwr_dp_strategies.secure_aggregation import client_protocol, shamir

        self.saved = (shamir.SCHEME, client_protocol.pairwise_keys)
        shamir.SCHEME = FlowerShamir()
        client_protocol.pairwise_keys = _per_pair_keys
        return self

    def __exit__(self, *exc: object) -> None:
        from flwr_dp_strategies.secure_aggregation import client_protocol, shamir

        shamir.SCHEME, client_protocol.pairwise_keys = self.saved


def shamir_micro(sizes: list[tuple[int, int]], repeats: int = 5) -> list[dict]:
    """Seconds to share a client's two secrets (32-byte seed, 48-byte scalar) among h holders, and to rebuild
    one secret from t shares, ours against Flower's ``crypto.shamir`` (median of ``repeats``). "ours, per
    secret of a batch" rebuilds 100 secrets from the same holders' points (the server's case) and divides."""
    from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares

    from flwr_dp_strategies.secure_aggregation import shamir

    def median_time(fn: Callable[[], Any]) -> float:
        out = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return statistics.median(out)

    rows = []
    seed, scalar = os.urandom(32), os.urandom(48)
    for h, t in sizes:
        ours = shamir.split([seed, scalar], t, h)
        theirs = create_shares(seed, t, h)
        xs = list(range(1, t + 1))
        batch = [[row[0] for row in shamir.split([os.urandom(32)], t, h)[:t]] for _ in range(100)]

        def batched() -> None:
            shamir.lagrange_at_zero.cache_clear()
            shamir.SCHEME.reconstruct(xs, batch, 32)

        def single() -> None:
            shamir.lagrange_at_zero.cache_clear()
            shamir.reconstruct([row[0] for row in ours[:t]], 32)

        rows.append(
            {
                "holders": h,
                "threshold": t,
                "ours_split_s": median_time(lambda: shamir.split([seed, scalar], t, h)),
                "flower_split_s": median_time(lambda: (create_shares(seed, t, h), create_shares(scalar, t, h))),
                "ours_rebuild_s": median_time(single),
                "ours_rebuild_batched_s": median_time(batched) / len(batch),
                "flower_rebuild_s": median_time(lambda: combine_shares(theirs[:t])),
            }
        )
    return rows


@_quiet()
def time_scale(
    cfg: dict[str, Any],
    z: float,
    seed: int,
    clients: tuple[int, ...],
    *,
    baseline_max: int,
    dropout: float = SCALE_DROPOUT,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> dict:
    """One full secure round (``DistributedDpFedAvg``, b = ``timing_bits``, k and t from the strategy's own
    defaults: :func:`choose_num_shares` for ``dropout`` and failure probability 1e-6) at each cohort size,
    all of a :func:`_federation` of ``max(clients)`` clients sampled, ``dropout``·n of them (a seeded draw)
    dying at the collect stage (after sharing their keys: the case that costs the server most, their
    pairwise masks must be rebuilt), played serially on one ``LoopbackGrid``. Each size runs with our
    primitives and, up to ``baseline_max`` clients, with Flower's (:class:`_FlowerPrimitives`), the two
    back to back (ours, Flower's) so that both see the same machine load; one warm-up round of each at
    20 clients first (imports, torch's first call; not kept) unless every size is a toy one (≤ 50).

    Reported: ``client_crypto_s`` = every ClientApp call minus local training and ``encode_update``, over
    the n sampled clients (the dropped ones did less); ``server_unmask_s`` = the unmask stage on the server
    (``SecureAggregationRound.unmask`` minus the clients' time answering it: rebuilding the secrets, the
    ECDH of the dropped nodes' keys, the masks); ``server_aggregate_s`` = ``aggregate_train`` minus the
    clients' unmask answers (unmask + decode); ``server_s`` = the round minus every ClientApp call."""
    from flwr.app import ConfigRecord
    from flwr_dp_experiments.baselines import get_params, make_mlp
    from secagg_harness import LoopbackGrid

    from flwr_dp_strategies.secure_aggregation.protocol import MASKED_KEY, MASKED_RECORD
    from flwr_dp_strategies.secure_aggregation.server_protocol import SecureAggregationRound
    from flwr_dp_strategies.strategy.distributed_dp_fedavg import DistributedDpFedAvg

    fed = _federation(max(max(clients), cfg["num_clients"]), cfg.get("max_train"))
    init = mlp_arrays(get_params(make_mlp(fed.input_dim, cfg["hidden"], fed.num_classes, seed=seed)))
    dim = sum(a.numpy().size for a in init.values())
    clock, updates = _Clock(), {}
    app = _TimedApp(_timing_app(fed, cfg, seed, clock, updates), clock)
    rows = []
    threads = _one_thread()
    original_unmask = SecureAggregationRound.unmask
    SecureAggregationRound.unmask = clock.wrap("server unmask stage", original_unmask)
    try:
        with _TaskIdentity(), _Probes(clock):
            plan = [] if max(clients) <= 50 else [(20, "ours", False), (20, "Flower", False)]  # warm-up
            for n in clients:
                plan += [(n, p, True) for p in (("ours", "Flower") if n <= baseline_max else ("ours",))]
            for n, primitives, keep in plan:
                nodes = list(range(101, 101 + n))
                draw = random.Random(seed * 1000 + n)
                die = {node: "collect" for node in draw.sample(nodes, round(dropout * n))}
                grid = LoopbackGrid(app, nodes, die=die)
                strategy = DistributedDpFedAvg(
                    fraction_train=1.0,
                    fraction_evaluate=0.0,
                    min_train_nodes=n,
                    min_available_nodes=n,
                    noise_multiplier=z,
                    clipping_norm=cfg["clip"],
                    bits=cfg["timing_bits"],
                    min_survivors=0.8,
                    dropout_rate=dropout,
                    rotation_seed=seed,
                    stage_timeout=None,
                )
                clock.s.clear()
                updates.clear()
                with _FlowerPrimitives() if primitives == "Flower" else contextlib.nullcontext():
                    t0 = time.perf_counter()
                    messages = list(strategy.configure_train(1, init, ConfigRecord(), grid))
                    replies = grid.send_and_receive(messages)
                    t2 = time.perf_counter()
                    arrays, _ = strategy.aggregate_train(1, replies)
                    t3 = time.perf_counter()
                if arrays is None:
                    raise RuntimeError(f"{primitives}, n = {n}: the round released nothing ({grid.errors[-3:]})")
                split = dict(clock.s)
                client_total = sum(v for k, v in split.items() if k.startswith("client app"))
                crypto = client_total - split.get("client train", 0.0) - split.get("client encode", 0.0)
                answers = split.get("client app: unmask", 0.0)
                upload = next(len(r.content[MASKED_RECORD][MASKED_KEY].data) for r in replies if not r.has_error())
                sizes = getattr(strategy, "_sizes", None)
                row = {
                    "clients": n,
                    "primitives": primitives,
                    "dropped": len(die),
                    "survivors": n - len(die),
                    "num_shares": getattr(sizes, "num_shares", None),
                    "neighbourhood": getattr(sizes, "neighbourhood", None),
                    "threshold": getattr(sizes, "threshold", None),
                    "round_s": t3 - t0,
                    "server_s": (t3 - t0) - client_total,
                    "server_unmask_s": split.get("server unmask stage", 0.0) - answers,
                    "server_aggregate_s": (t3 - t2) - answers,
                    "server_decode_s": split.get("server decode", 0.0),
                    "client_crypto_s_total": crypto,
                    "client_crypto_s_per_client": crypto / n,
                    "client_train_s_total": split.get("client train", 0.0),
                    "client_encode_s_total": split.get("client encode", 0.0),
                    "upload_bytes": upload,
                    "dense_float32_bytes": 4 * dim,
                    "upload_ratio": upload / (4 * dim),
                    "stages": split,
                    "loadavg": os.getloadavg(),
                }
                if not keep:
                    continue
                rows.append(row)
                log(
                    f"secagg n={n} {primitives}: round {row['round_s']:.1f} s, server unmask "
                    f"{row['server_unmask_s']:.2f} s, client crypto {row['client_crypto_s_per_client']:.4f} "
                    f"s/client (k={row['num_shares']}, t={row['threshold']}), load {row['loadavg'][0]:.1f}"
                )
    finally:
        SecureAggregationRound.unmask = original_unmask
        _restore_threads(threads)
    micro_sizes = sorted({(r["neighbourhood"], r["threshold"]) for r in rows if r["neighbourhood"]} | {(101, 51)})
    return {
        "clients": list(clients),
        "dropout": dropout,
        "bits": cfg["timing_bits"],
        "noise_multiplier": z,
        "dim": dim,
        "baseline_max": baseline_max,
        "rows": rows,
        "shamir": shamir_micro(micro_sizes),
    }


def scale_markdown(result: dict) -> str:
    """The (d) table: ours against Flower's primitives per cohort size, the ratios, the Shamir micro-timings."""
    scale = result["scale"]
    by = {(r["clients"], r["primitives"]): r for r in scale["rows"]}
    lines = [
        f"## (d) Secure aggregation at 100 / 300 / 1 000 clients per round, {scale['dropout']:.0%} dropout, "
        f"b = {scale['bits']}",
        "",
        f"Created {result['created']} on {result['machine'].get('cpu_affinity', result['machine']['cpu_count'])} "
        f"cores shared with other jobs (load average at each row below: the two primitives of one size run "
        f"back to back, so read the ratios). One full `DistributedDpFedAvg` round on `LoopbackGrid`, every "
        f"client played serially in this process with real crypto; {scale['dropout']:.0%} of the clients (a "
        f"seeded draw) die at the collect stage, after sharing their keys (the server must rebuild their keys "
        f"and strip their pairwise masks). k and t are the strategy's defaults (`choose_num_shares` at "
        f"dropout {scale['dropout']}, failure probability 1e-6; t = ⌊h/2⌋ + 1). *Flower's primitives*: the "
        f"same protocol with Flower's `crypto.shamir` (GF(2^128), pycryptodome) and Flower's key agreement "
        f"with keys parsed per pair; masks are ChaCha20 in both (Flower's own 32-bit-seeded NumPy masks are "
        f"not a secure baseline). Seconds.",
        "",
        "| clients | primitives | k | h | t | round | server (all) | server unmask | aggregate_train | "
        "client crypto / client | client crypto (sum) | upload B | × dense f32 | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in scale["rows"]:
        lines.append(
            f"| {r['clients']} | {r['primitives']} | {r['num_shares']} | {r['neighbourhood']} | {r['threshold']} "
            f"| {r['round_s']:.2f} | {r['server_s']:.2f} | {r['server_unmask_s']:.3f} | "
            f"{r['server_aggregate_s']:.3f} | {r['client_crypto_s_per_client']:.4f} | "
            f"{r['client_crypto_s_total']:.2f} | {r['upload_bytes']:,} | {r['upload_ratio']:.3f} | "
            f"{r['loadavg'][0]:.1f} |"
        )
    lines += [
        "",
        "*server (all)*: the round minus every ClientApp call; *server unmask*: the unmask stage minus the "
        "clients' answers (rebuilding the secrets, ECDH with the dropped clients' rebuilt keys, removing the "
        "masks); *aggregate_train*: screening, unpacking and adding the masked vectors, the unmask stage and "
        "decoding; *client crypto*: every ClientApp call minus local training and `encode_update` (key "
        "generation, ECDH + HKDF, Shamir, Fernet, masks, packing, the mod's message handling), per sampled "
        "client and summed.",
    ]
    largest = max(scale["clients"])
    if (largest, "ours") in by:
        r = by[(largest, "ours")]
        checks = [
            ("server unmask ≤ 10 s", r["server_unmask_s"] <= 10, f"{r['server_unmask_s']:.2f} s"),
            (
                "client crypto ≤ 0.2 s per client",
                r["client_crypto_s_per_client"] <= 0.2,
                f"{r['client_crypto_s_per_client']:.3f} s",
            ),
            ("upload ≤ 0.8× dense float32", r["upload_ratio"] <= 0.8, f"{r['upload_ratio']:.3f}×"),
        ]
        lines += [
            "",
            f"Targets at {largest} clients (ours): "
            + "; ".join(f"{name}: {value} ({'met' if ok else 'NOT met'})" for name, ok, value in checks)
            + ".",
        ]
    lines += ["", "Ratios, Flower's primitives / ours, same size, back to back:", ""]
    lines += ["| clients | server unmask | client crypto / client | round |", "|---|---|---|---|"]
    for n in scale["clients"]:
        if (n, "Flower") in by:
            a, b = by[(n, "ours")], by[(n, "Flower")]
            lines.append(
                f"| {n} | {b['server_unmask_s'] / a['server_unmask_s']:.1f}× | "
                f"{b['client_crypto_s_per_client'] / a['client_crypto_s_per_client']:.1f}× | "
                f"{b['round_s'] / a['round_s']:.1f}× |"
            )
    lines += [
        "",
        "Shamir alone (median of 5; seconds): sharing a client's two secrets (32-byte seed, 48-byte key "
        "scalar) among h holders, and rebuilding one secret from t shares; *batched*: 100 secrets rebuilt "
        "from the same holders' points, per secret (the server's case: one set of Lagrange coefficients).",
        "",
        "| h | t | ours: share | Flower: share | ours: rebuild | ours: rebuild, batched | Flower: rebuild | "
        "share ×| rebuild × |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in scale["shamir"]:
        lines.append(
            f"| {m['holders']} | {m['threshold']} | {m['ours_split_s']:.2e} | {m['flower_split_s']:.2e} | "
            f"{m['ours_rebuild_s']:.2e} | {m['ours_rebuild_batched_s']:.2e} | {m['flower_rebuild_s']:.2e} | "
            f"{m['flower_split_s'] / m['ours_split_s']:.0f} | {m['flower_rebuild_s'] / m['ours_rebuild_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def run_scale(cfg: dict[str, Any], seed: int, clients: tuple[int, ...], baseline_max: int, z: float = SCALE_Z) -> dict:
    """(d) on its own: ``{"scale": ..., "machine", "created", "config"}``."""
    from flwr_dp_benchmarks._common import machine

    t0 = time.perf_counter()
    scale = time_scale(cfg, z, seed, clients, baseline_max=baseline_max)
    return {
        "created": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": machine(),
        "config": cfg,
        "seed": seed,
        "wall_s": time.perf_counter() - t0,
        "scale": scale,
    }


# ============================================================================ (e) every client in every round
def run_all_clients(seed: int = 0, workers: int = 1, rounds: Optional[int] = None, tiny: bool = False) -> dict:
    """(a) with m = N: all 1 000 clients in every round, b = 20 (issue 29, item 3). Without sampling there is no
    amplification to lose, and the noise on the mean, z·C/m, falls with m: at ε = 1 over 40 rounds z ≈ 23.6 gives
    0.024·C, against 0.027·C for the Poisson-sampled central mechanism at q = 0.1 (z = 2.68, m = 100). Rows: central
    DP at the same z, distributed DP at b = 20, FedAvg (no redraw: each run is 40 000 local trainings); the Poisson rows (q = 0.1, central, trusted
    server) come from ``bench_user_level``'s committed results, same data, model and local training."""
    from flwr_dp_benchmarks._common import machine
    from flwr_dp_strategies.privacy.mechanisms.distributed_dp import padded_dimension

    cfg = {**CONFIG, "seed": seed, "bits": (20,)}
    if tiny:
        cfg.update(MODES["tiny"], bits=(20,))
    cfg["clients_per_round"] = cfg["num_clients"]
    if rounds is not None:
        cfg["rounds"] = int(rounds)
    dim = (28 * 28 + 1) * cfg["hidden"] + (cfg["hidden"] + 1) * 10
    t0 = time.perf_counter()
    jobs = [job for job in accuracy_jobs(cfg, dim) if job[0] != "central-redraw"]  # 40 000 local runs each
    rows = []
    with ProcessPoolExecutor(max_workers=workers) if workers > 1 else _Serial() as pool:
        futures = (pool.submit(run_accuracy, method, eps, z, cfg, seed) for method, eps, z in jobs)
        for future in as_completed(list(futures)) if workers > 1 else futures:
            row = future.result()
            rows.append(row)
            print(
                f"[all clients] {row['method']} ε={row['target_epsilon']:g} acc={row['accuracy']:.3f} "
                f"({row['wall_s']:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    order = {"fedavg": 0, "central": 1, "central-redraw": 2}
    rows.sort(key=lambda r: (r["target_epsilon"], order.get(r["method"], 3)))
    return {
        "mode": "all-clients" + (" (tiny)" if tiny else ""),
        "seed": seed,
        "config": cfg,
        "dim": dim,
        "padded_dim": padded_dimension(dim),
        "delta": DELTA,
        "machine": machine(),
        "created": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "wall_s": time.perf_counter() - t0,
        "accuracy": rows,
    }


def all_clients_markdown(result: dict, user_level: Optional[dict] = None) -> str:
    """The (e) table, with the Poisson-sampled central rows of ``bench_user_level`` at the same ε when given."""
    cfg = result["config"]
    lines = [
        "# Distributed DP with every client in every round (issue 29, item 3)\n",
        f"{result['created']}, seed {result['seed']}, machine: {result['machine'].get('cpu_count')} CPUs; total "
        f"{result['wall_s']:.0f} s. MNIST over N = {cfg['num_clients']} clients, m = {cfg['clients_per_round']} "
        f"(all) per round, T = {cfg['rounds']} rounds, δ = {result['delta']:g}, C = {cfg['clip']}, the 784-64-10 "
        f"MLP (d = {result['dim']}, D = {result['padded_dim']}), local: {cfg['local_epochs']} epochs, batch "
        f"{cfg['local_batch']}, lr {cfg['local_lr']} (as `bench_user_level`). z calibrated on the ledger's "
        "SkellamDpEvents at b = 20 (no amplification). Central DP adds N(0, (zC)²) to the clipped sum at the same z "
        "(a trusted server); distributed DP is what the secure round reveals (the masks cancel exactly, "
        "`tests/test_secure_aggregation.py`), so they are left out here. Accuracy: final and mean of the last 5 "
        "rounds.\n",
        "| target ε | method | trusts the server | z | noise on the mean (·C) | ledger ε | accuracy | last 5 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["accuracy"]:
        if r["method"] == "fedavg":
            continue
        z = r.get("effective_noise_multiplier") or r["noise_multiplier"]
        trusted = "no" if r["method"].startswith("ddp-") else "yes"
        label = _label(r).replace("no amplification", f"m = {cfg['clients_per_round']}")
        if r.get("status", "ok") != "ok":
            lines.append(
                f"| {r['target_epsilon']:g} | {label} | {trusted} | {r['noise_multiplier']:.3g} | "
                f"- | - | {r['status']} | - |"
            )
            continue
        lines.append(
            f"| {r['target_epsilon']:g} | {label} | {trusted} | {r['noise_multiplier']:.3g} | "
            f"{z / cfg['clients_per_round']:.4f} | {r['ledger_epsilon']:.3f} | {r['accuracy']:.3f} | "
            f"{r['accuracy_last5']:.3f} |"
        )
    if user_level:
        ucfg = user_level["config"]
        m = int(round(ucfg["sample_rate"] * ucfg["num_clients"]))
        for r in user_level["rows"]:
            if r["method"] in ("ours-fixed", "ours-adaptive") and r["target_epsilon"] in cfg["epsilons"]:
                noise = f"{r['noise_multiplier'] * (r['clip'] or 0) / m:.4f}" if r["method"] == "ours-fixed" else "-"
                lines.append(
                    f"| {r['target_epsilon']:g} | {r['label']} (q = {ucfg['sample_rate']:g}, m = {m}, "
                    f"`bench_user_level`) | yes | {r['noise_multiplier']:.3g} | {noise} | {r['ledger_epsilon']:.3f} | "
                    f"{r['accuracy']:.3f} | {np.mean(r['accuracy_curve'][-5:]):.3f} |"
                )
    fedavg = next((r for r in result["accuracy"] if r["method"] == "fedavg"), None)
    if fedavg:
        lines.append(
            f"| ∞ | {LABELS['fedavg']} (m = {cfg['clients_per_round']}) | - | - | - | ∞ | {fedavg['accuracy']:.3f} | "
            f"{fedavg['accuracy_last5']:.3f} |"
        )
    return "\n".join(lines) + "\n"


# ============================================================================ the run
def run(
    mode: str = "full",
    seed: int = 0,
    workers: int = 1,
    rounds: Optional[int] = None,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
    on_row: Callable[[dict], None] = lambda row: None,
) -> dict:
    """(a), (b) and (c) of ``mode``."""
    from flwr_dp_strategies.privacy.mechanisms.distributed_dp import DistributedDpParams

    cfg = {**CONFIG, **MODES[mode], "seed": seed}
    if rounds is not None:
        cfg["rounds"] = int(rounds)
    dim = (28 * 28 + 1) * cfg["hidden"] + (cfg["hidden"] + 1) * 10  # the 784-64-10 MLP with biases
    t0 = time.perf_counter()
    jobs = accuracy_jobs(cfg, dim)
    log(
        f"calibrated z per ε: {sorted({(e, round(z, 4)) for _, e, z in jobs if math.isfinite(e)})} "
        f"({time.perf_counter() - t0:.1f} s)"
    )
    rows = []
    with ProcessPoolExecutor(max_workers=workers) if workers > 1 else _Serial() as pool:
        # serial: one run per iteration (a list of _Serial futures would run them all before the first log)
        futures = (pool.submit(run_accuracy, method, eps, z, cfg, seed) for method, eps, z in jobs)
        for future in as_completed(list(futures)) if workers > 1 else futures:
            row = future.result()
            rows.append(row)
            on_row(row)
            log(
                f"{row['method']:8s} ε={row['target_epsilon']:<4g} z={row['noise_multiplier']:.4g} "
                f"{row['status'] if row['status'] != 'ok' else ''}acc={row['accuracy']:.3f} "
                f"ledger ε={row['ledger_epsilon']:.4g} ({row['wall_s']:.0f} s)"
            )
    timing_z = next((z for _, e, z in jobs if e == cfg["epsilons"][0]), 1.0)
    t1 = time.perf_counter()
    timing = time_rounds(cfg, timing_z, seed)
    log(
        f"round timing ({time.perf_counter() - t1:.0f} s): "
        + ", ".join(f"{r['strategy']} {r['round_s']:.2f} s (×{r['ratio_to_fedavg']:.1f})" for r in timing["rows"])
    )
    from flwr_dp_benchmarks._common import machine

    order = {"fedavg": 0, "central": 1, "central-redraw": 2}
    rows.sort(key=lambda r: (r["target_epsilon"], order.get(r["method"], 3), -r.get("bits", 0)))
    return {
        "mode": mode,
        "seed": seed,
        "config": cfg,
        "dim": dim,
        "padded_dim": DistributedDpParams(dim, 1.0, 1.0, 20, 0).padded_dim,
        "delta": DELTA,
        "calibration_bits": CALIBRATION_BITS,
        "machine": machine(),
        "created": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "wall_s": time.perf_counter() - t0,
        "accuracy": rows,
        "bytes": upload_bytes(cfg, dim),
        "timing": timing,
    }


# ============================================================================ outputs
LABELS = {
    "fedavg": "FedAvg (non-private)",
    "central": "central DP (Gaussian zC, no amplification)",
    "central-redraw": "central DP, another noise draw (spread)",
}


def _label(row: dict) -> str:
    return LABELS.get(row["method"], f"distributed DP, b = {row.get('bits')}")


def _f(x: Any, fmt: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def markdown(result: dict) -> str:
    """The three tables and the notes."""
    cfg = result["config"]
    acc = result["accuracy"]
    fedavg = next(r for r in acc if r["method"] == "fedavg")
    lines = [
        "# Distributed DP (SecAgg+ + Skellam) vs central DP at the same noise\n",
        f"Mode `{result['mode']}`, seed {result['seed']}, {result['created']}, machine: "
        f"{result['machine'].get('cpu_count')} CPUs, {result['machine'].get('platform')}; total "
        f"{result['wall_s']:.0f} s."
        + (
            f" Round times (c) re-measured {result['timing_created']} with `--timing-only`."
            if result.get("timing_created")
            else ""
        )
        + "\n",
        "## (a) Accuracy\n",
        f"MNIST, {cfg['num_clients']} clients of {60000 // cfg['num_clients'] if not cfg.get('max_train') else '?'}"
        f" examples, m = {cfg['clients_per_round']} drawn uniformly per round (the same clients in every "
        f"method), T = {cfg['rounds']} rounds, δ = {result['delta']:g}, C = {cfg['clip']}, d = "
        f"{result['dim']} (D = {result['padded_dim']}); local: {cfg['local_epochs']} epochs, batch "
        f"{cfg['local_batch']}, lr {cfg['local_lr']}. z calibrated so that the ledger's "
        f"{cfg['rounds']} SkellamDpEvents (b = {result['calibration_bits']}, no amplification) reach ε.\n",
        "| target ε | method | z | effective z | ledger ε (as released) | central ε with Poisson q = "
        f"{cfg['clients_per_round'] / cfg['num_clients']:g} | accuracy (final) | mean of last 5 rounds | "
        "Δ vs central (last 5) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    central = {r["target_epsilon"]: r for r in acc if r["method"] == "central"}
    for r in acc:
        if r["method"] == "fedavg":
            continue
        c = central.get(r["target_epsilon"])
        if r["status"] != "ok":
            lines.append(
                f"| {r['target_epsilon']:g} | {_label(r)} | {r['noise_multiplier']:.3f} | - | - | - | "
                f"**{r['bits']} bits cannot hold the sum** (`scale_for_bits` raises ValueError; "
                f"largest z it holds: {r['largest_z_for_bits']:.3g}) | - | - |"
            )
            continue
        delta = (
            ""
            if r["method"] == "central" or c is None
            else f"{100 * (r['accuracy_last5'] - c['accuracy_last5']):+.1f} pt"
        )
        lines.append(
            f"| {r['target_epsilon']:g} | {_label(r)} | {r['noise_multiplier']:.3f} | "
            f"{_f(r.get('effective_noise_multiplier'), '.3f')} | {r['ledger_epsilon']:.3f} | "
            f"{_f(r.get('central_poisson_epsilon'), '.3f')} | {r['accuracy']:.3f} | "
            f"{r['accuracy_last5']:.3f} | {delta} |"
        )
    lines.append(
        f"| ∞ | {LABELS['fedavg']} | - | - | ∞ | - | {fedavg['accuracy']:.3f} | {fedavg['accuracy_last5']:.3f} | |"
    )
    rdp = {r["target_epsilon"]: r.get("central_no_amplification_epsilon_rdp") for r in acc if r["method"] == "central"}
    lines += [
        "",
        "How to read it. The distributed rows encode every client with `encode_update` (local noise μ/m), "
        "add the encodings with `modular_sum` and decode with `decode_sum`: exactly the value a secure round "
        "reveals (the protocol's exactness, revealed value = the modular sum of the survivors' vectors under "
        "dropouts at every stage, is proven by `tests/test_secure_aggregation.py`; the noise check of (c) "
        "confirms it end to end for `DistributedDpFedAvg`). *Effective z* is the noise std over C: the "
        "Skellam variance is μ = (zΔ̃₂)² with Δ̃₂ the rounded vectors' L2 bound, so when b forces a small "
        "scale s the rounding inflates Δ̃₂ (by up to √D/2 in grid units) and the same ledger ε costs more "
        "noise. *Ledger ε*: the distributed rows' Skellam events are RDP-only (the ledger has no PLD for "
        "them); the central rows' Gaussian events get the tighter of RDP and PLD; the central rows' RDP-only "
        "ε is " + ", ".join(f"{_f(v)} (ε = {e:g})" for e, v in rdp.items()) + ", the same as Skellam's "
        "up to its O(1/μ²) discreteness term. *Poisson column*: what the same central release would "
        "cost if the clients were Poisson-sampled with q = m/N and the sample kept secret from the "
        "server; secure aggregation cannot have that amplification against the server, which picks the "
        "sample.",
        "",
    ]
    lines += [
        "Largest z each b holds (`scale_for_bits` at m = "
        f"{cfg['clients_per_round']}, D = {result['padded_dim']}, C = {cfg['clip']}): "
        + ", ".join(f"b = {b}: {largest_z_for_bits(b, cfg, result['dim']):.3g}" for b in cfg["bits"])
        + ".",
        "",
    ]
    lines += [
        "## (b) Upload bytes per client\n",
        "| b | D | ⌈D·b/8⌉ bytes | dense float32 4·d | ratio |",
        "|---|---|---|---|---|",
    ]
    for r in result["bytes"]:
        lines.append(
            f"| {r['bits']} | {r['padded_dim']} | {r['bytes']:,} | {r['dense_float32_bytes']:,} | {r['ratio']:.3f} |"
        )
    t = result["timing"]
    lines += [
        "",
        f"## (c) One round's wall time, {t['clients']} clients in one process (real crypto), "
        f"b = {t['bits']}, z = {t['noise_multiplier']:.3g}\n",
        "Medians over the timed rounds (after one warm-up pass); seconds. One process plays every client "
        "in turn, so the client columns are sums over the clients and add up to the round with the server; "
        "in a deployment the clients run in parallel and a round lasts about server + one client's share. "
        "Noise check: ‖released − initial − mean of the clipped raw updates‖ / (σ√d) with σ = z_eff·C/n "
        "the noise std the strategy claims (≈ 1 when the round adds exactly that noise to exactly that "
        "mean).\n",
        "| strategy | timed rounds | round | × FedAvg | client training | client encoding | client crypto + "
        "protocol | server (all) | server unmask + decode | upload B/client | noise check |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in t["rows"]:
        secure = r["strategy"].startswith("secure")
        lines.append(
            f"| {r['strategy']} | {r['timed_rounds']} | {r['round_s']:.2f} | {r['ratio_to_fedavg']:.2f} | "
            f"{r['client_train_s']:.2f} | {r['client_encode_s']:.2f} | {r['client_crypto_s']:.2f} | "
            f"{r['server_s']:.2f} | {_f(r['server_aggregate_s'] if secure else None, '.2f')} | "
            f"{r['upload_bytes_per_client']:,.0f} | {_f(r.get('noise_ratio'), '.3f')} |"
        )
    stages = [f"client app: {s}" for s in ("setup", "share-keys", "collect", "unmask")]
    probes = stages[:3] + ["client train"] + list(dict.fromkeys(label for _, _, label in PROBES)) + stages[3:]
    secure_rows = [r for r in t["rows"] if r["strategy"].startswith("secure")]
    if secure_rows:
        lines += [
            "",
            "Where the secure rounds' time goes (seconds, summed over clients; `client app: <stage>` is "
            "the whole ClientApp call per protocol stage, the other rows are the library functions inside "
            "it, timed by wrapping them):\n",
            "| | " + " | ".join(r["strategy"] for r in secure_rows) + " |",
            "|---|" + "---|" * len(secure_rows),
        ]
        for key in probes:
            lines.append(f"| {key} | " + " | ".join(f"{r['stages'].get(key, 0.0):.2f}" for r in secure_rows) + " |")
    return "\n".join(lines) + "\n"


def write_csv(result: dict, path: Path) -> None:
    keys = [
        "target_epsilon",
        "method",
        "bits",
        "status",
        "noise_multiplier",
        "effective_noise_multiplier",
        "ledger_epsilon",
        "central_poisson_epsilon",
        "central_no_amplification_epsilon",
        "central_no_amplification_epsilon_rdp",
        "accuracy",
        "accuracy_last5",
        "scale",
        "l2_sensitivity",
        "mu",
        "largest_z_for_bits",
        "rounds",
        "clients_per_round",
        "clip",
        "wall_s",
        "encode_s",
    ]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        for r in result["accuracy"]:
            writer.writerow({k: r.get(k, "") for k in keys})


def plot(result: dict, path: Path) -> None:
    """Left: final accuracy per ε and method. Right: the secure round's time split against FedAvg and central DP."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    acc = result["accuracy"]
    eps = sorted({r["target_epsilon"] for r in acc if math.isfinite(r["target_epsilon"])})
    methods = ["central", "central-redraw"] + [f"ddp-{b}" for b in result["config"]["bits"]]
    fig, (ax_a, ax_t) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(methods)
    for j, method in enumerate(methods):
        values = [
            next(
                (r.get("accuracy_last5", math.nan) for r in acc if r["method"] == method and r["target_epsilon"] == e),
                math.nan,
            )
            for e in eps
        ]
        label = LABELS.get(method, f"distributed, b = {method[4:]}")
        bars = ax_a.bar(
            [i + j * width for i in range(len(eps))], [0 if math.isnan(v) else v for v in values], width, label=label
        )
        for bar, v in zip(bars, values):
            if math.isnan(v):
                ax_a.text(bar.get_x() + bar.get_width() / 2, 0.02, "does not fit", rotation=90, ha="center", fontsize=7)
    fedavg = next(r["accuracy_last5"] for r in acc if r["method"] == "fedavg")
    ax_a.axhline(fedavg, color="k", ls="--", lw=1, label="FedAvg (non-private)")
    ax_a.set_xticks([i + 0.4 - width / 2 for i in range(len(eps))], [f"ε = {e:g}" for e in eps])
    ax_a.set(
        ylabel="test accuracy, mean of the last 5 rounds",
        ylim=(0, 1),
        title=f"MNIST, m = {result['config']['clients_per_round']}/round, T = {result['config']['rounds']}, same z",
    )
    ax_a.legend(fontsize=7, loc="lower right")
    rows = result["timing"]["rows"]
    parts = [
        ("client_train_s", "client training"),
        ("client_encode_s", "client encoding"),
        ("client_crypto_s", "client crypto + protocol"),
        ("server_s", "server"),
    ]
    bottom = np.zeros(len(rows))
    for key, label in parts:
        values = np.array([r[key] for r in rows])
        ax_t.bar(range(len(rows)), values, bottom=bottom, label=label)
        bottom += values
    ax_t.set_xticks(range(len(rows)), [r["strategy"] for r in rows], fontsize=8, rotation=15)
    ax_t.set(ylabel="seconds per round", title=f"one round, {result['timing']['clients']} clients in one process")
    ax_t.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


SUPPLEMENT_HEADING = "## Supplementary:"


def _supplement(path: Path) -> str:
    """The hand-appended supplementary sections of an existing results.md (kept by ``--report``)."""
    if not path.exists():
        return ""
    text = path.read_text()
    index = text.find(SUPPLEMENT_HEADING)
    return "" if index < 0 else "\n" + text[index:]


def main(argv: Optional[list[str]] = None) -> int:
    """Command line: ``[--quick | --tiny] [--rounds T] [--out DIR] [--seed N] [--jobs K]``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="ε = 8 only, 20 rounds, k = 21 timing only")
    group.add_argument("--tiny", action="store_true", help="toy sizes for the smoke test")
    parser.add_argument("--rounds", type=int, help="override the mode's number of rounds T")
    parser.add_argument("--out", type=Path, default=ROOT / "flwr_dp_benchmarks" / "distributed_dp")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1, help="accuracy runs in parallel processes")
    parser.add_argument(
        "--report", action="store_true", help="only rebuild results.md, runs.csv and the plot from OUT/results.json"
    )
    parser.add_argument(
        "--timing-only",
        action="store_true",
        help="re-measure (c) with the current library and "
        "replace it in OUT/results.json (accuracy and bytes kept), then rebuild the outputs",
    )
    parser.add_argument(
        "--secagg-scale",
        action="store_true",
        help="only (d): one secure round at --secagg-clients clients, 5%% dropout, ours against Flower's "
        "primitives; writes OUT/secagg_scale.json and OUT/secagg_scale.md (nothing else is touched)",
    )
    parser.add_argument("--secagg-clients", default="100,300,1000", help="cohort sizes for --secagg-scale")
    parser.add_argument(
        "--all-clients",
        action="store_true",
        help="only (e): accuracy with every client in every round (m = N, b = 20); writes OUT/all_clients.json "
        "and OUT/all_clients.md",
    )
    parser.add_argument(
        "--secagg-baseline-max", type=int, default=1000, help="largest cohort that also runs Flower's primitives"
    )
    args = parser.parse_args(argv)
    if args.secagg_scale:
        mode = "tiny" if args.tiny else ("quick" if args.quick else "full")
        cfg = {**CONFIG, **MODES[mode], "seed": args.seed}
        clients = tuple(int(c) for c in args.secagg_clients.split(","))
        result = run_scale(cfg, args.seed, clients, args.secagg_baseline_max)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "secagg_scale.json").write_text(json.dumps(result, indent=1, default=float))
        (args.out / "secagg_scale.md").write_text(scale_markdown(result))
        print(scale_markdown(result))
        return 0
    if args.all_clients:
        result = run_all_clients(args.seed, args.jobs, args.rounds, tiny=args.tiny)
        args.out.mkdir(parents=True, exist_ok=True)
        user_level_path = ROOT / "flwr_dp_benchmarks" / "user_level" / "results.json"
        user_level = json.loads(user_level_path.read_text()) if user_level_path.exists() and not args.tiny else None
        (args.out / "all_clients.json").write_text(json.dumps(result, indent=1, default=float))
        (args.out / "all_clients.md").write_text(all_clients_markdown(result, user_level))
        print(all_clients_markdown(result, user_level))
        return 0
    if args.timing_only:
        result = json.loads((args.out / "results.json").read_text())
        result["timing"] = time_rounds(result["config"], result["timing"]["noise_multiplier"], result["seed"])
        result["timing_created"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
        (args.out / "results.json").write_text(json.dumps(result, indent=1, default=float))
        args.report = True
    if args.report:
        supplement = _supplement(args.out / "results.md")
        result = json.loads((args.out / "results.json").read_text())
        write_csv(result, args.out / "runs.csv")
        (args.out / "results.md").write_text(markdown(result) + supplement)
        plot(result, args.out / "accuracy_and_round_time.png")
        print(markdown(result))
        return 0
    mode = "tiny" if args.tiny else ("quick" if args.quick else "full")
    args.out.mkdir(parents=True, exist_ok=True)
    runs = args.out / "runs.jsonl"
    runs.unlink(missing_ok=True)

    def append(row: dict) -> None:
        with runs.open("a") as handle:
            handle.write(json.dumps(row, default=float) + "\n")

    result = run(mode, args.seed, args.jobs, args.rounds, on_row=append)
    (args.out / "results.json").write_text(json.dumps(result, indent=1, default=float))
    write_csv(result, args.out / "runs.csv")
    (args.out / "results.md").write_text(markdown(result))
    plot(result, args.out / "accuracy_and_round_time.png")
    print(markdown(result))
    print(f"wrote {args.out / 'results.md'}, runs.csv, results.json and accuracy_and_round_time.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
