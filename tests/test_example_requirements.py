"""Every example app asks for the Flower versions the package supports (issue 38 admitted Flower 1.43; the
examples' pins stayed at <1.43, so `pip install -e examples/<app>` refused the nightly the package accepts)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*/pyproject.toml"))


def flwr_range(requirements: list[str]) -> str:
    [spec] = [r for r in requirements if re.match(r"flwr(\[[^\]]*\])?\s*[<>=!~]", r)]
    return re.sub(r"^flwr(\[[^\]]*\])?", "", spec).replace(" ", "")


def package_range() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return flwr_range(project["dependencies"])


def test_the_package_states_one_flwr_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [r for reqs in project["optional-dependencies"].values() for r in reqs if re.match(r"flwr[\[<>=]", r)]
    assert extras  # the simulation extra
    assert {flwr_range([r]) for r in extras} <= {package_range()}


@pytest.mark.parametrize("pyproject", EXAMPLES, ids=[p.parent.name for p in EXAMPLES])
def test_each_example_asks_for_the_package_flwr_range(pyproject):
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    assert flwr_range(dependencies) == package_range(), pyproject
