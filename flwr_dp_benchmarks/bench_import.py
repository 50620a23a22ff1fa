"""Import time of the client side against Flower's own (issue 36 item 6).

Each figure is the median wall time of ``python -c "import X"`` in a fresh interpreter (``repeats`` runs,
interleaved so that machine load hits every module alike), with the checkout ``--root`` first on ``PYTHONPATH``
(so another checkout, e.g. the commit before a change, can be measured with the same interpreter). The goal:
``import client_mods`` at most 1.0 s more than ``import flwr``.

    python flwr_dp_benchmarks/bench_import.py [--repeats 7] [--root PATH] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULES = ("flwr", "client_mods", "client_mods.distributed_dp_mod", "flwr_dp_strategies", "flwr_dp_strategies.strategy")


def time_imports(root: Path, repeats: int) -> dict[str, list[float]]:
    """{module: wall seconds of each fresh ``import``}, the modules interleaved run by run."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    env.update(FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1")
    times: dict[str, list[float]] = {m: [] for m in MODULES}
    for _ in range(repeats):
        for module in MODULES:
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", f"import {module}"], env=env, check=True, cwd=root)
            times[module].append(time.perf_counter() - start)
    return times


def loaded_server_modules(root: Path) -> list[str]:
    """Our server-side modules in ``sys.modules`` after ``import client_mods``."""
    code = (
        "import json, sys, client_mods\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('flwr_dp_strategies.strategy', "
        "'flwr_dp_strategies.rounds', 'flwr_dp_strategies.audit')) or m.endswith('server_protocol'))))"
    )
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True, cwd=root)
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(times: dict[str, list[float]], server: list[str], root: Path) -> dict:
    medians = {m: statistics.median(v) for m, v in times.items()}
    return {
        "root": str(root),
        "python": sys.version.split()[0],
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "median_s": medians,
        "runs_s": times,
        "client_mods_minus_flwr_s": medians["client_mods"] - medians["flwr"],
        "server_modules_after_import_client_mods": len(server),
    }


def markdown(result: dict) -> str:
    lines = [
        f"Checkout {result['root']}, Python {result['python']}, load average {result['load_average']:.2f}; median of "
        f"{len(next(iter(result['runs_s'].values())))} fresh interpreters, seconds.",
        "",
        "| import | median s | min s | max s |",
        "|---|---|---|---|",
    ]
    for module, runs in result["runs_s"].items():
        lines.append(f"| `{module}` | {result['median_s'][module]:.2f} | {min(runs):.2f} | {max(runs):.2f} |")
    lines += [
        "",
        f"`import client_mods` − `import flwr`: **{result['client_mods_minus_flwr_s']:.2f} s** (goal ≤ 1.0 s); "
        f"our server modules loaded by `import client_mods`: {result['server_modules_after_import_client_mods']}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--out", type=Path, default=None, help="write import.json and import.md here")
    args = parser.parse_args(argv)
    result = report(time_imports(args.root, args.repeats), loaded_server_modules(args.root), args.root)
    text = markdown(result)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "import.json").write_text(json.dumps(result, indent=1))
        (args.out / "import.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
