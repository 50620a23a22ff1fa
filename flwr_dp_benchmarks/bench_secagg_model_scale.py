"""Secure aggregation at model scale: a distributed-DP client's upload and the server's unmask at d = 1e6, 1e7.

    python flwr_dp_benchmarks/bench_secagg_model_scale.py [--quick | --tiny] [--out flwr_dp_benchmarks/distributed_dp]

(also ``python flwr_dp_benchmarks/run.py --only secagg_model_scale``, which writes the suite's files instead).

Issue 40 item 2. ``bench_distributed_dp.py --secagg-scale`` runs whole SecAgg+ rounds at d = 50 890; nothing
above d ~ 1e5 had been measured. Here every stage of one client's upload (what ``client_mods.distributed_dp_mod``
runs at the collect stage) is timed on a float32 update of d parameters, calling the library's functions in
the order ``encode_update`` / ``ClientRound.collect`` / ``answer_message`` call them:

* ``clip``: ``l2_clip`` (the update's norm is 10x the clip norm: it is clipped);
* ``rotation``: ``random_rotation`` (random signs, then the orthonormal DCT-II; Walsh-Hadamard at powers of two);
* ``round``: scaling and ``conditional_randomized_round`` (to the rounding bound Δ̃₂);
* ``noise``: the client's Skellam share Sk(μ/m) added to k in place, 64 K values at a time (what
  ``client_integer_vector`` calls);
* ``wrap``: ``to_modular`` (mod 2^b, uint64);
* ``masks``: the copy ``ClientRound.collect`` makes, its own seed's mask and k = 24 pairwise masks
  (``add_prg_mask``: ChaCha20 keystream streamed in 64 KiB chunks, added in place), ``reduce_mod``;
* ``pack``: ``pack_bits`` to b bits (the reply's payload);
* ``encode_update (all)``: the library's ``encode_update`` in one call (clip to wrap; it clips, rotates and wraps
  its own arrays in place, where the public ``l2_clip``, ``random_rotation`` and ``to_modular`` timed as stages
  return new arrays and leave their input alone), and
  ``upload (all)``: ``encode_update`` + masks + pack, the whole collect-stage work minus key agreement and
  Shamir (d-independent; ``--secagg-scale`` times them).

The 24 pairwise keys come from the real key agreement (``mask_keys``: ECDH on SECP384R1 + HKDF), untimed.
Parameters: b = 20 (``DistributedDpFedAvg``'s default), C = 1, z = 1, m = 100 clients, the scale from
``scale_for_bits`` (:func:`.bench_distributed_dp._ddp_parameters`).

Server (n = 100 clients): the collect replies' masked vectors screened and unpacked (``masked_vector``) and
added (``add_vector``) on a real ``SecureAggregationRound``, then the unmask's arithmetic: 100 self masks
removed (``add_prg_mask``, no dropouts so no pairwise mask is rebuilt; Shamir and signatures are
d-independent, see ``--secagg-scale``), ``reduce_mod`` and ``decode_sum`` / n (what ``aggregate_train``
releases). Masked vectors are uniform random b-bit values (what a masked vector is), made one client at a
time outside the timed section. Baseline at d = 1e6: Flower's ``FedAvg.aggregate_train`` of 100 dense
float32 reply ``Message``s (helpers of :mod:`.bench_model_scale`); at every d a numpy floor (100 float32
vectors added into a float64 accumulator).

Time: CPU seconds (``time.process_time``, this process, every thread) and wall seconds, median of the
repeats. Memory: the peak of traced allocations (``tracemalloc``: numpy's buffers and Python's bytes) during
one call, above what was live before it (the stage's input is not counted), in model copies (4·d bytes),
measured in a separate untimed call. Targets (issue 40): the client's upload ≤ 2 s of CPU and ≤ 3 model copies
at d = 1e7; upload bytes against dense float32 (4·d) reported.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "flwr_dp_benchmarks"

from flwr_dp_strategies.privacy.mechanisms.distributed_dp import (  # noqa: E402
    _add_skellam_share,
    conditional_randomized_round,
    decode_sum,
    encode_update,
    l2_clip,
    random_rotation,
    to_modular,
)
from flwr_dp_strategies.secure_aggregation.client_protocol import mask_keys  # noqa: E402
from flwr_dp_strategies.secure_aggregation.masks import (  # noqa: E402
    add_prg_mask,
    pack_bits,
    packed_size,
    pairwise_sign,
    reduce_mod,
)
from flwr_dp_strategies.secure_aggregation.protocol import (  # noqa: E402
    MASKED_KEY,
    MASKED_RECORD,
    RECORD,
    STAGE_KEY,
    Stage,
    min_threshold,
    neighbourhood_size,
)
from flwr_dp_strategies.secure_aggregation.server_protocol import SecureAggregationRound  # noqa: E402

from ._common import machine, peak_bytes, row  # noqa: E402

NAME = "secagg_model_scale"
BITS = 20
CLIP = 1.0
Z = 1.0
NEIGHBOURS = 24
SERVER_CLIENTS = 100
TARGET_CPU_S = 2.0
TARGET_COPIES = 3.0
DEFAULT_OUT = Path(__file__).resolve().parent / "distributed_dp"
MODES = {
    "full": {"dims": (10**6, 10**7), "server_dims": (10**6, 10**7), "repeats": 3},
    "quick": {"dims": (10**6,), "server_dims": (10**6,), "repeats": 3},
    "tiny": {"dims": (2000,), "server_dims": (2000,), "repeats": 1, "clients": 3, "neighbours": 2},
}
HAND_WRITTEN = "### Hand-written"  # a section of the markdown from this heading on survives a rerun
CLIENT_STAGES = ("clip", "rotation", "round", "noise", "wrap", "masks", "pack")


def _params(d: int, clients: int) -> tuple[Any, Any]:
    from .bench_distributed_dp import _ddp_parameters

    return _ddp_parameters(BITS, Z, {"clients_per_round": clients, "clip": CLIP}, d)


def _measure(fn: Callable[[], Any], repeats: int) -> tuple[float, float, int, Any]:
    """(median CPU s, median wall s, peak traced bytes, the last result) of ``fn()``; the peak from one extra call."""
    cpu, wall, out = [], [], None
    for _ in range(repeats):
        out = None
        c0, w0 = time.process_time(), time.perf_counter()
        out = fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    del out
    holder: list[Any] = []
    peak = peak_bytes(lambda: holder.append(fn()))
    return statistics.median(cpu), statistics.median(wall), peak, holder[0]


def _keys(count: int, seed: int) -> tuple[bytes, list[tuple[bytes, int]]]:
    """This client's own mask seed and ``count`` (pairwise key, sign) from the real key agreement."""
    from flwr.supercore.primitives.asymmetric import generate_key_pairs, private_key_to_bytes, public_key_to_bytes

    own_sk, _ = generate_key_pairs()
    peers = [public_key_to_bytes(generate_key_pairs()[1]) for _ in range(count)]
    keys = mask_keys(private_key_to_bytes(own_sk), peers)
    node = count // 2  # half the neighbours below this node's id (mask added), half above (subtracted)
    others = [i for i in range(count + 1) if i != node]
    rng = np.random.default_rng(seed)
    return rng.bytes(32), [(key, pairwise_sign(node, other)) for key, other in zip(keys, others)]


