r"""Prefix-sum noise of DP-FTRL with banded matrix factorisation against DP-FedAvg, at equal (ε, δ) (issue 30).

Protocol (the issue's user-level protocol): N = 1 000 clients, m = 100 per round, each at most once every
b = 10 rounds, T ∈ {40, 200} rounds, so k = T/b participations per client; ε ∈ {1, 2, 8}, δ = 1e-5. Clip 1.

For each mechanism the noise multiplier is calibrated (dp-accounting's ``calibrate_dp_mechanism`` with its
PLD accountant, add-or-remove-one) to exactly (ε, δ); the figure is the RMS over rounds t of the standard
deviation of the noise on the prefix sum :math:`\sum_{s\le t} \hat x_s` (per coordinate, before the common
division by m), reported as a multiple of un-amplified DP-FedAvg's:

* **DP-FedAvg, no amplification**: independent Gaussian noise of multiplier z per round, k rounds per client:
  the composition of k ``GaussianDpEvent(z)``; prefix noise :math:`z\sqrt t`.
* **BandMF** (banded square root, and its b coefficients optimised for T): one ``GaussianDpEvent(z / sens)``
  with sens = √k (unit-norm coefficients, b-min-separation; :mod:`flwr_dp_strategies.privacy.mechanisms.matrix_factorization`);
  prefix noise z times the row norms of :math:`AC^{-1}`.
* **Binary tree** with Honaker's least-squares decoder B = A C⁺: one ``GaussianDpEvent(z / sens)`` with sens the
  maximum over every b-min-separated pattern of at most k rounds of :math:`\sqrt{\sum_{i,j\in\pi}(C^\top C)_{ij}}`
  (brute force; T = 40 only: at T = 200 the patterns are too many); prefix noise z times the row norms of B.
* **Tree (streaming)** and **BLT** (``factorization="tree"`` / ``"blt"`` of the strategy): the plain binary tree
  (no Honaker decoder: it reads later nodes) with its sound prefix-sensitivity bound, and a buffered linear Toeplitz
  C with 3 buffers optimised for (T, b, k) with its exact sensitivity
  (:mod:`flwr_dp_strategies.privacy.mechanisms.matrix_factorization`); one ``GaussianDpEvent(z / sens)`` each.
* **DP-FedAvg with Poisson sampling** (amplified, what ``AccountedPoissonFixedClipping`` books): T rounds of
  ``PoissonSampledDpEvent(q = m/N, GaussianDpEvent(z))``; prefix noise :math:`z\sqrt t`.
* **Amplified BandMF** (``sampling="cyclic-poisson"``, banded square root with b' bands): b' groups of N/b',
  each member of the round's group asked with q' = m·b'/N, so the expected cohort stays m; ⌈T/b'⌉
  ``PoissonSampledDpEvent(q', GaussianDpEvent(z))`` (Choquette-Choo et al. 2023, Thm 4); prefix noise z times
  the row norms of :math:`AC^{-1}`. The row is the best b' of {1, 2, 5, 10} at each (T, ε), named in the table
  (b' = 1 is DP-FedAvg with Poisson sampling; b' = 10 is un-amplified, q' = 1): the one tuning knob, the same
  four trials at every (T, ε).

Un-amplified mechanisms are all one Gaussian mechanism, so their ratios do not depend on ε (nor δ); the
amplified row does. Analytic figures (no training): the tuning budget is zero for every row.

Run: ``python -m flwr_dp_benchmarks.bench_bandmf`` (about a minute); writes ``results/bandmf/results.{json,md}``.

**--train** (accuracy, issue 30 item 4): ``python -m flwr_dp_benchmarks.bench_bandmf --train [--rounds 40]
[--jobs 2] [--c-from 40] [--report-only]``, on bench_user_level's protocol (MNIST split IID over N = 1 000
clients of 60, the 784-64-10 MLP, each client 2 local epochs of SGD, batch 20, rate 0.1, from the global model;
the sum divided by the public m = 100; δ = 1e-5; seed 0; test accuracy after the last round). Rows:

* ``dp-fedavg``: :class:`~flwr_dp_strategies.AccountedServerSideFixedClipping`, m = 100 drawn uniformly per round
  (Flower's FedAvg sampling), no participation rule, so a client may be in all T rounds: T ``GaussianDpEvent(z)``.
  Flower's own wrapper is the ``flower-fixed`` row of bench_user_level (same protocol).
* ``bandmf``: :class:`~flwr_dp_strategies.AccountedBandedMatrixFactorization`, banded square root, b = 10 cyclic
  groups of 100 (every client once every 10 rounds), k = T/10: one ``GaussianDpEvent(z/√k)``.
* ``bandmf-amplified``: the same with ``sampling="cyclic-poisson"`` and b' = 5 groups of 200, each member asked
  with q' = 0.5 (expected cohort 100): T/5 ``PoissonSampledDpEvent(0.5, GaussianDpEvent(z))``. b' = 1 would be
  the Poisson row exactly and b' = 10 the un-amplified row; b' = 5 was fixed beforehand (its noise ratio,
  above, lies between the two), not tuned on accuracy.
* ``poisson-fixed`` / ``poisson-adaptive``: :class:`~flwr_dp_strategies.AccountedPoissonFixedClipping` /
  :class:`~flwr_dp_strategies.AccountedAdaptiveClipping`, Poisson q = 0.1, as bench_user_level runs them (at
  T = 40 its C = 1 and adaptive runs are reused from ``user_level/results.json``: same protocol, seed, ledger).
* cross-silo: N = 10 clients of 6 000, all in every round (m = 10), ε = 8: ``dp-fedavg`` and ``bandmf`` with
  b = 1, the only banding the participation allows (then BandMF's noise is DP-FedAvg's).

z is calibrated for each row on the events its strategy's ledger books (``train_events``; the achieved ledger ε
of every run is recorded). **Tuning budget, the same for every clipped method**: C ∈ {0.3, 1, 3}, the best on
test accuracy reported per (method, ε, T), as Flower's row is tuned in bench_user_level; the adaptive row has
no C. Learning rate, epochs and batch are bench_user_level's, chosen once for non-private FedAvg. ``--c-from 40``
runs another T with each method's best C at T = 40 only (a smaller budget, the same for each). Each run is
appended to ``results/bandmf/train/runs-T.jsonl`` (resumable); the tables go to ``results/bandmf/train.{json,md}``.

**--model-scale** (cost, issue 39 item 3): ``python -m flwr_dp_benchmarks.bench_bandmf --model-scale [--with-1e8]
[--repeats 5]``: d ∈ {10⁶, 10⁷} (and 10⁸, about 15 GB; a d that does not fit in the available memory is skipped),
b = 10, 10 clients whose float32 replies (bench_aggregation's) are aggregated alternately by Flower's FedAvg and by
:class:`~flwr_dp_strategies.AccountedBandedMatrixFactorization` (its group of the release is the same 10 replies;
z = C = 1; a ledger file): seconds per round and their ratio, the background noise row, the bytes written per round
(BandMF's secret files and the ledger file apart), the state on disk, the noise ring's memory and the tracemalloc
peak of one round above the replies. Writes ``results/bandmf/model_scale.{json,md}``;
``results/bandmf/model_scale_before.json`` holds the same protocol run on the code before the keyed stream.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from pathlib import Path
from typing import Optional

import numpy as np
from dp_accounting import LowerEndpointAndGuess, calibrate_dp_mechanism
from dp_accounting.dp_event import GaussianDpEvent, PoissonSampledDpEvent, SelfComposedDpEvent
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant

from flwr_dp_benchmarks._common import quiet_loggers
from flwr_dp_strategies.privacy.accounting import bandmf_amplification as ba
from flwr_dp_strategies.privacy.mechanisms import matrix_factorization as mf

NAME = "bandmf"
EPSILONS = (1.0, 2.0, 8.0)
ROUNDS = (40, 200)
CLIENTS, COHORT, BANDS, DELTA = 1000, 100, 10, 1e-5
AMPLIFIED_BANDS = (1, 2, 5, 10)
WINDOW_CONFIGS = ((2, 5, 6), (2, 5, 3), (5, 2, 9), (5, 2, 5))  # (groups G, window w, bands b <= (G-1)w + 1), G·w = N/m
RESULTS = Path(__file__).resolve().parent / "results" / "bandmf"


def calibrate(event_of, epsilon: float, delta: float = DELTA) -> float:
    """The smallest noise multiplier z whose ``event_of(z)`` is (ε, δ)-DP under dp-accounting's PLD."""
    return float(
        calibrate_dp_mechanism(
            lambda: PLDAccountant(value_discretization_interval=1e-3),
            event_of,
            epsilon,
            delta,
            LowerEndpointAndGuess(0.05, 1.0),
            tol=1e-4,
        )
    )


