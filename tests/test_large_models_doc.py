"""The client-level noise table of docs/large-models.md: each row's z keeps the whole run at its target ε (PLD,
Poisson sampling at q = m/N, δ = 1e-5), and its derived columns are z/m and z·√d/m at d = 1e5."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from dp_accounting.dp_event import GaussianDpEvent, PoissonSampledDpEvent, SelfComposedDpEvent
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant

DOC = Path(__file__).resolve().parent.parent / "docs" / "large-models.md"
ROW = re.compile(r"^\| ([\d ]+) \| ([\d ]+) \| ([\d ]+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$")


def rows() -> list[tuple[float, ...]]:
    found = []
    for line in DOC.read_text().splitlines():
        match = ROW.match(line)
        if match:
            found.append(tuple(float(g.replace(" ", "")) for g in match.groups()))
    return found


def test_the_table_is_there():
    assert len(rows()) == 8


@pytest.mark.parametrize("row", rows(), ids=lambda r: f"N{int(r[0])}-eps{int(r[3])}")
def test_each_row_spends_its_target_epsilon(row):
    n, m, rounds, epsilon, z, per_coordinate, at_d = row
    q = m / n
    step = GaussianDpEvent(z) if q == 1 else PoissonSampledDpEvent(q, GaussianDpEvent(z))
    spent = PLDAccountant().compose(SelfComposedDpEvent(step, int(rounds))).get_epsilon(1e-5)
    assert spent == pytest.approx(epsilon, rel=0.02)
    assert per_coordinate == pytest.approx(z / m, rel=0.01)
    assert at_d == pytest.approx(z * math.sqrt(1e5) / m, rel=0.01)
