"""Lazy package exports and names that left a package's public surface (PEP 562).

:func:`resolve_lazy`: a package's ``__init__`` imports none of its submodules; each exported name is imported
from its module on first use. A package whose ``__init__`` imports its own submodules takes their import locks
while it holds its own, and a second thread importing one of those submodules directly holds the submodule's lock
while it waits for the package: the two threads deadlock and Python hands one of them a partially initialised
module (``ImportError: cannot import name ... (most likely due to a circular import)``), as Flower's simulation
does when it loads a ClientApp in several threads at once.

:func:`resolve_moved`: names that left a package's public surface keep resolving, with a DeprecationWarning.

A package lists its moved or renamed names as ``{old_name: "new.module:new_name"}`` and calls
:func:`resolve_moved` from its module-level ``__getattr__``. The warning names the import to use
instead, and the object returned is the one at the new path (so ``isinstance`` checks keep working).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any


def resolve_lazy(package: str, namespace: dict[str, Any], name: str, exports: dict[str, str]) -> Any:
    """Import ``exports[name]`` (a module path relative to ``package``), bind ``name`` in ``namespace`` (the
    package's globals) and return it; AttributeError if ``name`` is not exported lazily."""
    module = exports.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, package), name)
    namespace[name] = value
    return value


def resolve_moved(package: str, name: str, moved: dict[str, str]) -> Any:
    """Return ``moved[name]``'s object, warning that ``package.name`` is deprecated; AttributeError if unknown."""
    target = moved.get(name)
    if target is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    module, _, attr = target.partition(":")
    warnings.warn(
        f"{package}.{name} is deprecated and will be removed: use `from {module} import {attr}`",
        DeprecationWarning,
        stacklevel=3,
    )
    return getattr(importlib.import_module(module), attr)