def window_allocation_epsilon(
    z: float, rounds: int, groups: int, window: int, bands: int, delta: float = DELTA
) -> float:
    """ε at δ of BandMF under window allocation (sampling="window-allocation"): the smaller of the sampling-free RDP
    bound of ⌈T/(G·w)⌉ cycles (:mod:`flwr_dp_strategies.privacy.accounting.bandmf_amplification`, converted as the
    ledger's RDP accountant does) and the un-amplified Gaussian of sensitivity √k, k = the cycles (PLD)."""
    from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

    cycles = math.ceil(rounds / (groups * window))
    coefficients = mf.banded_sqrt_coefficients(bands)
    accountant = RdpAccountant()
    orders = np.asarray(accountant._orders, dtype=np.float64)
    rdp = cycles * ba.window_allocation_rdp(coefficients, window, z, orders)
    amplified = float(rdp_epsilon(orders, rdp, delta))
    pld = PLDAccountant(value_discretization_interval=1e-3)
    pld.compose(GaussianDpEvent(z / math.sqrt(cycles)))
    return min(amplified, float(pld.get_epsilon(delta)))


def rdp_epsilon(orders: np.ndarray, rdp: np.ndarray, delta: float) -> float:
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    return float(compute_epsilon(orders, rdp, delta)[0])


def calibrate_window(epsilon: float, rounds: int, groups: int, window: int, bands: int) -> float:
    """The smallest z (relative tolerance 1e-3, bisection in log z) with :func:`window_allocation_epsilon` ≤ ε."""
    lo, hi = 0.05, 200.0
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        if window_allocation_epsilon(mid, rounds, groups, window, bands) > epsilon:
            lo = mid
        else:
            hi = mid
    return hi


BLT_BUFFERS = 3  # the strategy's default num_buffers


def rms_rows(matrix: np.ndarray) -> float:
    """RMS over rows of the row norms."""
    return float(math.sqrt(np.mean(np.sum(matrix * matrix, axis=1))))