def _masked(encoded: np.ndarray, own: bytes, pairs: list[tuple[bytes, int]]) -> np.ndarray:
    """``ClientRound.collect`` after ``encode()``: copy, own mask, pairwise masks, reduce."""
    vector = np.array(encoded, dtype=np.uint64, copy=True).ravel()
    add_prg_mask(vector, own, +1)
    for key, sign in pairs:
        add_prg_mask(vector, key, sign)
    return reduce_mod(vector, BITS)


def _row(kind: str, d: int, stage: str, cpu: float, wall: float, peak: int, **extra: Any) -> dict:
    return {
        "benchmark": NAME,
        "side": kind,
        "d": d,
        "stage": stage,
        "cpu_s": cpu,
        "wall_s": wall,
        "peak_bytes": peak,
        "peak_model_copies": peak / (4.0 * d),
        **extra,
    }


def client_rows(d: int, *, repeats: int, neighbours: int = NEIGHBOURS, clients: int = SERVER_CLIENTS, seed: int = 0):
    """One row per client stage at d, then ``encode_update (all)`` and ``upload (all)``."""
    params, calibration = _params(d, clients)
    share = calibration.local_mu
    rng = np.random.default_rng(seed)
    update = rng.standard_normal(d, dtype=np.float32)
    update *= np.float32(10 * CLIP / float(np.linalg.norm(update.astype(np.float64))))
    own, pairs = _keys(neighbours, seed)
    gen = np.random.default_rng(seed + 1)
    stages: dict[str, Callable[[Any], Any]] = {
        "clip": lambda x: l2_clip(x, params.clip_norm),
        "rotation": lambda x: random_rotation(x, params.rotation_seed),
        "round": lambda x: conditional_randomized_round(x * params.scale, params.rounding_bound, gen),
        "noise": lambda k: _add_skellam_share(k, share, gen),  # in place, as client_integer_vector adds it
        "wrap": lambda k: to_modular(k, params.bits),
        "masks": lambda v: _masked(v, own, pairs),
        "pack": lambda v: pack_bits(v, params.bits),
    }
    rows, value = [], update
    for stage in CLIENT_STAGES:
        cpu, wall, peak, value = _measure(lambda fn=stages[stage], x=value: fn(x), repeats)
        extra: dict[str, Any] = {"dtype_out": str(value.dtype)}
        if stage == "masks":
            extra["neighbours"] = neighbours
        rows.append(_row("client", d, stage, cpu, wall, peak, **extra))
    upload = len(Array(value).data)
    del value

    def encode() -> np.ndarray:
        return encode_update(update, params, local_noise_variance=share, rng=gen)

    def full_upload() -> np.ndarray:
        return pack_bits(_masked(encode(), own, pairs), params.bits)

    for stage, fn in (("encode_update (all)", encode), ("upload (all)", full_upload)):
        cpu, wall, peak, _ = _measure(fn, repeats)
        rows.append(_row("client", d, stage, cpu, wall, peak))
    total = rows[-1]
    total.update(
        upload_bytes=upload,
        dense_f32_bytes=4 * d,
        upload_ratio=upload / (4 * d),
        neighbours=neighbours,
        target=f"<= {TARGET_CPU_S:g} s CPU and <= {TARGET_COPIES:g} model copies at d = 1e7",
        cpu_met=total["cpu_s"] <= TARGET_CPU_S,
        memory_met=total["peak_model_copies"] <= TARGET_COPIES,
    )
    return rows


