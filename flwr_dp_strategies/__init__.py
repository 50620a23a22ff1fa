"""flwr-dp-strategies: differentially private strategies, client mods and a privacy ledger for Flower.

``flwr_dp_strategies.privacy`` is the Flower-free privacy core (mechanisms,
DpEvents, accountants, :class:`~flwr_dp_strategies.privacy.PrivacyLedger`).
``flwr_dp_strategies.strategy`` holds the Message-API strategies.

The top level exports the strategies, :class:`PrivacyLedger` and the declaration API
(:func:`declare_release`, :func:`read_declarations`) only. Everything else is imported from
its own module: ``flwr_dp_strategies.federated_pca.LdpFederatedPCA``,
``flwr_dp_strategies.layer_shuffler.LayerShuffler``, the mechanisms from
``flwr_dp_strategies.privacy``, the client side from ``client_mods``.
"""

from typing import TYPE_CHECKING


#: every export is imported from its module on first use (PEP 562): a ClientApp that imports ``client_mods``
#: (which imports this package's privacy core) never loads the server's strategies, and importing this package
#: takes no submodule's import lock (see :func:`._deprecation.resolve_lazy`)
def _strategy_names() -> tuple[str, ...]:
    """``flwr_dp_strategies.strategy.__all__``, read from its source: importing the package would load Flower's
    server side, which a ClientApp importing this package's privacy core must not (one list of strategies:
    adding one is its module, its line in ``strategy/__init__.py`` and its registry entry in the tests)."""
    import ast
    from importlib.resources import files

    tree = ast.parse((files(__name__) / "strategy" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise ImportError("flwr_dp_strategies.strategy defines no literal __all__")


_STRATEGIES = _strategy_names()

if TYPE_CHECKING:  # static analysers and the docs generator see the real names
    from .declarations import declare_release, read_declarations
    from .privacy import PrivacyLedger
    from .strategy import *  # noqa: F403 - every strategy (the names of strategy.__all__)

__version__ = "0.1.0"

__all__ = [*_STRATEGIES, "PrivacyLedger", "declare_release", "read_declarations"]

#: names that left the top level -> "module:name" (they resolve, with a DeprecationWarning; PEP 562)
_MOVED = {
    "LdpFederatedPCA": "flwr_dp_strategies.federated_pca:LdpFederatedPCA",
    "LayerShuffler": "flwr_dp_strategies.layer_shuffler:LayerShuffler",
}


_LAZY = {
    **dict.fromkeys(_STRATEGIES, ".strategy"),
    "PrivacyLedger": ".privacy",
    "declare_release": ".declarations",
    "read_declarations": ".declarations",
}


def __getattr__(name: str):
    from ._deprecation import resolve_lazy, resolve_moved

    if name in _LAZY:
        return resolve_lazy(__name__, globals(), name, _LAZY)
    return resolve_moved(__name__, name, _MOVED)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