def table(
    epsilons=EPSILONS,
    rounds=ROUNDS,
    amplified_bands=AMPLIFIED_BANDS,
    poisson: bool = True,
    window_configs=WINDOW_CONFIGS,
) -> list[dict]:
    """One row per (T, ε); ``amplified_bands=()`` / ``poisson=False`` / ``window_configs=()`` leave out the (slow)
    amplified rows."""
    rows = []
    for t in rounds:
        k = math.ceil(t / BANDS)
        base_shape = rms_rows(mf.prefix_sum_matrix(t))  # √(mean t)
        shapes = {
            "banded-sqrt": (mf.toeplitz_prefix_error(mf.banded_sqrt_coefficients(BANDS), t), math.sqrt(k)),
            "banded-optimal": (mf.toeplitz_prefix_error(mf.optimal_banded_coefficients(t, BANDS), t), math.sqrt(k)),
        }
        if t <= 64:
            decoder, tree = mf.binary_tree_factorization(t)
            shapes["tree (Honaker)"] = (rms_rows(decoder), mf.brute_force_sensitivity(tree, BANDS, k))
        # what the strategy streams: factorization="tree" (plain tree, its sound prefix-sensitivity bound) and
        # factorization="blt" (BLT_BUFFERS buffers, optimised for (T, b, k), exact earliest-pattern sensitivity)
        shapes["tree (streaming)"] = (mf.tree_prefix_error(t), mf.tree_prefix_sensitivities(t, BANDS, k)[-1])
        lambdas, thetas = mf.optimal_blt_parameters(t, BLT_BUFFERS, BANDS, k)
        shapes[f"blt (n={BLT_BUFFERS})"] = (
            mf.blt_prefix_error(lambdas, thetas, t),
            mf.toeplitz_prefix_sensitivities(mf.blt_coefficients(lambdas, thetas, t), BANDS, k)[-1],
        )
        for epsilon in epsilons:
            z_fedavg = calibrate(lambda z, k=k: SelfComposedDpEvent(GaussianDpEvent(z), k), epsilon)
            z_unit = calibrate(lambda z: GaussianDpEvent(z), epsilon)  # one Gaussian of sensitivity 1
            base = z_fedavg * base_shape
            row = {"rounds": t, "k": k, "epsilon": epsilon, "delta": DELTA, "z_dp_fedavg": z_fedavg}
            for name, (shape, sens) in shapes.items():
                # one Gaussian of sensitivity sens: z = z_unit · sens; prefix noise z · shape (shape has ‖c‖ = 1)
                row[name] = z_unit * sens * shape / base
            if poisson:
                z_poisson = calibrate(
                    lambda z, t=t: SelfComposedDpEvent(PoissonSampledDpEvent(COHORT / CLIENTS, GaussianDpEvent(z)), t),
                    epsilon,
                )
                row["dp-fedavg poisson (amplified)"] = z_poisson * base_shape / base
                row["z poisson"] = z_poisson
            best = None
            for bands in amplified_bands:
                rate, epochs = COHORT * bands / CLIENTS, math.ceil(t / bands)
                z_amp = calibrate(
                    lambda z, rate=rate, epochs=epochs: SelfComposedDpEvent(
                        PoissonSampledDpEvent(rate, GaussianDpEvent(z)), epochs
                    ),
                    epsilon,
                )
                ratio = z_amp * mf.toeplitz_prefix_error(mf.banded_sqrt_coefficients(bands), t) / base
                if best is None or ratio < best[0]:
                    best = (ratio, bands, z_amp)
            if best is not None:
                row["amplified banded-sqrt (best b')"], row["amplified b'"], row["z amplified"] = best
            best = None
            for groups, window, bands in window_configs:
                z_win = calibrate_window(epsilon, t, groups, window, bands)
                ratio = z_win * mf.toeplitz_prefix_error(mf.banded_sqrt_coefficients(bands), t) / base
                row[f"window G={groups} w={window} b={bands}"] = ratio
                row[f"z window G={groups} w={window} b={bands}"] = z_win
                if best is None or ratio < best[0]:
                    best = (ratio, f"G={groups} w={window} b={bands}", z_win)
            if best is not None:
                row["window allocation (best)"], row["window config"], row["z window"] = best
            rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    skip = ("rounds", "k", "epsilon", "delta", "z_dp_fedavg")
    names = [
        n
        for n in dict.fromkeys(n for r in rows for n in r if n not in skip)
        if not n.startswith("z ") and not n.startswith("window G=")
    ]
    head = "| T | k | ε | z (DP-FedAvg) | " + " | ".join(names) + " |\n|" + "---|" * (4 + len(names)) + "\n"
    body = "".join(
        f"| {r['rounds']} | {r['k']} | {r['epsilon']:g} | {r['z_dp_fedavg']:.3f} | "
        + " | ".join(
            ("–" if n not in r else f"{r[n]}" if isinstance(r[n], (int, str)) else f"{r[n]:.2f}") for n in names
        )
        + " |\n"
        for r in rows
    )
    text = (
        "Prefix-sum noise (RMS over rounds) as a multiple of un-amplified DP-FedAvg's at the same (ε, δ = 1e-5); "
        f"N = {CLIENTS}, m = {COHORT}, b = {BANDS}.\n\n" + head + body
    )
    configs = [n[len("window ") :] for n in dict.fromkeys(n for r in rows for n in r) if n.startswith("window G=")]
    if configs:
        text += (
            "\nWindow allocation (``sampling=\"window-allocation\"``: G groups, each member asked in one secret uniformly "
            "random release of its group's window of w releases per cycle of G·w = N/m; banded square root of b <= "
            "(G-1)w + 1 bands; sampling-free RDP bound, or the un-amplified Gaussian when smaller): noise multiplier z "
            "and prefix-sum noise as a multiple of un-amplified DP-FedAvg's, against Poisson DP-FedAvg (q = 0.1) and the "
            "best cyclic-poisson BandMF (Choquette-Choo et al. 2023, Thm 4, PLD).\n\n"
            "| T | ε | Poisson z | Poisson noise | cyclic-poisson best b' | its z | its noise | "
            + " | ".join(f"{c}: z / noise" for c in configs)
            + " |\n|"
            + "---|" * (7 + len(configs))
            + "\n"
        )
        nan = float("nan")
        for r in rows:
            cyclic_b, cyclic_noise = r.get("amplified b'", "–"), r.get("amplified banded-sqrt (best b')", nan)
            text += (
                f"| {r['rounds']} | {r['epsilon']:g} | {r.get('z poisson', nan):.3f} | "
                f"{r.get('dp-fedavg poisson (amplified)', nan):.3f} | {cyclic_b} | "
                f"{r.get('z amplified', nan):.3f} | {cyclic_noise:.3f} | "
                + " | ".join(f"{r['z window ' + c]:.3f} / {r['window ' + c]:.3f}" for c in configs)
                + " |\n"
            )
    return text