def _reply(packed: np.ndarray) -> RecordDict:
    return RecordDict(
        {
            RECORD: ConfigRecord({STAGE_KEY: Stage.COLLECT}),
            MASKED_RECORD: ArrayRecord({MASKED_KEY: Array(packed)}),
        }
    )


def server_rows(d: int, *, clients: int = SERVER_CLIENTS, fedavg_max_d: int = 10**6, seed: int = 0) -> list[dict]:
    """The server's collect (screen, unpack, add) and unmask arithmetic for ``clients`` masked vectors of length d,
    the FedAvg baseline (d ≤ ``fedavg_max_d``) and the numpy floor."""
    params, _ = _params(d, clients)
    nodes = list(range(1, clients + 1))
    rng = np.random.default_rng(seed)
    secure = _round(nodes, d)
    secure.collect_sent = set(nodes)
    seeds = [rng.bytes(32) for _ in nodes]
    collect_cpu = collect_wall = 0.0
    collect_peak = 0
    for node in nodes:
        packed = rng.integers(0, 256, size=packed_size(d, BITS), dtype=np.uint8)  # uniform bytes: uniform values
        reply = _reply(packed)
        c0, w0 = time.process_time(), time.perf_counter()
        secure.add_vector(node, secure.masked_vector(reply))
        collect_wall += time.perf_counter() - w0
        collect_cpu += time.process_time() - c0
        if node == nodes[0]:  # one client's screening and unpacking (the sum is allocated at the round's start)
            collect_peak = peak_bytes(lambda r=reply: secure.masked_vector(r))
        del packed, reply

    def unmask() -> np.ndarray:
        total = secure.masked_sum.copy()
        for s in seeds:
            add_prg_mask(total, s, -1)
        return reduce_mod(total, BITS)

    c0, w0 = time.process_time(), time.perf_counter()
    summed = unmask()
    unmask_wall, unmask_cpu = time.perf_counter() - w0, time.process_time() - c0
    unmask_peak = peak_bytes(unmask)
    c0, w0 = time.process_time(), time.perf_counter()
    mean = decode_sum(summed, params) / clients
    decode_wall, decode_cpu = time.perf_counter() - w0, time.process_time() - c0
    del mean
    decode_peak = peak_bytes(lambda: decode_sum(summed, params) / clients)
    rows = [
        _row("server", d, f"collect: masked_vector + add_vector x {clients}", collect_cpu, collect_wall, collect_peak),
        _row("server", d, f"unmask: {clients} self masks + reduce_mod", unmask_cpu, unmask_wall, unmask_peak),
        _row("server", d, "decode_sum / n", decode_cpu, decode_wall, decode_peak),
    ]
    cpu = sum(r["cpu_s"] for r in rows)
    wall = sum(r["wall_s"] for r in rows)
    peak = max(r["peak_bytes"] for r in rows)
    total = _row("server", d, f"server (all), {clients} clients", cpu, wall, peak, clients=clients)
    floor_cpu, floor_wall, floor_peak = _numpy_floor(d, clients, seed)
    total.update(
        floor_cpu_s=floor_cpu,
        floor_wall_s=floor_wall,
        floor_peak_bytes=floor_peak,
        cpu_over_floor=cpu / floor_cpu,
    )
    if d <= fedavg_max_d:
        fa_cpu, fa_wall, fa_peak = _fedavg(d, clients, seed)
        total.update(
            fedavg_cpu_s=fa_cpu,
            fedavg_wall_s=fa_wall,
            fedavg_peak_bytes=fa_peak,
            cpu_over_fedavg=cpu / fa_cpu,
            wall_over_fedavg=wall / fa_wall,
            peak_over_fedavg=peak / fa_peak,
        )
    else:
        total["fedavg_note"] = (
            f"FedAvg not run at d = {d:.0e}: {clients} dense replies are {4 * d * clients / 1e9:.0f} GB"
        )
    rows.append(total)
    return rows


