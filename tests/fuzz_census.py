"""Census of the malicious-reply corpus of ``test_reply_fuzz.py``: every strategy × phase × mutation ×
value × identity, counted as aborted rounds, non-finite models, NaN metrics and bad replies aggregated.

Run from the repository root: ``python tests/fuzz_census.py`` (a few minutes). Every strategy of
``strategy_registry.REGISTRY`` (every exported one) is covered; the figures are printed per strategy
too. Used for the before/after figures of issues 17 and 25; the test suite runs the hypothesis-driven
sample of the same corpus.
"""

from __future__ import annotations

import collections
import logging
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    import test_reply_fuzz as fuzz

    logging.disable(logging.CRITICAL)
    values = [math.nan, math.inf, -math.inf, 1e308, -1e308, 3.4e38, 1e39, -5.0, 0.0, 1e-300, 7.0]
    uses_value = {
        "fill-array",
        "weight",
        "metric-value",
        "declaration-bad-param",
        "signds-sign",
        "signds-bhat",
        "inference-value",
    }
    counts: collections.Counter = collections.Counter()
    for name in fuzz.STRATEGIES:
        for phase in ("train", "evaluate"):
            for mutation in fuzz.MUTATIONS:
                for value in values if mutation in uses_value else [None]:
                    for identity in fuzz.IDENTITIES:
                        counts["cases"] += 1
                        try:
                            result, strategy, _ = fuzz._run(name, phase, (mutation, value, identity))
                        except Exception:  # noqa: BLE001 - counting what aborts
                            counts["aborted"] += 1
                            counts[f"aborted {name} {phase}"] += 1
                            continue
                        metrics = result[1] if phase == "train" else result
                        if phase == "train" and (
                            result[0] is None or not all(np.isfinite(a).all() for a in result[0].to_numpy_ndarrays())
                        ):
                            counts["non-finite or no model"] += 1
                        if any(isinstance(v, float) and math.isnan(v) for v in (metrics or {}).values()):
                            counts["NaN metric"] += 1
                        if fuzz._rejected(strategy, metrics, phase) == 0:
                            counts["bad reply aggregated"] += 1
    print(f"strategies: {len(fuzz.STRATEGIES)} ({', '.join(fuzz.STRATEGIES)})")
    for key, count in sorted(counts.items()):
        print(f"{key}: {count}")


if __name__ == "__main__":
    main()
