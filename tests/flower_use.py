"""Which test modules can depend on Flower's version: the ``flower_independent`` marker of tests/conftest.py.

CI runs the whole suite on one Flower release and the fast tests again on the oldest supported release and on the
next one. A test module that can run no Flower code gives the same result on every Flower release, so those two
lanes skip it (``-m "not slow and not flower_independent"``). A module is Flower-independent when, statically:

* no ``import`` in it (at any level, a function's body included; ``if TYPE_CHECKING:`` blocks excepted), nor in
  any module of this repository it imports, transitively (the parent packages' ``__init__`` included), imports
  ``flwr``;
* it starts no subprocess, imports nothing through ``sys.path`` or dynamically (:data:`DYNAMIC`: code the rule
  cannot follow) and uses none of the Flower fixtures of conftest.py (:data:`FLOWER_FIXTURES`).

The rule errs on the side of "dependent": a module that imports Flower anywhere on any path counts, whether or
not its tests reach that import. ``tests/test_architecture.py`` checks it at run time: importing every module it
calls independent, in a fresh interpreter, loads no ``flwr`` module.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("flwr_dp_strategies", "client_mods", "flwr_dp_benchmarks", "flwr_dp_experiments")
#: conftest.py fixtures that run Flower code
FLOWER_FIXTURES = ("task_identity", "tiny_benchmarks")
#: code the static rule cannot follow: a subprocess, a module found through ``sys.path`` (an example app), a
#: dynamic import
DYNAMIC = ("subprocess", "sys.path", "importlib", "import_module", "runpy", "__import__")


def _module_path(name: str) -> Optional[Path]:
    parts = name.split(".")
    if parts[0] in PACKAGES:
        path = ROOT.joinpath(*parts)
        if (path / "__init__.py").exists():
            return path / "__init__.py"
        return path.with_suffix(".py") if path.with_suffix(".py").exists() else None
    helper = ROOT / "tests" / f"{parts[0]}.py"  # the tests' own helper modules (loopback, strategy_registry, ...)
    return helper if len(parts) == 1 and helper.exists() else None


def _imports(path: Path) -> set[str]:
    """Every module name ``path`` imports (and ``module.name`` for ``from module import name``), outside
    ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
    package = list(path.relative_to(ROOT).with_suffix("").parts)[:-1]  # the package ``from .`` names
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return {name for name in names if name}


def _search(path: Path, seen: set[Path]) -> bool:
    if path in seen:
        return False
    seen.add(path)
    for name in _imports(path):
        if name == "flwr" or name.startswith("flwr."):
            return True
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            module = _module_path(".".join(parts[:i]))
            if module is not None and _search(module, seen):
                return True
    return False


@lru_cache(maxsize=None)
def flower_independent(path: Path) -> bool:
    """True when the test module at ``path`` can run no Flower code (module docstring)."""
    source = path.read_text(encoding="utf-8")
    if any(marker in source for marker in DYNAMIC) or any(fixture in source for fixture in FLOWER_FIXTURES):
        return False
    return not _search(path, set())


__all__ = ["DYNAMIC", "FLOWER_FIXTURES", "flower_independent"]
