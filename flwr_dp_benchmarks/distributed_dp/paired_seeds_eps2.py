"""Paired check at ε = 2: central vs ddp-20 over seeds (default 1..3; a seed changes init, sampling, local
training and noise).

    PYTHONPATH=. python flwr_dp_benchmarks/distributed_dp/paired_seeds_eps2.py /tmp/paired.json [SEED ...]
    (~1 min per seed)

The committed ``paired_seeds_eps2.json`` adds seed 0 (the main run's rows) and the paired differences.
"""

import json
import sys
from flwr_dp_benchmarks import bench_distributed_dp as b

cfg = {**b.CONFIG}
z = b.noise_multiplier_for(2.0, cfg, 50890)
out = []
for seed in [int(a) for a in sys.argv[2:]] or (1, 2, 3):
    for method in ("central", "ddp-20"):
        r = b.run_accuracy(method, 2.0, z, cfg, seed)
        out.append(
            {k: r[k] for k in ("method", "noise_multiplier", "accuracy", "accuracy_last5", "wall_s")} | {"seed": seed}
        )
        print(out[-1], flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
