"""One ServerApp and one ClientApp serving every variant of ``bench_simulation`` and ``bench_scale``.

The ServerApp plays, in one ``flwr run`` (one Ray cluster, the same
SuperNodes, the same Grid), a warm-up FedAvg round and then *duels*: a fresh
Flower ``FedAvg`` and a fresh subject (one of our strategies, or FedAvg with one
of our client mods / trainers), ``rounds`` rounds each, alternated round by
round in ABBA order (FedAvg r1, X r1, X r2, FedAvg r2, FedAvg r3, ...). Each
round is driven by :class:`Run`, which is ``Strategy.start``'s loop (configure
train, ``send_and_receive``, aggregate train, configure evaluate,
``send_and_receive``, aggregate evaluate) one round at a time; none of our
strategies overrides ``start``. The settings come as JSON in the ``settings``
run config of the app folder ``sim_app/`` (or in the environment variable
:data:`ENV_VAR`); the measurements are written as JSON to ``settings["out"]``
after every duel.

What a round records:

* ``round_s``, ``train_s``, ``evaluate_s``: wall time of the round and of its
  two phases (split at ``configure_evaluate``), so Ray's start and the set-up of
  strategies are excluded;
* ``configure_train_s``, ``aggregate_train_s``, ``configure_evaluate_s``,
  ``aggregate_evaluate_s``: the server's own time in each strategy method;
* ``server_hwm``, ``tree_hwm``: peak resident memory during the round (Linux
  ``VmHWM``, reset just before it by writing 5 to ``/proc/<pid>/clear_refs``) of
  the ServerApp process (which also runs Flower's simulation engine and its
  in-memory message store), and the sum of the per-process peaks of that process
  and all its descendants (Ray's GCS, raylet and ClientApp actors). No sampling,
  no tracemalloc: nothing slows the run.

Client work is the same in every variant except where the mechanism itself
changes it: local SGD (``local-epochs`` epochs, minibatch 32, lr 0.2) of the
digits MLP 64-32-10 on the node's IID shard, one torch thread per client;
evaluation (one forward pass) on the node's shard of the test split (sklearn
digits: 1 347 train, 450 test images; with more nodes than images each node gets
one, wrapping around). The ``bench-client`` key of the config (set per variant)
selects what the client adds: a mod (``LocalUpdateNoiseMod``, ``signds_mod``,
``LaplaceInferenceMod``) or another trainer (Opacus DP-SGD, label DP, the
functional mechanism).
"""

from __future__ import annotations

import json
import math
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Optional

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Strategy

from client_mods import (
    FunctionalMechanismTrainer,
    LaplaceInferenceMod,
    LocalUpdateNoiseMod,
    declare_label_release,
    private_labels,
    signds_mod,
)
from flwr_dp_strategies import (
    AccountedAdaptiveClipping,
    AccountedFedAvg,
    AccountedPoissonFixedClipping,
    AccountedServerSideFixedClipping,
    ClusterEvaluation,
    MinDivergenceExpSampling,
    ShuffleAmplifiedFedAvg,
    SignDS,
)
from flwr_dp_experiments.baselines import make_mlp
from flwr_dp_experiments.datasets import load_digits_split
from flwr_dp_strategies.privacy.mechanisms.functional_mechanism import clip_rows
from flwr_dp_experiments.training import train_sgd

torch.set_num_threads(1)

ENV_VAR = "FLWR_DP_BENCH_SIM"
HIDDEN = 32
NUM_FEATURES, NUM_CLASSES = 64, 10
BASELINE = "FedAvg"
INFERENCE_KEY = "inference"

# ----------------------------------------------------------------------------- variants


def fedavg_args(n: int, **extra: Any) -> dict[str, Any]:
    """Every node trains and evaluates every round (as Flower's FedAvg baseline)."""
    return {
        "fraction_train": 1.0,
        "fraction_evaluate": 1.0,
        "min_train_nodes": n,
        "min_evaluate_nodes": n,
        "min_available_nodes": n,
        **extra,
    }


