"""SignDS client encoding vs one ``np.argpartition`` pass; upload size vs the dense update."""

from __future__ import annotations

import numpy as np

from flwr_dp_strategies.signds import encode_update
from flwr_dp_strategies.signds.selection import topk_size

from ._common import row, time_pair

NAME = "signds_encode"
SIGN_K = 0.01


def run(*, dims: tuple[int, ...] = (10**5, 10**6, 10**7), repeats: int = 7, seed: int = 0) -> list[dict]:
    """Rows: encode time vs argpartition (target ≤ 2×), upload bytes vs float32 dense (target ≤ 0.25 %)."""
    rows = []
    for d in dims:
        update = np.random.default_rng(seed).standard_normal(d).astype(np.float32)
        k_top = topk_size(d, SIGN_K)
        uploads = []

        def encode(_state, update=update):
            uploads.append(
                encode_update(update, sign_k=SIGN_K, sign_eps=100, r_est=1e-5, is_reached=0, rng=seed + len(uploads))
            )

        def argpartition(_state, update=update, d=d, k_top=k_top):
            np.argpartition(update, d - k_top)

        reps = repeats if d < 10**7 else max(3, repeats // 2)
        sub, base = time_pair(encode, argpartition, repeats=reps)
        params = {"d": d, "sign_k": SIGN_K, "k_top": k_top, "sign_eps": 100, "dtype": "float32"}
        rows.append(
            row(
                NAME,
                f"encode d={d:.0e}",
                params,
                metric="time_s",
                values=sub,
                baseline="np.argpartition(update, d-k) (float32, same vector)",
                baseline_values=base,
                target="<= 2x",
                target_ratio=2.0,
            )
        )
        # Upload: int64 indices + 1 byte sign + 1 byte MagRR bit, against the float32 dense update.
        sizes = [8 * int(up.indices.size) + 2 for up in uploads]
        rows.append(
            row(
                NAME,
                f"upload bytes d={d:.0e}",
                dict(params, h=int(uploads[-1].indices.size)),
                metric="bytes",
                values=sizes,
                baseline="dense float32 update (4*d bytes)",
                baseline_values=[4 * d],
                target="<= 0.25 %",
                target_ratio=0.0025,
                notes="int64 indices + 1 B sign + 1 B bit",
            )
        )
    return rows
