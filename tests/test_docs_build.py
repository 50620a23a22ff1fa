"""The documentation site builds with ``mkdocs build --strict`` (every warning is an error).

This catches a docstring whose markup breaks the API reference, a page missing from the nav, a
link to a page or heading that does not exist, and a public class that mkdocstrings can no longer
find. The build is offline: no plugin downloads anything (``theme.font: false``, no social cards).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's banner about its successor
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(site),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"

    # the API reference was generated from the docstrings, not left empty
    strategies = (site / "api" / "strategies" / "index.html").read_text(encoding="utf-8")
    assert 'id="flwr_dp_strategies.AccountedFedAvg"' in strategies
    assert 'id="flwr_dp_strategies.AccountedPoissonFixedClipping"' in strategies
    assert "reply screening" in strategies  # AccountedFedAvg's docstring: "FedAvg + reply screening + ..."
    assert "noise_multiplier" in strategies  # an argument documented under "Args:"
    client_mods = (site / "api" / "client_mods" / "index.html").read_text(encoding="utf-8")
    assert 'id="client_mods.LocalUpdateNoiseMod"' in client_mods
    privacy = (site / "api" / "privacy" / "index.html").read_text(encoding="utf-8")
    assert 'id="flwr_dp_strategies.privacy.PrivacyLedger"' in privacy

    # every page of the nav was built
    for page in (
        "quickstart",
        "architecture",
        "choosing",
        "ledger",
        "mechanisms",
        "delm",
        "adaptive-clipping",
        "differences-from-flower",
        "deployment",
        "benchmarks",
    ):
        assert (site / page / "index.html").is_file(), page