@dataclass(frozen=True)
class Variant:
    """A session kind: the server's strategy, what the clients add, and the model trained."""

    build: Callable[[int], Strategy]
    client: str = "plain"
    model: str = "mlp"
    kind: str = "strategy"
    what: str = ""


VARIANTS: dict[str, Variant] = {
    BASELINE: Variant(lambda n: FedAvg(**fedavg_args(n)), kind="baseline", what="Flower's FedAvg, plain clients"),
    "FedAvg (control)": Variant(
        lambda n: FedAvg(**fedavg_args(n)),
        kind="control",
        what="a second Flower FedAvg timed as a subject: the noise floor of the ratios",
    ),
    "AccountedFedAvg": Variant(
        lambda n: AccountedFedAvg(**fedavg_args(n)), what="AccountedFedAvg (screening + ledger), plain clients"
    ),
    "AccountedServerSideFixedClipping": Variant(
        lambda n: AccountedServerSideFixedClipping(
            FedAvg(**fedavg_args(n, weighted_by_key="unit-weight")), 1.0, 1.0, n
        ),
        what="z = 1, C = 1, all n clients per round, plain clients",
    ),
    "AccountedPoissonFixedClipping": Variant(
        lambda n: AccountedPoissonFixedClipping(
            FedAvg(**fedavg_args(n, weighted_by_key="unit-weight")), 1.0, 1.0, n, num_clients=n
        ),
        what="z = 1, C = 1, q = m/N = 1 (every node sampled, so the round does the same client work)",
    ),
    "AccountedAdaptiveClipping": Variant(
        lambda n: AccountedAdaptiveClipping(
            FedAvg(**fedavg_args(n, weighted_by_key="unit-weight")),
            1.0,
            n,
            clipped_count_stddev=max(n / 20.0, 1.0),
            num_clients=n,
        ),
        what="z = 1 (model and count), C0 = 0.1, target quantile 0.5, q = m/N = 1 (every node sampled, so the "
        "round does the same client work)",
    ),
    "ShuffleAmplifiedFedAvg": Variant(
        lambda n: ShuffleAmplifiedFedAvg(**fedavg_args(n)), what="layer-wise shuffle of the updates, plain clients"
    ),
    "MinDivergenceExpSampling": Variant(
        lambda n: MinDivergenceExpSampling(num_selected=max(1, n // 2), epsilon=1.0, **fedavg_args(n)),
        what="k = n/2 replies per layer by the exponential mechanism (epsilon = 1), plain clients",
    ),
    "SignDS + signds_mod": Variant(
        lambda n: SignDS(sign_k=0.01, sign_eps=100.0, **fedavg_args(n)),
        client="signds",
        what="SignDS server, signds_mod on the clients' train (k = 1 %, sign_eps = 100)",
    ),
    "ClusterEvaluation + LaplaceInferenceMod": Variant(
        lambda n: ClusterEvaluation(FedAvg(**fedavg_args(n)), cluster_client_num=1000),
        client="laplace",
        what="clients upload their mean softmax with LaplaceInferenceMod (server's epsilon); "
        "the server scores up to 1000 points (silhouette, CH, DB)",
    ),
    # Diagnostics of the Laplace cluster evaluation's cost (bench_scale.run(diagnostics=True)):
    "FedAvg + inference upload": Variant(
        lambda n: FedAvg(**fedavg_args(n)),
        client="upload",
        kind="diagnostic",
        what="Flower's FedAvg; clients add their mean softmax to the evaluate reply, un-noised (Flower's cost "
        "of carrying the extra record)",
    ),
    "ClusterEvaluation (NOT_ENCRYPT)": Variant(
        lambda n: ClusterEvaluation(FedAvg(**fedavg_args(n)), privacy_eval_type="NOT_ENCRYPT", cluster_client_num=1000),
        client="laplace",
        kind="diagnostic",
        what="ClusterEvaluation scoring un-noised results (LaplaceInferenceMod passes them through, declares "
        "nothing; the server books them as non-private)",
    ),
    "LocalUpdateNoiseMod": Variant(
        lambda n: FedAvg(**fedavg_args(n)),
        client="local-noise",
        kind="mod",
        what="C = 1, z = 0.05 on every train reply; server: Flower's FedAvg",
    ),
    "DpSgdTrainer (Opacus)": Variant(
        lambda n: FedAvg(**fedavg_args(n)),
        client="dp-sgd",
        kind="mod",
        what="DP-SGD (z = 1, C = 1, Poisson batches of 32 from Opacus' sampler, Opacus' accountant, same "
        "epochs/lr) instead of plain SGD; grad_sample_mode='auto', which picks the fused Linear step for this "
        "MLP (client_mods.dp_sgd_fused); server: Flower's FedAvg",
    ),
    "DpSgdTrainer (Opacus hooks)": Variant(
        lambda n: FedAvg(**fedavg_args(n)),
        client="dp-sgd-hooks",
        kind="diagnostic",
        what="as DpSgdTrainer (Opacus) with grad_sample_mode='hooks': Opacus' GradSampleModule and DPOptimizer "
        "for every step, as before the fused step (the same mechanism and events)",
    ),
    "DpSgdTrainer (Opacus, wrapped anew)": Variant(
        lambda n: FedAvg(**fedavg_args(n)),
        client="dp-sgd-anew",
        kind="diagnostic",
        what="as DpSgdTrainer (Opacus) with keep_wrapped=False: the client's model and its DP-SGD step are built "
        "anew for every message",
    ),
    "DpSgdTrainer (Opacus, as before 27.4)": Variant(
        lambda n: FedAvg(**fedavg_args(n)),
        client="dp-sgd-before",
        kind="diagnostic",
        what="as DpSgdTrainer (Opacus) the way it ran before issue 27.4's tuning: a trainer built per message, "
        "ghost clipping, the shard read per example by Opacus' DPDataLoader (the same mechanism and events)",
    ),
    "LabelDp": Variant(
        lambda n: FedAvg(**fedavg_args(n)),
        client="label-dp",
        kind="mod",
        what="labels randomised once per node (epsilon = 2, k = 10, kept in context.state) and "
        "declared once; server: Flower's FedAvg",
    ),
    "FunctionalMechanismTrainer": Variant(
        lambda n: FedAvg(**fedavg_args(n)),
        client="fm",
        model="head",
        kind="mod",
        what="noisy Taylor objective released once per node, 5 descent steps of "
        "a 64x10 softmax head per round (instead of the MLP's SGD); "
        "server: Flower's FedAvg",
    ),
}


def initial_arrays(model: str) -> ArrayRecord:
    """The global model a session starts from (same seed every session)."""
    if model == "head":
        return ArrayRecord({"head.weight": Array(np.zeros((NUM_FEATURES, NUM_CLASSES), np.float32))})
    return ArrayRecord(make_mlp(NUM_FEATURES, HIDDEN, NUM_CLASSES, seed=0).state_dict())


def client_config(variant: Variant, local_epochs: int) -> ConfigRecord:
    """What every train/evaluate message carries (the ClientApp has no run config)."""
    return ConfigRecord(
        {"bench-client": variant.client, "local-epochs": int(local_epochs), "lr": 0.2, "batch-size": 32, "seed": 42}
    )


# ----------------------------------------------------------------------------- ClientApp


@lru_cache(maxsize=8)
def _shard_indices(num_partitions: int, split: str) -> tuple[np.ndarray, ...]:
    """IID shards of a seeded permutation of the split (contiguous cuts, as flwr-datasets' IidPartitioner).

    With more nodes than examples (1 000 nodes, 450 test images) every node gets one
    example, wrapping around the permutation (shards then overlap).
    """
    _, y_tr, _, y_te = load_digits_split()
    size = len(y_tr) if split == "train" else len(y_te)
    order = np.random.default_rng(42).permutation(size)
    if num_partitions <= size:
        return tuple(np.array_split(order, num_partitions))
    return tuple(order[[p % size]] for p in range(num_partitions))


def _shard(context: Context, split: str) -> tuple[np.ndarray, np.ndarray]:
    """This node's IID shard of the digits train or test split."""
    pid, parts = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    x_tr, y_tr, x_te, y_te = load_digits_split()
    x, y = (x_tr, y_tr) if split == "train" else (x_te, y_te)
    idx = _shard_indices(parts, split)[pid]
    return x[idx], y[idx]


def _mlp() -> torch.nn.Sequential:
    """The layout of :func:`make_mlp` (same state_dict keys) without its seeded init: the weights are
    overwritten by the received ones anyway, and ``torch.manual_seed`` costs ~1 ms a call."""
    return torch.nn.Sequential(
        torch.nn.Linear(NUM_FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, NUM_CLASSES)
    )


def _config(msg: Message) -> ConfigRecord:
    return next(iter(msg.content.config_records.values()), ConfigRecord())


_LOCAL_NOISE = LocalUpdateNoiseMod(1.0, 0.05)
_LAPLACE = LaplaceInferenceMod()


def _train_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """The variant's train-side mod (one config lookup for every variant, the baseline included)."""
    kind = _config(msg).get("bench-client", "plain")
    if kind == "local-noise":
        return _LOCAL_NOISE(msg, context, call_next)
    if kind == "signds":
        return signds_mod(msg, context, call_next)
    return call_next(msg, context)


def _evaluate_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """LaplaceInferenceMod when the server asks for a protected inference result (ClusterEvaluation)."""
    if "privacy-eval-type" in _config(msg):
        return _LAPLACE(msg, context, call_next)
    return call_next(msg, context)


def _dp_sgd_trainer(config: ConfigRecord, context: Context, **extra: Any):
    """The trainer a ClientApp builds once at import and reuses (cached per setting: the config is per run).
    Its public sample_rate is B over the shard size the public partitioning gives this node (q = 1/⌈N/B⌉'s
    counterpart that no record decides)."""
    pid, parts = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    size = len(_shard_indices(parts, "train")[pid])
    rate = min(1.0, 1.0 / math.ceil(size / int(config["batch-size"])))
    return _dp_sgd_trainer_for(
        float(config["lr"]), int(config["batch-size"]), int(config["local-epochs"]), rate, **extra
    )


@lru_cache(maxsize=8)
def _dp_sgd_trainer_for(lr: float, batch_size: int, local_epochs: int, sample_rate: float, **extra: Any):
    from client_mods.dp_sgd import DpSgdTrainer

    return DpSgdTrainer(
        _mlp,
        lr=lr,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        batch_size=batch_size,
        local_epochs=local_epochs,
        sample_rate=sample_rate,
        **extra,
    )


class _PerExample(torch.utils.data.Dataset):
    """A shard read one example at a time (what a torch Dataset that is not a TensorDataset gets)."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


_FM = FunctionalMechanismTrainer(1.0, num_classes=NUM_CLASSES, local_steps=5, learning_rate=1.0)

app = ClientApp()


@app.train(mods=[_train_mod])
def train(msg: Message, context: Context) -> Message:
    """Local training of the variant (plain SGD unless the variant replaces the trainer)."""
    torch.set_num_threads(1)
    config = _config(msg)
    kind = str(config.get("bench-client", "plain"))
    x, y = _shard(context, "train")
    if kind in ("dp-sgd", "dp-sgd-anew", "dp-sgd-hooks"):
        from client_mods.dp_sgd import dp_sgd_train_reply

        trainer = (
            _dp_sgd_trainer(config, context, grad_sample_mode="hooks")
            if kind == "dp-sgd-hooks"
            else _dp_sgd_trainer(config, context)
        )
        return dp_sgd_train_reply(msg, context, trainer, (x, y), keep_wrapped=kind != "dp-sgd-anew")
    if kind == "dp-sgd-before":
        from client_mods.dp_sgd import DpSgdTrainer, dp_sgd_train_reply

        trainer = DpSgdTrainer(
            _mlp,
            lr=float(config["lr"]),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            batch_size=int(config["batch-size"]),
            local_epochs=int(config["local-epochs"]),
            grad_sample_mode="ghost",
        )
        return dp_sgd_train_reply(msg, context, trainer, _PerExample(x, y))
    if kind == "fm":
        return _FM.train(msg, context, x, y)
    if kind == "label-dp":
        y, _ = private_labels(context, y, eps=2.0, num_classes=NUM_CLASSES)
    model = _mlp()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    seed = int(config["seed"]) + 1000 * int(config.get("server-round", 0)) + int(context.node_config["partition-id"])
    loss = train_sgd(
        model,
        x,
        y,
        epochs=int(config["local-epochs"]),
        lr=float(config["lr"]),
        batch_size=int(config["batch-size"]),
        seed=seed,
    )
    metrics = MetricRecord({"train-loss": loss, "num-examples": len(y), "unit-weight": 1.0})
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    if kind == "label-dp":
        declare_label_release(context, content)
    return Message(content=content, reply_to=msg)


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


@app.evaluate(mods=[_evaluate_mod])
def evaluate(msg: Message, context: Context) -> Message:
    """Local evaluation; with ClusterEvaluation also the mean softmax vector (``"inference"``)."""
    torch.set_num_threads(1)
    config = _config(msg)
    x, y = _shard(context, "test")
    arrays = msg.content["arrays"]
    if "head.weight" in arrays:
        logits = clip_rows(x) @ arrays["head.weight"].numpy().astype(np.float64)
    else:
        model = _mlp()
        model.load_state_dict(arrays.to_torch_state_dict())
        with torch.no_grad():
            logits = model(torch.from_numpy(x)).double().numpy()
    probs = _softmax(logits)  # one forward pass: loss, accuracy and the inference result all come from it
    loss = float(-np.mean(np.log(probs[np.arange(len(y)), y] + 1e-12)))
    accuracy = float((logits.argmax(axis=1) == y).mean())
    content = RecordDict(
        {"metrics": MetricRecord({"eval-loss": loss, "eval-acc": accuracy, "num-examples": len(y), "unit-weight": 1.0})}
    )
    if "privacy-eval-type" in config or config.get("bench-client") == "upload":
        mean = probs.mean(axis=0)
        content[INFERENCE_KEY] = ArrayRecord({"mean-softmax": Array(mean / mean.sum())})
    return Message(content=content, reply_to=msg)


# ----------------------------------------------------------------------------- memory (Linux /proc)


def _descendants(root: int) -> list[int]:
    """PIDs of every descendant of ``root`` (from /proc/<pid>/stat)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _status_bytes(pid: int, field: str) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def reset_peaks(pids: list[int]) -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where some process refused."""
    ok = True
    for pid in pids:
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as handle:
                handle.write("5")
        except OSError:
            ok = False
    return ok


class MemoryProbe:
    """Peak RSS of this process and of its whole process tree between :meth:`start` and :meth:`stop`."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.reset_ok = False

    def start(self) -> dict[str, Any]:
        tree = [self.pid, *_descendants(self.pid)]
        self.reset_ok = reset_peaks(tree)
        return {
            "server_rss": _status_bytes(self.pid, "VmRSS") or 0,
            "tree_rss": sum(_status_bytes(p, "VmRSS") or 0 for p in tree),
        }

    def stop(self) -> dict[str, Any]:
        tree = [self.pid, *_descendants(self.pid)]
        return {
            "server_hwm": _status_bytes(self.pid, "VmHWM") or 0,
            "tree_hwm": sum(_status_bytes(p, "VmHWM") or 0 for p in tree),
            "tree_processes": len(tree),
            "hwm_reset": self.reset_ok,
        }


# ----------------------------------------------------------------------------- ServerApp

ROUND_TIMEOUT = 3600.0
PHASES = ("configure_train_s", "aggregate_train_s", "configure_evaluate_s", "aggregate_evaluate_s")


class Run:
    """One strategy's run, driven round by round exactly as ``Strategy.start`` does (its loop, without logs).

    ``Strategy.start`` runs all its rounds in one call; driving the same loop one round at
    a time lets the ServerApp alternate two strategies round by round on the same Grid.
    None of our strategies overrides ``start``.
    """

    def __init__(self, name: str, n: int, local_epochs: int) -> None:
        variant = VARIANTS[name]
        self.name = name
        self.strategy = variant.build(n)
        self.arrays = initial_arrays(variant.model)
        self.train_config = client_config(variant, local_epochs)
        self.evaluate_config = client_config(variant, local_epochs)
        self.server_round = 0

    def play(self, grid: Grid) -> dict[str, float]:
        """The next round (train, then evaluate); its wall time, phases and server-side method times."""
        self.server_round += 1
        r, strategy = self.server_round, self.strategy
        times: dict[str, float] = {}
        t_start = time.perf_counter()
        messages = list(strategy.configure_train(r, self.arrays, self.train_config, grid))
        times["configure_train_s"] = time.perf_counter() - t_start
        replies = grid.send_and_receive(messages=messages, timeout=ROUND_TIMEOUT)
        t0 = time.perf_counter()
        arrays, _ = strategy.aggregate_train(r, replies)
        times["aggregate_train_s"] = time.perf_counter() - t0
        if arrays is not None:
            self.arrays = arrays
        t_eval = time.perf_counter()
        messages = list(strategy.configure_evaluate(r, self.arrays, self.evaluate_config, grid))
        times["configure_evaluate_s"] = time.perf_counter() - t_eval
        replies = grid.send_and_receive(messages=messages, timeout=ROUND_TIMEOUT)
        t0 = time.perf_counter()
        strategy.aggregate_evaluate(r, replies)
        t_end = time.perf_counter()
        times["aggregate_evaluate_s"] = t_end - t0
        times.update(round_s=t_end - t_start, train_s=t_eval - t_start, evaluate_s=t_end - t_eval)
        return times


def duel(grid: Grid, subject: str, rounds: int, n: int, local_epochs: int, memory: MemoryProbe) -> dict[str, Any]:
    """Flower's FedAvg and ``subject``, ``rounds`` rounds each, alternating round by round (ABBA order)."""
    record: dict[str, Any] = {"subject": subject, "rounds": []}
    try:
        runs = {"baseline": Run(BASELINE, n, local_epochs), "subject": Run(subject, n, local_epochs)}
        for r in range(1, rounds + 1):
            for who in ("baseline", "subject") if r % 2 else ("subject", "baseline"):
                memory.start()
                times = runs[who].play(grid)
                record["rounds"].append({"who": who, "round": r, **times, **memory.stop()})
    except Exception as exc:  # noqa: BLE001 - a failed variant is reported, the others still run
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc()
    return record


def load_settings(context: Optional[Context] = None) -> dict[str, Any]:
    """The ``settings`` run config (JSON), else the JSON in :data:`ENV_VAR`."""
    text = str(context.run_config.get("settings", "")) if context is not None else ""
    settings = json.loads(text or os.environ.get(ENV_VAR, "") or "{}")
    for key in ("clients", "segments", "out"):
        if key not in settings:
            raise KeyError(f"{ENV_VAR} lacks {key!r}")
    return settings


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    """A warm-up FedAvg round, then every segment's duels on this Grid; the records go to ``settings["out"]``."""
    started = time.time()
    settings = load_settings(context)
    n, local_epochs = int(settings["clients"]), int(settings.get("local_epochs", 3))
    memory = MemoryProbe()
    if settings.get("pull_interval") and hasattr(grid, "pull_interval"):
        grid.pull_interval = float(settings["pull_interval"])  # InMemoryGrid's reply polling (Flower: 0.1 s)
    t0 = time.perf_counter()
    Run(BASELINE, n, local_epochs).play(grid)  # Ray starts the ClientApp actors; they import the apps
    warmup = time.perf_counter() - t0
    segments: dict[str, list[dict[str, Any]]] = {}
    for segment in settings["segments"]:
        duels = segments.setdefault(segment["name"], [])
        for entry in segment["duels"]:
            duels.append(duel(grid, entry["subject"], int(entry["rounds"]), n, local_epochs, memory))
            with open(settings["out"], "w") as handle:  # rewritten after every duel: partial results survive
                json.dump(
                    {"settings": settings, "segments": segments, "main_started": started, "warmup_s": warmup}, handle
                )


# ----------------------------------------------------------------------------- driver


def cpus() -> int:
    """CPUs this process may use (Ray gets them all; one per simulated client at a time)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


#: Results of segments run on behalf of another benchmark (``run_segments(..., keep=...)``), by key.
SHARED: dict[tuple, dict[str, Any]] = {}


def run_segments(
    clients: int,
    segments: list[tuple[str, list[tuple[str, int]]]],
    *,
    local_epochs: int = 3,
    pull_interval: Optional[float] = None,
    ray_cpus: Optional[int] = None,
    quiet: bool = True,
) -> dict[str, dict[str, Any]]:
    """Run the segments ``(name, [(subject, rounds), ...])`` in ONE ``flwr run`` (app folder ``sim_app/``).

    ``clients`` SuperNodes; Ray gets ``ray_cpus`` CPUs (default: every CPU of this
    process), one CPU per ClientApp actor. ``pull_interval``: how often the
    ServerApp's Grid polls for replies (None: Flower's 0.1 s, which quantises
    each phase to 0.1 s steps). Flower's log goes to a temporary file with
    ``quiet``, to stdout too without. Returns, per segment name, ``{"duels":
    [...], "wall_s": the run's wall time (SuperLink start to results),
    "warmup_s": the warm-up round, "shared_run": ...}``.
    """
    import tempfile

    from flwr_dp_experiments.simulation import run_app

    unknown = [name for _, duels in segments for name, _ in duels if name not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    app_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sim_app")
    with tempfile.TemporaryDirectory(prefix="bench-sim-") as folder:
        path = os.path.join(folder, "duels.json")
        settings = json.dumps(
            {
                "clients": int(clients),
                "local_epochs": int(local_epochs),
                "out": path,
                "pull_interval": pull_interval,
                "segments": [
                    {"name": name, "duels": [{"subject": subject, "rounds": int(rounds)} for subject, rounds in duels]}
                    for name, duels in segments
                ],
            }
        )
        t0 = time.perf_counter()
        result = run_app(
            app_dir,
            {"settings": settings},
            num_supernodes=int(clients),
            results_path=path,
            log_file=os.path.join(folder, "flower.log"),
            verbose=not quiet,
            federation_config={"init-args-num-cpus": int(ray_cpus or cpus())},
        )
        wall = time.perf_counter() - t0
    return {
        name: {
            "duels": result["segments"].get(name, []),
            "wall_s": wall,
            "warmup_s": result.get("warmup_s"),
            "shared_run": len(segments) > 1,
        }
        for name, _ in segments
    }


def failures(duels: list[dict[str, Any]]) -> dict[str, str]:
    """subject -> error of the duels that failed."""
    return {d["subject"]: d["error"] for d in duels if d.get("error")}


def pick(duels: list[dict[str, Any]], subject: str, who: str, key: str, first_round: int = 1) -> list[float]:
    """``key`` of the ``who`` ("subject"/"baseline") rounds >= ``first_round`` of ``subject``'s completed duels."""
    return [
        float(r[key])
        for d in duels
        if d["subject"] == subject and not d.get("error")
        for r in d["rounds"]
        if r["who"] == who and r["round"] >= first_round and key in r
    ]


def breakdown(duels: list[dict[str, Any]], subject: str, first_round: int = 1) -> str:
    """Where a difference comes from: medians of the phases and of the server's own time in the strategy methods."""

    def med(who: str, key: str) -> float:
        return median(pick(duels, subject, who, key, first_round))

    def ms(value: float) -> str:
        return f"{value * 1e3:.0f} ms" if np.isfinite(value) else "n/a"

    text = "; ".join(
        f"{label} {ms(med('subject', key))} vs {ms(med('baseline', key))}"
        for key, label in (("train_s", "train phase"), ("evaluate_s", "evaluate phase"))
    )
    methods = [
        f"{key[:-2]} {ms(med('subject', key))} vs {ms(med('baseline', key))}"
        for key in PHASES
        if med("subject", key) - med("baseline", key) > 0.002
    ]
    return text + ("; server " + ", ".join(methods) if methods else "")


def median(values: list[float]) -> float:
    return float(np.median(values)) if values else float("nan")


__all__ = [
    "BASELINE",
    "ENV_VAR",
    "SHARED",
    "VARIANTS",
    "MemoryProbe",
    "Run",
    "app",
    "breakdown",
    "cpus",
    "duel",
    "failures",
    "median",
    "pick",
    "run_segments",
    "server",
]
