"""Importing the package from several threads at once works (Flower's simulation loads a ClientApp in several
threads): a package ``__init__`` that imports its own submodules lets two threads deadlock on import locks, and
Python then hands one of them a half-initialised module (``ImportError: cannot import name 'Release' from partially
initialized module 'flwr_dp_strategies.privacy'``; seen in 5 of 6 tries before the package inits became lazy)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENTRY_POINTS = [
    "client_mods.signds_mod",
    "flwr_dp_strategies",
    "client_mods",
    "flwr_dp_strategies.privacy.accounting.events",
    "flwr_dp_strategies.declarations",
    "flwr_dp_strategies.privacy.mechanisms.laplace",
    "client_mods.adaptive_clipping_mod",
    "flwr_dp_strategies.privacy.accounting.ledger",
]
SCRIPT = """
import importlib, sys, threading, traceback
errors = []
def load(name):
    try:
        importlib.import_module(name)
    except Exception:
        errors.append(traceback.format_exc())
threads = [threading.Thread(target=load, args=(name,)) for name in sys.argv[1:]]
for t in threads:
    t.start()
for t in threads:
    t.join()
import flwr_dp_strategies.privacy as privacy, client_mods
assert privacy.Release is not None and callable(client_mods.signds_mod)
print(errors[0] if errors else "ok")
"""


def test_the_package_imports_from_several_threads_at_once():
    for _ in range(3):  # each try a fresh interpreter (the old layout failed the first)
        run = subprocess.run(
            [sys.executable, "-c", SCRIPT, *ENTRY_POINTS], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr
