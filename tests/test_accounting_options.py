"""The accounting options are defined once (``rounds.options.AccountingOptions``) and every strategy takes all
of them the same way (issue 36, item 7)."""

from __future__ import annotations

import ast
import inspect
import pathlib

import pytest

import flwr_dp_strategies.strategy as strategy_package
from flwr_dp_strategies.rounds.options import ACCOUNTING_OPTIONS, AccountingOptions
from strategy_registry import REGISTRY

ROOT = pathlib.Path(__file__).resolve().parent.parent
ONE_PER_CLASS = {entry.covers: entry for entry in reversed(list(REGISTRY.values()))}


def test_no_strategy_constructor_lists_an_option_again():
    """No constructor in ``flwr_dp_strategies/strategy`` names an option as its own parameter: they come in
    ``**accounting`` and the template validates them (a second list could drift from the first)."""
    for path in sorted((ROOT / "flwr_dp_strategies" / "strategy").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                named = {a.arg for a in node.args.args + node.args.kwonlyargs}
                assert not named & set(ACCOUNTING_OPTIONS), (path.name, sorted(named & set(ACCOUNTING_OPTIONS)))
    assert set(ACCOUNTING_OPTIONS) == set(AccountingOptions.__annotations__)


@pytest.mark.parametrize("entry", ONE_PER_CLASS.values(), ids=[cls.__name__ for cls in ONE_PER_CLASS])
def test_every_strategy_takes_every_option(entry, tmp_path):
    """Each option reaches the strategy (a positive control for each: the value set is the value read back)."""
    strategy = entry.make(
        ledger_path=str(tmp_path / "ledger.json"),
        per_client_metrics=True,
        max_weight=5.0,
        evaluate_metrics="flower",
        **({} if entry.name == "ClusterEvaluation(AccountedFedAvg)" else {"max_reply_bytes": 10**6}),
    )
    assert strategy.ledger_path == str(tmp_path / "ledger.json")
    assert strategy.per_client_metrics is True and strategy.max_weight == 5.0
    assert strategy.evaluate_metrics == "flower"
    assert entry.name == "ClusterEvaluation(AccountedFedAvg)" or strategy.max_reply_bytes == 10**6
    default = entry.make()
    assert default.per_client_metrics is False and default.max_reply_bytes is None and default.ledger_path is None


@pytest.mark.parametrize("entry", ONE_PER_CLASS.values(), ids=[cls.__name__ for cls in ONE_PER_CLASS])
def test_a_misspelt_or_invalid_option_is_a_clear_error(entry):
    with pytest.raises(TypeError, match="ledger_pth"):
        entry.make(ledger_pth="x.json")
    with pytest.raises((TypeError, ValueError), match="per_client_metrics"):
        entry.make(per_client_metrics="yes")
    with pytest.raises(ValueError, match="max_weight"):
        entry.make(max_weight=-1.0)
    if entry.name != "ClusterEvaluation(AccountedFedAvg)":
        with pytest.raises(ValueError, match="max_reply_bytes"):
            entry.make(max_reply_bytes=0)


def test_the_options_are_documented_once_and_referenced_by_every_constructor():
    doc = inspect.getdoc(AccountingOptions) or ""
    for name in ACCOUNTING_OPTIONS:
        assert f"{name}:" in doc, name
    for name in strategy_package.__all__:
        mro = [k for k in getattr(strategy_package, name).__mro__ if k.__module__.startswith("flwr_dp_strategies.")]
        assert any("AccountingOptions" in (k.__doc__ or "") for k in mro), name