# ============================================================================ --train: accuracy (issue 30 item 4)
TRAIN_EPSILONS = (1.0, 2.0, 8.0)
TRAIN_C_GRID = (0.3, 1.0, 3.0)  # the tuning budget of every clipped method: best of these on test accuracy
AMPLIFIED_TRAIN_BANDS = 5  # b' of the amplified row (q' = m·b'/N = 0.5; b' = 1 is the Poisson row, b' = 10 is BandMF)
CROSS_SILO = dict(num_clients=10, epsilon=8.0)
TRAIN_METHODS = ("dp-fedavg", "bandmf", "bandmf-amplified", "poisson-fixed", "poisson-adaptive")
TRAIN_LABELS = {
    "dp-fedavg": "DP-FedAvg, no amplification (ours; m drawn per round)",
    "bandmf": "BandMF, no amplification (b = 10, cyclic)",
    "bandmf-amplified": f"amplified BandMF (cyclic-poisson, b' = {AMPLIFIED_TRAIN_BANDS})",
    "poisson-fixed": "AccountedPoissonFixedClipping (q = 0.1)",
    "poisson-adaptive": "AccountedAdaptiveClipping (q = 0.1)",
}
USER_LEVEL_RESULTS = Path(__file__).resolve().parent / "user_level" / "results.json"
TRAIN_RESULTS = RESULTS / "train"


def train_events(method: str, z: float, rounds: int, num_clients: int, cohort: int, bands: int) -> list:
    """The events the strategy's own ledger books over ``rounds`` releases at noise multiplier z."""
    if method == "dp-fedavg":
        return [GaussianDpEvent(z)] * rounds
    if method in ("poisson-fixed", "poisson-adaptive"):
        return [PoissonSampledDpEvent(cohort / num_clients, GaussianDpEvent(z))] * rounds
    if method == "bandmf":
        coefficients, k = mf.banded_sqrt_coefficients(bands), math.ceil(rounds / bands)
        events = [mf.round_event(coefficients, t, z, bands, k) for t in range(1, rounds + 1)]
    elif method == "bandmf-amplified":
        rate = cohort * bands / num_clients
        events = [mf.amplified_round_event(t, z, bands, rate) for t in range(1, rounds + 1)]
    else:
        raise ValueError(f"unknown method {method!r}")
    return [e for e in events if e is not None]


def method_bands(method: str, num_clients: int) -> int:
    """b of a BandMF row (cross-silo: 1, every client every round); 1 for the others."""
    if num_clients <= CROSS_SILO["num_clients"]:
        return 1
    return {"bandmf": BANDS, "bandmf-amplified": AMPLIFIED_TRAIN_BANDS}.get(method, 1)


