"""Names that left a package's public surface keep resolving, with a DeprecationWarning (PEP 562).

A package lists its moved or renamed names as ``{old_name: "new.module:new_name"}`` and calls
:func:`resolve_moved` from its module-level ``__getattr__``. The warning names the import to use
instead, and the object returned is the one at the new path (so ``isinstance`` checks keep working).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any


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
