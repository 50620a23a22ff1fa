"""The library never adds a handler that prints to the root logger, not even for a moment.

A root handler makes every Flower log line print twice (Flower's own handler,
then the root's). Opacus calls ``logging.basicConfig`` when it is imported;
``client_mods.dp_sgd_accounting`` used to remove the handler again after the import,
but in Flower's simulation the ClientApp is imported in one thread while the
ServerApp logs in another, so lines logged during that import still came out
twice (seen in the quickstart demo's flower.log); a NullHandler on the root during the
import now makes ``basicConfig`` a no-op. The test records every
``addHandler`` on the root logger while importing every module of the library,
in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[1]

PROBE = """
import importlib, json, logging, pkgutil, traceback
root = logging.getLogger()
added = []
add = logging.Logger.addHandler
def record(self, handler):
    if self is root and not isinstance(handler, logging.NullHandler):  # a NullHandler prints nothing
        added.append("".join(traceback.format_stack(limit=12)))
    return add(self, handler)
logging.Logger.addHandler = record
for name in ("flwr_dp_strategies", "client_mods", "flwr_dp_experiments"):
    package = importlib.import_module(name)
    for info in pkgutil.walk_packages(package.__path__, name + "."):
        importlib.import_module(info.name)
print(json.dumps({"added": added, "left": [repr(h) for h in root.handlers]}))
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    """One fresh interpreter importing the whole library (both tests read the same run)."""
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_no_root_handler_is_left_after_importing_the_library(probe):
    assert probe["left"] == []


def test_no_root_handler_is_ever_added_while_importing_the_library(probe):
    added = probe["added"]
    assert added == [], added[0]
