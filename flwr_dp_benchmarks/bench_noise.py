"""Noise mechanisms vs numpy's raw samplers on the same vector size."""

from __future__ import annotations

import numpy as np

from flwr_dp_strategies.privacy import gaussian_mechanism, laplace_mechanism

from ._common import row, time_pair

NAME = "noise"


def run(*, d: int = 10**6, repeats: int = 9, seed: int = 0) -> list[dict]:
    """Rows: laplace/gaussian mechanism vs Generator.laplace/normal (target ≤ 1.10×), and vs sampler + add."""
    x = np.random.default_rng(seed).standard_normal(d)  # float64, as the mechanisms return
    rows = []
    gens = {"sub": np.random.default_rng(seed + 1), "base": np.random.default_rng(seed + 2)}
    cases = [
        (
            "laplace_mechanism",
            lambda g: laplace_mechanism(x, epsilon=1.0, sensitivity=1.0, rng=g),
            "Generator.laplace",
            lambda g: g.laplace(0.0, 1.0, size=d),
        ),
        (
            "gaussian_mechanism",
            lambda g: gaussian_mechanism(x, noise_multiplier=1.0, sensitivity=1.0, rng=g),
            "Generator.normal",
            lambda g: g.normal(0.0, 1.0, size=d),
        ),
    ]
    for mech_name, mech, raw_name, raw in cases:
        sub, base = time_pair(
            lambda _s, mech=mech: mech(gens["sub"]), lambda _s, raw=raw: raw(gens["base"]), repeats=repeats
        )
        params = {"d": d, "dtype": "float64"}
        rows.append(
            row(
                NAME,
                f"{mech_name} d={d:.0e}",
                params,
                metric="time_s",
                values=sub,
                baseline=f"raw {raw_name}(size=d)",
                baseline_values=base,
                target="<= 1.10x",
                target_ratio=1.10,
            )
        )
        sub2, base2 = time_pair(
            lambda _s, mech=mech: mech(gens["sub"]), lambda _s, raw=raw: x + raw(gens["base"]), repeats=repeats
        )
        rows.append(
            row(
                NAME,
                f"{mech_name} d={d:.0e} (vs sampler+add)",
                params,
                metric="time_s",
                values=sub2,
                baseline=f"x + {raw_name}(size=d)",
                baseline_values=base2,
                target="<= 1.10x",
                target_ratio=1.10,
                notes="same work as the mechanism's output (noise added to x)",
            )
        )
    return rows