@quiet_loggers()
def train_one(method: str, target: float, rounds: int, clip: Optional[float], num_clients: int, seed: int = 0) -> dict:
    """One training run on bench_user_level's protocol: z calibrated on the strategy's own ledger, accuracy."""
    import random

    from flwr.serverapp.strategy import FedAvg

    import flwr_dp_strategies as fds
    from flwr_dp_benchmarks import bench_user_level as ul
    from flwr_dp_benchmarks.bench_privacy_utility import calibrate as bisect, ledger_epsilon, make_federation
    from flwr_dp_strategies import PrivacyLedger

    cfg = {**ul.CONFIG, "rounds": rounds, "num_clients": num_clients}
    fed = make_federation("mnist", num_clients)
    n = fed.num_clients
    m = min(n, COHORT)
    bands = method_bands(method, n)
    z, _ = bisect(
        lambda x, how: ledger_epsilon("add_or_remove_one", train_events(method, x, rounds, n, m, bands), method=how),
        target,
        increasing=False,
        lo=0.05,
        hi=3000.0,
    )
    random.seed(seed)
    np.random.seed(seed)
    rng = np.random.default_rng([seed, 1])
    ledger = PrivacyLedger(DELTA)
    if method == "dp-fedavg":
        strategy = fds.AccountedServerSideFixedClipping(ul._fixed_size_fedavg(n, m), z, clip, m, ledger=ledger, rng=rng)
    elif method in ("bandmf", "bandmf-amplified"):
        strategy = fds.AccountedBandedMatrixFactorization(
            FedAvg(fraction_evaluate=0.0),
            z,
            clip,
            m,
            num_bands=bands,
            num_rounds=rounds,
            sampling="cyclic-poisson" if method == "bandmf-amplified" and bands > 1 else "cyclic",
            num_clients=n,
            ledger=ledger,
            rng=rng,
        )
    elif method == "poisson-fixed":
        strategy = fds.AccountedPoissonFixedClipping(
            FedAvg(fraction_evaluate=0.0), z, clip, m, num_clients=n, ledger=ledger, rng=rng
        )
    elif method == "poisson-adaptive":
        strategy = fds.AccountedAdaptiveClipping(
            FedAvg(fraction_evaluate=0.0),
            z,
            m,
            **ul.ADAPTIVE,
            clipped_count_stddev=ul._count_std(z, m),
            num_clients=n,
            ledger=ledger,
            rng=rng,
        )
    else:
        raise ValueError(f"unknown method {method!r}")
    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    with ul._TaskIdentity(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        accuracy, _ = ul._train(fed, cfg, strategy, seed)
    return {
        "method": method,
        "setting": "cross-silo" if n <= CROSS_SILO["num_clients"] else "user-level",
        "target_epsilon": target,
        "ledger_epsilon": float(ledger.report().epsilon),
        "noise_multiplier": z,
        "clip": clip,
        "bands": bands,
        "rounds": rounds,
        "num_clients": n,
        "clients_per_round": m,
        "accuracy": accuracy[-1],
        "accuracy_curve": accuracy,
        "wall_s": time.perf_counter() - t0,
    }


def train_jobs(rounds: int, methods=TRAIN_METHODS, epsilons=TRAIN_EPSILONS, cross_silo: bool = True) -> list[tuple]:
    """(method, ε, T, C, N) of every run, most informative first (C = 1, then 0.3, then 3: a run cut short keeps
    whole C columns); the T = 40 Poisson rows at C = 1 and the adaptive rows are reused from bench_user_level."""
    silo = [("dp-fedavg", "bandmf")] if cross_silo else []
    out = []
    for clip in (1.0, 0.3, 3.0):
        for eps in epsilons:
            for method in methods:
                if method == "poisson-adaptive":
                    if clip == 1.0 and rounds != 40:  # no C to tune: once
                        out.append((method, eps, rounds, None, CLIENTS))
                elif not (rounds == 40 and method == "poisson-fixed" and clip == 1.0):
                    out.append((method, eps, rounds, clip, CLIENTS))
        for pair in silo:
            out += [(method, CROSS_SILO["epsilon"], rounds, clip, CROSS_SILO["num_clients"]) for method in pair]
    return out


def carried_c_jobs(rounds: int, runs_at: list[dict], methods=TRAIN_METHODS, epsilons=TRAIN_EPSILONS) -> list[tuple]:
    """(method, ε, T, C, N) at T = ``rounds`` with each method's best C of ``runs_at`` (another T) at that ε: the
    same reduced tuning budget for every method (no C tried at this T). User-level only."""
    best = {(r["method"], r["target_epsilon"]): r["clip"] for r in best_rows(runs_at) if r["setting"] == "user-level"}
    return [
        (method, eps, rounds, best[(method, eps)], CLIENTS)
        for eps in epsilons
        for method in methods
        if (method, eps) in best
    ]


def load_runs(rounds: int, out: Path = TRAIN_RESULTS) -> list[dict]:
    """The finished runs at T = ``rounds`` (``out/runs-T.jsonl``) and the reused bench_user_level rows."""
    log = out / f"runs-{rounds}.jsonl"
    done = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
    return done + reused_user_level_rows(rounds)


def reused_user_level_rows(rounds: int) -> list[dict]:
    """bench_user_level's ``ours-fixed`` (C = 1) and ``ours-adaptive`` runs at T = ``rounds`` (same protocol, seed 0)."""
    if not USER_LEVEL_RESULTS.exists():
        return []
    data = json.loads(USER_LEVEL_RESULTS.read_text(encoding="utf-8"))
    if data["config"]["rounds"] != rounds:
        return []
    names = {"ours-fixed": "poisson-fixed", "ours-adaptive": "poisson-adaptive"}
    rows = []
    for run in data["all_runs"]:
        if run["method"] in names and run["target_epsilon"] in TRAIN_EPSILONS:
            rows.append(
                {
                    "method": names[run["method"]],
                    "setting": "user-level",
                    "target_epsilon": run["target_epsilon"],
                    "ledger_epsilon": run["ledger_epsilon"],
                    "noise_multiplier": run["noise_multiplier"],
                    "clip": run["clip"],
                    "bands": 1,
                    "rounds": rounds,
                    "num_clients": run["num_clients"],
                    "clients_per_round": run["clients_per_round"],
                    "accuracy": run["accuracy"],
                    "accuracy_curve": run["accuracy_curve"],
                    "wall_s": run["wall_s"],
                    "reused_from": "flwr_dp_benchmarks/user_level/results.json",
                }
            )
    return rows


def _key(row: dict) -> tuple:
    return (row["method"], row["target_epsilon"], row["rounds"], row["clip"], row["num_clients"])


def best_rows(runs: list[dict]) -> list[dict]:
    """The best C of each (setting, method, ε, T) on test accuracy (the tuning budget: TRAIN_C_GRID)."""
    best: dict[tuple, dict] = {}
    for row in runs:
        key = (row["setting"], row["method"], row["target_epsilon"], row["rounds"])
        if key not in best or row["accuracy"] > best[key]["accuracy"]:
            best[key] = row
    order = {m: i for i, m in enumerate(TRAIN_METHODS)}
    return sorted(
        best.values(),
        key=lambda r: (r["setting"] != "user-level", r["rounds"], r["target_epsilon"], order[r["method"]]),
    )


def train_markdown(runs: list[dict]) -> str:
    """The accuracy table: best C per (method, ε, T), with z and the achieved ledger ε."""
    lines = [
        "| setting | T | target ε | method | ledger ε | z | best C | accuracy | accuracy at C = 0.3 / 1 / 3 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in best_rows(runs):
        grid = {r["clip"]: r["accuracy"] for r in runs if _key(r)[:3] + _key(r)[4:] == _key(row)[:3] + _key(row)[4:]}
        cells = " / ".join(f"{grid[c]:.3f}" if c in grid else "–" for c in TRAIN_C_GRID)
        label = TRAIN_LABELS[row["method"]]
        if row["setting"] == "cross-silo":
            label = {"dp-fedavg": "DP-FedAvg (all 10 every round)", "bandmf": "BandMF, b = 1 (all 10 every round)"}[
                row["method"]
            ]
        label += " †" if row.get("reused_from") else ""
        clip = "-" if row["clip"] is None else f"{row['clip']:g}"
        lines.append(
            f"| {row['setting']} (N = {row['num_clients']}, m = {row['clients_per_round']}) | {row['rounds']} | "
            f"{row['target_epsilon']:g} | {label} | {row['ledger_epsilon']:.3f} | {row['noise_multiplier']:.3g} | "
            f"{clip} | {row['accuracy']:.3f} | "
            f"{'(no C: adaptive)' if row['clip'] is None else cells} |"
        )
    return (
        "\n".join(lines)
        + "\n\n† reused from bench_user_level (same protocol, seed and ledger; flwr_dp_benchmarks/user_level/results.json).\n"
    )


def train_pivot(runs: list[dict]) -> str:
    """The user-level rows as method × (T, ε): accuracy (best C, z)."""
    best = [r for r in best_rows(runs) if r["setting"] == "user-level"]
    cols = sorted({(r["rounds"], r["target_epsilon"]) for r in best})
    cell = {(r["method"], r["rounds"], r["target_epsilon"]): r for r in best}
    lines = [
        "| method | " + " | ".join(f"T = {t}, ε = {e:g}" for t, e in cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for method in TRAIN_METHODS:
        cells = []
        for t, e in cols:
            r = cell.get((method, t, e))
            clip = "" if r is None or r["clip"] is None else f"C {r['clip']:g}, "
            cells.append("–" if r is None else f"{r['accuracy']:.3f} ({clip}z {r['noise_multiplier']:.3g})")
        lines.append(f"| {TRAIN_LABELS[method]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def train(
    rounds: int,
    jobs: int = 1,
    methods=TRAIN_METHODS,
    cross_silo: bool = True,
    out: Path = TRAIN_RESULTS,
    c_from: Optional[int] = None,
    run: bool = True,
) -> list[dict]:
    """Every run of ``--train`` at T = ``rounds``, resumable: finished runs are kept in ``out/runs-T.jsonl``.
    ``c_from``: run each method only at its best C of the runs at that T (:func:`carried_c_jobs`)."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    out.mkdir(parents=True, exist_ok=True)
    log = out / f"runs-{rounds}.jsonl"
    done = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
    have = {_key(r) for r in done}
    planned = (
        train_jobs(rounds, methods, cross_silo=cross_silo)
        if c_from is None
        else carried_c_jobs(rounds, load_runs(c_from, out), methods)
    )
    todo = [job for job in planned if job not in have] if run else []

    def keep(row: dict) -> None:
        done.append(row)
        with log.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        print(
            f"{row['setting']:10s} T={row['rounds']} ε={row['target_epsilon']:g} {row['method']:16s} C={row['clip']} "
            f"z={row['noise_multiplier']:.3g} acc={row['accuracy']:.3f} ({row['wall_s']:.0f} s)",
            flush=True,
        )

    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for future in as_completed([pool.submit(train_one, *job) for job in todo]):
                keep(future.result())
    else:
        for job in todo:
            keep(train_one(*job))
    return done + reused_user_level_rows(rounds)


# ============================================================================ --model-scale: aggregation cost (issue 39 item 3)
SCALE_DIMS = (10**6, 10**7)
SCALE_BIG = 10**8  # behind --with-1e8 (10 float32 replies are 4 GB, the ring of b − 1 float64 rows 7.2 GB)
SCALE_CLIENTS, SCALE_BANDS = 10, 10


def _snapshot(folder: Path) -> dict:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.iterdir() if p.is_file()}


def _written(before: dict, after: dict) -> dict:
    """Bytes of the files created or rewritten between two snapshots: BandMF's secret files and the ledger's."""
    out = {"bandmf": 0, "ledger": 0}
    for name, (mtime, size) in after.items():
        if before.get(name) != (mtime, size):
            out["bandmf" if ".bandmf-" in name else "ledger"] += size
    return out


def scale_case(d: int, repeats: int = 3, clients: int = SCALE_CLIENTS, bands: int = SCALE_BANDS, seed: int = 0) -> dict:
    """One model size: ``clients`` float32 replies of d values (bench_aggregation's), aggregated by Flower's FedAvg
    and by AccountedBandMF (b bands, its group = the same ``clients`` replies, z = C = 1, a ledger file with the
    default PLD ledger) in alternation, one release per BandMF call; seconds per round (medians), bytes written per
    round, the state on disk and the tracemalloc peak of one round above the replies.

    BandMF makes the next noise row in the background from ``configure_train`` on (while the clients train); here
    the clients' training is a wait for that row (``noise_row_s``: configure_train + the row), so the timed
    aggregations never overlap it; ``ratio_with_noise_row`` counts the row in BandMF's time, as if the clients
    answered at once."""
    import gc
    import statistics
    import tempfile

    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.serverapp.strategy import FedAvg

    from flwr_dp_benchmarks._common import peak_bytes
    from flwr_dp_benchmarks.bench_aggregation import _FakeGrid, _TaskIdentity, _updates
    from flwr_dp_strategies import AccountedBandedMatrixFactorization

    stacked = _updates(clients, d, seed)
    records = [ArrayRecord([stacked[i]]) for i in range(clients)]  # serialised once, shared by both
    del stacked
    current = ArrayRecord([np.zeros(d, dtype=np.float32)])

    def replies_to(msgs):
        return [
            Message(RecordDict({"arrays": rec, "metrics": MetricRecord({"num-examples": 10.0})}), reply_to=msg)
            for msg, rec in zip(msgs, records)
        ]

    with _TaskIdentity(), tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        fedavg = FedAvg(min_train_nodes=clients, min_available_nodes=clients)
        fedavg_replies = replies_to(list(fedavg.configure_train(1, current, ConfigRecord(), _FakeGrid(clients))))
        rounds = 4 * (repeats + 2)
        bandmf = AccountedBandedMatrixFactorization(
            FedAvg(fraction_train=1.0, min_available_nodes=1),
            1.0,
            1.0,
            clients,
            num_bands=bands,
            num_rounds=rounds,
            ledger_path=folder / "ledger.json",
            rng=seed,
        )
        grid = _FakeGrid(clients * bands)
        state = {"round": 0, "prepare": []}

        def bandmf_round() -> tuple[float, dict]:
            state["round"] += 1
            t0 = time.perf_counter()
            msgs = list(bandmf.configure_train(state["round"], current, ConfigRecord(), grid))
            bandmf.noise.settle()  # the clients' training: the next noise row is made meanwhile
            state["prepare"].append(time.perf_counter() - t0)
            assert len(msgs) == clients, len(msgs)
            replies = replies_to(msgs)
            before = _snapshot(folder)
            gc.collect()
            t0 = time.perf_counter()
            arrays, _ = bandmf.aggregate_train(state["round"], replies)
            elapsed = time.perf_counter() - t0
            assert arrays is not None and arrays["0"].shape == (d,)
            return elapsed, _written(before, _snapshot(folder))

        def fedavg_round() -> float:
            gc.collect()
            t0 = time.perf_counter()
            arrays, _ = fedavg.aggregate_train(1, fedavg_replies)
            elapsed = time.perf_counter() - t0
            assert arrays is not None and arrays["0"].shape == (d,)
            return elapsed

        first = bandmf_round()  # warm-up: draws the key and writes its file
        fedavg_round()
        fed, band, written = [], [], []
        for i in range(repeats):
            if i % 2 == 0:
                fed.append(fedavg_round())
                seconds, files = bandmf_round()
            else:
                seconds, files = bandmf_round()
                fed.append(fedavg_round())
            band.append(seconds)
            written.append(files)
        fed_peak = peak_bytes(fedavg_round)
        band_peak = peak_bytes(bandmf_round)
        on_disk = {
            name: size for name, (_, size) in _snapshot(folder).items() if ".bandmf-" in name or name == "ledger.json"
        }
        bandmf.ledger_store.close()
    ring = (bands - 1) * d * 8
    return {
        "d": d,
        "clients": clients,
        "bands": bands,
        "repeats": repeats,
        "fedavg_s": statistics.median(fed),
        "bandmf_s": statistics.median(band),
        "ratio": statistics.median(band) / statistics.median(fed),
        "ratio_of_minima": min(band) / min(fed),
        "noise_row_s": statistics.median(state["prepare"][1 : 1 + repeats]),
        "ratio_with_noise_row": (statistics.median(band) + statistics.median(state["prepare"][1 : 1 + repeats]))
        / statistics.median(fed),
        "fedavg_s_all": fed,
        "bandmf_s_all": band,
        "first_release_written_bytes": first[1],
        "bandmf_state_written_bytes_per_round": max(w["bandmf"] for w in written),
        "ledger_written_bytes_per_round": max(w["ledger"] for w in written),
        "state_on_disk_bytes": on_disk,
        "noise_ring_bytes": ring,
        "fedavg_peak_bytes": fed_peak,
        "bandmf_peak_bytes": band_peak,
    }


def scale_markdown(result: dict) -> str:
    head = (
        "| d | FedAvg s/round | BandMF s/round | ratio | ratio of minima | noise row (background) s "
        "| ratio with the row | BandMF state written per round | key file "
        "| ledger file | noise ring (RAM) | peak FedAvg | peak BandMF |\n|" + "---|" * 13 + "\n"
    )
    body = ""
    for r in result["rows"]:
        key = sum(v for k, v in r["state_on_disk_bytes"].items() if ".bandmf-" in k)
        body += (
            f"| {r['d']:.0e} | {r['fedavg_s']:.3f} | {r['bandmf_s']:.3f} | {r['ratio']:.2f} | {r['ratio_of_minima']:.2f} | "
            f"{r['noise_row_s']:.3f} | {r['ratio_with_noise_row']:.2f} | "
            f"{r['bandmf_state_written_bytes_per_round']} B | {key} B | {r['state_on_disk_bytes'].get('ledger.json', 0)} B | "
            f"{r['noise_ring_bytes'] / 2**20:.0f} MiB | {r['fedavg_peak_bytes'] / 2**20:.0f} MiB | "
            f"{r['bandmf_peak_bytes'] / 2**20:.0f} MiB |\n"
        )
    return (
        f"Aggregation per round, {SCALE_CLIENTS} float32 replies of d values, b = {SCALE_BANDS} (BandMF's group is the "
        "same replies), z = C = 1, medians of the alternated rounds (and the ratio of the fastest of each, less "
        "sensitive to a loaded machine); BandMF with a ledger file (PLD ledger). BandMF makes each noise row in the "
        "background while the clients train (from configure_train on): 'noise row' is that time (configure_train "
        "included), 'ratio with the row' counts it in BandMF's aggregation as if the clients answered at once. "
        "Peaks: tracemalloc above the replies (BandMF's ring of b − 1 float64 rows is held between rounds and "
        f"not in its peak). Machine: {result['machine'].get('cpu_affinity')} CPUs, numpy {result['machine']['numpy']}."
        "\n\n" + head + body
    )


def model_scale(dims=SCALE_DIMS, repeats: int = 5) -> dict:
    from flwr_dp_benchmarks._common import available_memory_bytes, machine

    rows = []
    for d in dims:
        need = SCALE_CLIENTS * d * 4 * 2 + (SCALE_BANDS - 1) * d * 8  # replies (+ FedAvg's copies), the ring
        avail = available_memory_bytes()
        if avail is not None and need > 0.9 * avail:
            print(f"d={d:.0e} skipped: about {need / 2**30:.1f} GiB needed, {avail / 2**30:.1f} GiB available")
            continue
        rows.append(scale_case(d, repeats=repeats))
        print(json.dumps({k: v for k, v in rows[-1].items() if not k.endswith("_all")}), flush=True)
    return {"machine": machine(), "created": time.strftime("%Y-%m-%d %H:%M:%S %z"), "rows": rows}


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", action="store_true", help="the accuracy benchmark instead of the noise ratios")
    parser.add_argument("--rounds", type=int, nargs="+", default=[40], help="--train: T (40, 200)")
    parser.add_argument("--jobs", type=int, default=1, help="--train: runs in parallel processes")
    parser.add_argument("--methods", nargs="+", choices=TRAIN_METHODS, default=list(TRAIN_METHODS))
    parser.add_argument("--no-cross-silo", action="store_true", help="--train: leave out the 10-client runs")
    parser.add_argument("--c-from", type=int, help="--train: only each method's best C of the runs at this T")
    parser.add_argument("--report-only", action="store_true", help="--train: tables from the finished runs only")
    parser.add_argument("--model-scale", action="store_true", help="aggregation cost at d = 1e6, 1e7 (issue 39)")
    parser.add_argument("--with-1e8", action="store_true", help="--model-scale: also d = 1e8 (about 16 GB)")
    parser.add_argument("--repeats", type=int, default=5, help="--model-scale: timed rounds per d")
    args = parser.parse_args()
    start = time.time()
    if args.model_scale:
        dims = SCALE_DIMS + ((SCALE_BIG,) if args.with_1e8 else ())
        result = model_scale(dims, repeats=args.repeats)
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "model_scale.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        (RESULTS / "model_scale.md").write_text(scale_markdown(result), encoding="utf-8")
        print(scale_markdown(result))
    elif not args.train:
        rows = table()
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "results.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
        (RESULTS / "results.md").write_text(markdown(rows), encoding="utf-8")
        print(markdown(rows))
    else:
        runs = []
        for rounds in args.rounds:
            runs += train(
                rounds,
                args.jobs,
                args.methods,
                cross_silo=not args.no_cross_silo,
                c_from=args.c_from,
                run=not args.report_only,
            )
        previous = []
        path = RESULTS / "train.json"
        if path.exists():
            previous = [r for r in json.loads(path.read_text())["runs"] if r["rounds"] not in args.rounds]
        runs = previous + runs
        from flwr_dp_benchmarks._common import machine

        result = {
            "protocol": "bench_user_level (MNIST, 784-64-10 MLP, local 2 epochs, batch 20, lr 0.1)",
            "delta": DELTA,
            "c_grid": list(TRAIN_C_GRID),
            "machine": machine(),
            "created": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "best": best_rows(runs),
            "runs": runs,
        }
        path.write_text(json.dumps(result, indent=1, default=float) + "\n", encoding="utf-8")
        text = train_pivot(runs) + "\n" + train_markdown(runs)
        (RESULTS / "train.md").write_text(text, encoding="utf-8")
        print(text)
    print(f"({time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
