"""DpSgdTrainer on CUDA and on CPU: milliseconds per local round (median), by per-sample-gradient mode.

    DEVICES=cuda,cpu python flwr_dp_benchmarks/bench_dpsgd_gpu.py   # writes $OUT/gpu_bench.json (default /tmp)

Models and data of ``bench_dpsgd`` (the DELM MLP 784-64-10 and the Opacus MNIST CNN on MNIST-shaped synthetic
data); one round = ⌈n/B⌉ Poisson-sampled steps of DP-SGD (z = 1.1, C = 1, lr 0.05), against plain SGD with the same
batch size and step count on the same device. One torch CPU thread. Run on the GPU machine (results in
``flwr_dp_benchmarks/results/dpsgd_gpu/``); not part of ``run.py`` (CI has no GPU).
"""

import statistics
import sys
import time
import warnings
import json
import os
import torch
from torch import nn

sys.path.insert(0, os.getcwd())
from flwr.app import RecordDict
from client_mods.dp_sgd_trainer import DpSgdTrainer
from flwr_dp_benchmarks.bench_dpsgd import make_model, synthetic_data

warnings.simplefilter("ignore")
torch.set_num_threads(1)
rows = []


def timed(fn, device, reps):
    fn()
    out = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def plain(model_fn, weights, data, batch, device, steps):
    model = model_fn().to(device)
    model.load_state_dict(weights)
    x, y = data[0].to(device), data[1].to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    crit = nn.CrossEntropyLoss()
    n = x.shape[0]
    for s in range(steps):
        idx = torch.randint(0, n, (batch,), device=device)
        opt.zero_grad()
        crit(model(x[idx]), y[idx]).backward()
        opt.step()


for device in os.environ.get("DEVICES", "cuda,cpu").split(","):
    for name, batch, n in [
        ("mlp", 16, 60),
        ("mlp", 64, 4096),
        ("mlp", 256, 4096),
        ("cnn", 64, 4096),
        ("cnn", 256, 4096),
    ]:
        data = synthetic_data(name, n)
        model_fn = lambda name=name: make_model(name)
        weights = {k: v.clone() for k, v in model_fn().state_dict().items()}
        steps = max(1, -(-n // batch))
        reps = 5 if n > 100 else 20
        base = timed(lambda: plain(model_fn, weights, data, batch, device, steps), device, reps)
        modes = ["fused", "hooks", "ghost"] if name == "mlp" else ["hooks", "ghost"]
        for mode in modes:
            try:
                trainer = DpSgdTrainer(
                    model_fn,
                    lr=0.05,
                    noise_multiplier=1.1,
                    max_grad_norm=1.0,
                    batch_size=batch,
                    grad_sample_mode=mode,
                    device=device,
                    seed=0,
                )
                t = timed(lambda: trainer.train_round(weights, data, RecordDict()), device, reps)
            except Exception as err:  # noqa
                print(f"{device} {name} B={batch} {mode}: {type(err).__name__}: {err}", flush=True)
                continue
            row = dict(
                device=device,
                model=name,
                batch=batch,
                examples=n,
                steps=steps,
                mode=mode,
                round_ms=1000 * t,
                plain_ms=1000 * base,
                ratio=t / base,
            )
            rows.append(row)
            print(
                f"{device:4s} {name} B={batch:3d} n={n:5d} {mode:5s}: {1000 * t:8.2f} ms/round, plain SGD "
                f"{1000 * base:8.2f} ms ({t / base:5.2f}x)",
                flush=True,
            )
json.dump(
    dict(gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, torch=torch.__version__, rows=rows),
    open(os.path.join(os.environ.get("OUT", "/tmp"), "gpu_bench.json"), "w"),
    indent=1,
)