def _round(nodes: list[int], d: int) -> SecureAggregationRound:
    n = len(nodes)
    k = min(NEIGHBOURS, n - 1)
    threshold = min_threshold(neighbourhood_size(n, k))
    return SecureAggregationRound(
        1, nodes, num_shares=k, threshold=threshold, min_survivors=threshold, bits=BITS, length=d, timeout=None
    )


def _numpy_floor(d: int, clients: int, seed: int) -> tuple[float, float, int]:
    """100 float32 vectors (a pool of 4) added into a float64 sum, then / n: FedAvg's arithmetic floor."""
    rng = np.random.default_rng(seed)
    pool = [rng.standard_normal(d, dtype=np.float32) for _ in range(min(clients, 4))]

    def once() -> np.ndarray:
        acc = np.zeros(d, dtype=np.float64)
        for i in range(clients):
            acc += pool[i % len(pool)]
        acc /= clients
        return acc

    c0, w0 = time.process_time(), time.perf_counter()
    once()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    return cpu, wall, peak_bytes(once)


def _fedavg(d: int, clients: int, seed: int) -> tuple[float, float, int]:
    """Flower's ``FedAvg.aggregate_train`` of ``clients`` dense float32 replies (:mod:`.bench_model_scale`)."""
    from .bench_aggregation import _TaskIdentity
    from .bench_model_scale import _aggregate, _fedavg as fedavg, _prepared, client_records

    with _TaskIdentity():
        records, _ = client_records(clients, d, seed)
        current = ArrayRecord([np.zeros(d, dtype=np.float32)])
        state = _prepared(lambda: fedavg(clients), clients, current, records, False)
        c0, w0 = time.process_time(), time.perf_counter()
        _aggregate(state, d)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        state = _prepared(lambda: fedavg(clients), clients, current, records, False)
        peak = peak_bytes(lambda: _aggregate(state, d))
    return cpu, wall, peak


