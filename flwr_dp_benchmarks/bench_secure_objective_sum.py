"""DELM's server-side solve: per-client FM noise (NoisyObjectiveSum) vs the noise added once under SecAgg+.

    python flwr_dp_benchmarks/bench_secure_objective_sum.py            # ~3-5 min on 2 cores
    python flwr_dp_benchmarks/bench_secure_objective_sum.py --seeds 1 --epsilons 1

Setup: the DELM example's federation and features (``examples/delm/fm_ceiling.py``: MNIST
training split cut into 100 IID clients, HOG with 6 unsigned bins, q = 294, rows clipped to
unit norm; full test split), record-level ε at δ = 1e-5, ridge fraction 0.5. Columns:

* ``per-client noise``: every client releases its Gaussian FM objective at ε (replace-one,
  the trainer's only relation); the server sums the 100 releases and solves with the
  noise-adapted ridge: exactly ``NoisyObjectiveSum``'s computation (fm_ceiling's
  ``private_head``), without Flower.
* ``noise once (SecAgg), replace-one`` / ``add/remove``: ``SecureObjectiveSum``'s encoding
  path without the crypto: each client's exact coefficients (count included) scaled by s,
  randomly rounded, plus its Skellam share μ/m (m = 80 of the 100 clients, the strategy's
  default ``min_survivors=0.8``, all 100 surviving: noise variance 1.25 μ), summed mod 2^32,
  decoded and solved with the same helper (``solve_noisy_sum``). μ is calibrated so the
  Skellam event's RDP ε at δ is the target, under that relation; ``max_records`` = 60 000.
  SecAgg+'s masks cancel exactly, which ``tests/test_secure_objective_sum.py`` checks through the
  real protocol (revealed sum = the sum of these encodings); leaving the crypto out here changes
  no number.

Mean ± sd over ``--seeds`` (client split and noise).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples", "delm"))

import fm_ceiling  # noqa: E402  (the DELM example's data, features and per-client computation)
from flwr_dp_strategies.privacy.mechanisms.functional_mechanism import quadratic_statistics, solve_noisy_sum  # noqa: E402
from flwr_dp_strategies.privacy.mechanisms.secure_objective import (  # noqa: E402
    calibrate_secure_objective,
    decode_objective,
    encode_objective,
    sum_integer_objectives,
)

HERE = os.path.dirname(os.path.abspath(__file__))
MIN_SURVIVORS_FRACTION, BITS = 0.8, 32


def secure_head(
    train: np.ndarray, labels: np.ndarray, num_classes: int, epsilon: float, seed: int, relation: str
) -> tuple[np.ndarray, float]:
    """SecureObjectiveSum's computation without the masks: (head, the revealed sum's noise std)."""
    rng = np.random.default_rng(seed)
    shards = np.array_split(rng.permutation(len(labels)), fm_ceiling.NUM_CLIENTS)
    n = fm_ceiling.NUM_CLIENTS
    m = math.ceil(MIN_SURVIVORS_FRACTION * n)
    cal = calibrate_secure_objective(
        dim=train.shape[1],
        num_classes=num_classes,
        max_records=len(labels),
        n_clients=n,
        min_survivors=m,
        epsilon=epsilon,
        delta=fm_ceiling.DELTA,
        neighboring_relation=relation,
        bits=BITS,
    )
    encoded = (
        encode_objective(
            quadratic_statistics(train[s], labels[s], num_classes=num_classes),
            cal.params,
            local_noise_variance=cal.local_mu,
            rng=rng,
        )
        for s in shards
    )
    total = decode_objective(sum_integer_objectives(encoded, cal.params), cal.params)
    noise_std = math.sqrt(n * cal.local_mu) / cal.params.scale
    head, _ = solve_noisy_sum(total, ridge=0.0, noise_std=noise_std, ridge_fraction=fm_ceiling.RIDGE_FRACTION)
    return head, noise_std


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epsilons", default="0.5,1,2")
    parser.add_argument("--out", default=os.path.join(HERE, "secure_objective_sum", "results.md"))
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds must be an integer >= 1, got {args.seeds}")
    start = time.time()
    x_train, y_train, x_test, y_test = fm_ceiling.load_dataset("mnist")
    c = int(y_train.max()) + 1
    hog = fm_ceiling.FEATURE_MAPS["HOG, 6 unsigned bins"]
    train, test = hog(x_train, "mnist"), hog(x_test, "mnist")
    print(f"features q = {train.shape[1]} ({time.time() - start:.0f} s)", flush=True)

    def cell(values: list[float]) -> str:
        return f"{np.mean(values):.3f}" + (f" ± {np.std(values):.3f}" if len(values) > 1 else "")

    header = [
        "| ε | per-client noise (NoisyObjectiveSum), replace-one | noise once (SecAgg), replace-one "
        "| noise once (SecAgg), add/remove | noise std per coefficient: per-client sum / once, replace-one |",
        "|---|---|---|---|---|",
    ]
    rows = []
    for eps in (float(e) for e in args.epsilons.split(",")):
        local, once_rep, once_ar = [], [], []
        std_once = 0.0
        for seed in range(args.seeds):
            local.append(
                fm_ceiling.accuracy(fm_ceiling.private_head(train, y_train, c, eps, seed, False), test, y_test)
            )
            head, std_once = secure_head(train, y_train, c, eps, seed, "replace_one")
            once_rep.append(fm_ceiling.accuracy(head, test, y_test))
            once_ar.append(
                fm_ceiling.accuracy(secure_head(train, y_train, c, eps, seed, "add_or_remove_one")[0], test, y_test)
            )
        std_local = fm_ceiling.fm_noise_std(
            train.shape[1], c, epsilon=eps, noise="gaussian", delta=fm_ceiling.DELTA, neighboring_relation="replace_one"
        ) * math.sqrt(fm_ceiling.NUM_CLIENTS)
        rows.append(
            f"| {eps:g} | {cell(local)} | {cell(once_rep)} | {cell(once_ar)} | {std_local:.1f} / {std_once:.1f} |"
        )
        print(rows[-1], f"({time.time() - start:.0f} s)", flush=True)
    free = fm_ceiling.accuracy(
        fm_ceiling.solve_objective(quadratic_statistics(train, y_train, num_classes=c), ridge=0.0), test, y_test
    )
    text = [
        "# Per-client FM noise vs the noise added once under secure aggregation",
        "",
        f"Written by `python flwr_dp_benchmarks/bench_secure_objective_sum.py --seeds {args.seeds}` "
        f"in {time.time() - start:.0f} s (2 shared cores). MNIST, HOG 6 unsigned bins (q = {train.shape[1]}), "
        f"{fm_ceiling.NUM_CLIENTS} IID clients, δ = {fm_ceiling.DELTA}, test accuracy on the full test split, "
        f"mean ± sd over {args.seeds} seeds. Noise-free FM ceiling: {free:.3f}.",
        "",
        "\n\n".join((__doc__ or "").split("\n\n")[2:]).strip(),
        "",
        *header,
        *rows,
        "",
    ]
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as fh:
        fh.write("\n".join(text))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
