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
  with sens = √k (unit-norm coefficients, b-min-separation; :mod:`flwr_dp_strategies.privacy.matrix_factorization`);
  prefix noise z times the row norms of :math:`AC^{-1}`.
* **Binary tree** with Honaker's least-squares decoder B = A C⁺: one ``GaussianDpEvent(z / sens)`` with sens the
  maximum over every b-min-separated pattern of at most k rounds of :math:`\sqrt{\sum_{i,j\in\pi}(C^\top C)_{ij}}`
  (brute force; T = 40 only: at T = 200 the patterns are too many); prefix noise z times the row norms of B.
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
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
from dp_accounting import LowerEndpointAndGuess, calibrate_dp_mechanism
from dp_accounting.dp_event import GaussianDpEvent, PoissonSampledDpEvent, SelfComposedDpEvent
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant

from flwr_dp_strategies.privacy import matrix_factorization as mf

NAME = "bandmf"
EPSILONS = (1.0, 2.0, 8.0)
ROUNDS = (40, 200)
CLIENTS, COHORT, BANDS, DELTA = 1000, 100, 10, 1e-5
AMPLIFIED_BANDS = (1, 2, 5, 10)
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


def rms_rows(matrix: np.ndarray) -> float:
    """RMS over rows of the row norms."""
    return float(math.sqrt(np.mean(np.sum(matrix * matrix, axis=1))))


def table(epsilons=EPSILONS, rounds=ROUNDS, amplified_bands=AMPLIFIED_BANDS, poisson: bool = True) -> list[dict]:
    """One row per (T, ε); ``amplified_bands=()`` / ``poisson=False`` leave out the (slow) amplified rows."""
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
                    best = (ratio, bands)
            if best is not None:
                row["amplified banded-sqrt (best b')"], row["amplified b'"] = best
            rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    skip = ("rounds", "k", "epsilon", "delta", "z_dp_fedavg")
    names = list(dict.fromkeys(n for r in rows for n in r if n not in skip))
    head = "| T | k | ε | z (DP-FedAvg) | " + " | ".join(names) + " |\n|" + "---|" * (4 + len(names)) + "\n"
    body = "".join(
        f"| {r['rounds']} | {r['k']} | {r['epsilon']:g} | {r['z_dp_fedavg']:.3f} | "
        + " | ".join(("–" if n not in r else f"{r[n]}" if isinstance(r[n], int) else f"{r[n]:.2f}") for n in names)
        + " |\n"
        for r in rows
    )
    return (
        "Prefix-sum noise (RMS over rounds) as a multiple of un-amplified DP-FedAvg's at the same (ε, δ = 1e-5); "
        f"N = {CLIENTS}, m = {COHORT}, b = {BANDS}.\n\n" + head + body
    )


def main() -> None:
    start = time.time()
    rows = table()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "results.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    (RESULTS / "results.md").write_text(markdown(rows), encoding="utf-8")
    print(markdown(rows))
    print(f"({time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