def run(
    *,
    dims: tuple[int, ...] = (10**6, 10**7),
    server_dims: tuple[int, ...] = (10**6, 10**7),
    repeats: int = 3,
    clients: int = SERVER_CLIENTS,
    neighbours: int = NEIGHBOURS,
    seed: int = 0,
) -> list[dict]:
    """Client rows for every d of ``dims``, server rows for every d of ``server_dims``."""
    rows = []
    for d in dims:
        t0 = time.perf_counter()
        rows += client_rows(d, repeats=repeats, neighbours=neighbours, clients=clients, seed=seed)
        print(f"[{NAME}] client d={d:.0e} in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    for d in server_dims:
        t0 = time.perf_counter()
        rows += server_rows(d, clients=clients, seed=seed)
        print(f"[{NAME}] server d={d:.0e} in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return rows


def _positive(r: dict, key: str = "cpu_s") -> float:
    """CPU seconds, or wall seconds where a toy size's CPU time is below the clock's resolution (0)."""
    return r[key] if r[key] > 0 else r["wall_s"]


def suite_rows(rows: list[dict]) -> list[dict]:
    """The suite's rows (:func:`._common.row`, for ``run.py``) of :func:`run`'s rows: per client d the upload's CPU
    time against the 2 s budget, its peak against one model copy (target ≤ 3) and its bytes against dense float32;
    per server d its CPU time and peak against Flower's FedAvg (or the numpy floor where FedAvg was not run)."""
    out = []
    for r in rows:
        d = r["d"]
        params = {"d": d, "bits": BITS}
        if "upload_bytes" in r:
            at_goal = d >= 10**7
            params |= {"neighbours": r["neighbours"], "cpu_s": r["cpu_s"], "wall_s": r["wall_s"]}
            out += [
                row(
                    NAME,
                    f"client upload d={d:.0e} CPU",
                    params,
                    metric="time_s",
                    values=[_positive(r)],
                    baseline="the 2 s CPU budget",
                    baseline_values=[TARGET_CPU_S],
                    target="<= 1x at d = 1e7",
                    target_met=bool(r["cpu_met"]) if at_goal else None,
                    notes=f"encode_update + own and {r['neighbours']} pairwise masks + pack_bits (process_time)",
                ),
                row(
                    NAME,
                    f"client upload d={d:.0e} peak memory",
                    params | {"model_copies": r["peak_model_copies"]},
                    metric="peak_bytes",
                    values=[r["peak_bytes"]],
                    baseline="one model copy (4·d B)",
                    baseline_values=[4 * d],
                    target=f"<= {TARGET_COPIES:g} model copies at d = 1e7",
                    target_met=bool(r["memory_met"]) if at_goal else None,
                ),
                row(
                    NAME,
                    f"client upload d={d:.0e} bytes",
                    params,
                    metric="bytes",
                    values=[r["upload_bytes"]],
                    baseline="dense float32 (4·d B)",
                    baseline_values=[4 * d],
                    target="report",
                ),
            ]
        elif "floor_cpu_s" in r:
            fedavg = "fedavg_cpu_s" in r
            prefix = "fedavg" if fedavg else "floor"
            base = {"cpu_s": r[f"{prefix}_cpu_s"], "wall_s": r[f"{prefix}_wall_s"]}
            params |= {"clients": r["clients"], "cpu_s": r["cpu_s"], "wall_s": r["wall_s"]}
            out += [
                row(
                    NAME,
                    f"server unmask n={r['clients']} d={d:.0e} CPU",
                    params,
                    metric="time_s",
                    values=[_positive(r)],
                    baseline="flwr FedAvg.aggregate_train" if fedavg else "numpy float64 sum floor",
                    baseline_values=[_positive(base, "cpu_s")],
                    target="report",
                ),
                row(
                    NAME,
                    f"server unmask n={r['clients']} d={d:.0e} peak memory",
                    params | {"model_copies": r["peak_model_copies"]},
                    metric="peak_bytes",
                    values=[r["peak_bytes"]],
                    baseline="flwr FedAvg's peak" if fedavg else "numpy floor's peak",
                    baseline_values=[r["fedavg_peak_bytes"] if fedavg else r["floor_peak_bytes"]],
                    target="report",
                ),
            ]
    return out


def suite_run(**kwargs: Any) -> list[dict]:
    """:func:`run`, in the suite's row format (:func:`suite_rows`)."""
    return suite_rows(run(**kwargs))


def _f(x: float, fmt: str = ".3f") -> str:
    return format(x, fmt) if isinstance(x, (int, float)) and math.isfinite(x) else "–"


def table(rows: list[dict]) -> str:
    """Markdown: the client's stages per d, then the server's."""
    lines = [
        "| side | d | stage | CPU s | wall s | peak MB | model copies (4·d B) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['side']} | {r['d']:.0e} | {r['stage']} | {_f(r['cpu_s'])} | {_f(r['wall_s'])} | "
            f"{r['peak_bytes'] / 1e6:.1f} | {r['peak_model_copies']:.2f} |"
        )
    lines += [
        "",
        "| d | upload B | dense f32 B | ratio | upload CPU s | ≤ 2 s | peak copies | ≤ 3 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "upload_bytes" in r:
            lines.append(
                f"| {r['d']:.0e} | {r['upload_bytes']:,} | {r['dense_f32_bytes']:,} | {r['upload_ratio']:.3f} | "
                f"{r['cpu_s']:.2f} | {'yes' if r['cpu_met'] else '**NO**'} | {r['peak_model_copies']:.2f} | "
                f"{'yes' if r['memory_met'] else '**NO**'} |"
            )
    lines += [
        "",
        "| d | clients | server CPU s | wall s | peak copies | FedAvg CPU s | × FedAvg (CPU) | FedAvg peak copies | "
        "numpy floor CPU s | × floor |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "floor_cpu_s" in r:
            lines.append(
                f"| {r['d']:.0e} | {r['clients']} | {r['cpu_s']:.2f} | {r['wall_s']:.2f} | {r['peak_model_copies']:.2f} | "
                f"{_f(r.get('fedavg_cpu_s', math.nan), '.2f')} | {_f(r.get('cpu_over_fedavg', math.nan), '.1f')} | "
                f"{_f(r.get('fedavg_peak_bytes', math.nan) / (4.0 * r['d']), '.2f')} | {r['floor_cpu_s']:.3f} | "
                f"{r['cpu_over_floor']:.1f} |"
            )
    return "\n".join(lines) + "\n"


def markdown(result: dict) -> str:
    m = result["machine"]
    return (
        f"## Secure aggregation at model scale (issue 40 item 2; {result['mode']} run, {result['created']})\n\n"
        f"Machine: {m['platform']}, {m['cpu_count']} CPUs (shared; 1-minute load average "
        f"{' → '.join(f'{x:.1f}' for x in result.get('load_average_1min', []))} at the start and end), "
        f"numpy {m['numpy']}. "
        "b = 20, C = 1, z = 1, m = 100, k = 24 pairwise masks per client. CPU: `time.process_time` (median of the "
        "repeats); peak: traced allocations (tracemalloc: numpy buffers and Python bytes) above what was live before "
        "the call, the stage's input not counted; see the module docstring of "
        "`flwr_dp_benchmarks/bench_secagg_model_scale.py` for exactly what each stage calls.\n\n"
        + "".join(f"{note}\n\n" for note in result.get("notes", []))
        + table(result["rows"])
    )


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--name", default="secagg_model_scale", help="file stem of the json and md written in --out")
    parser.add_argument("--note", action="append", default=[], help="a line for the markdown (repeatable)")
    args = parser.parse_args(argv)
    mode = "tiny" if args.tiny else ("quick" if args.quick else "full")
    load = [os.getloadavg()[0]]
    rows = run(**MODES[mode])
    load.append(os.getloadavg()[0])
    result = {
        "load_average_1min": load,
        "mode": mode,
        "machine": machine(),
        "created": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "notes": args.note,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1, allow_nan=True, default=float))
    md = args.out / f"{args.name}.md"
    kept = md.read_text().partition(HAND_WRITTEN)[2] if md.exists() else ""
    md.write_text(markdown(result) + (f"\n{HAND_WRITTEN}{kept}" if kept else ""))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
