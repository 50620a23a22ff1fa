"""Keep third-party libraries from configuring the root logger.

Flower logs through its own ``flwr`` logger, with its own handler, and lets records
propagate to the root logger. A handler on the root logger therefore prints every
Flower line a second time. Two libraries this package imports add one:

* dp-accounting's RDP accountant warns through ``absl.logging``, whose ``log()`` calls
  ``logging.basicConfig()`` whenever the root logger has no handler (absl-py 2.x,
  ``absl/logging/__init__.py``), i.e. on the first convergence warning of a run
  (e.g. a Poisson-sampled Gaussian at q = 0.5, z = 0.5);
* Opacus calls ``logging.basicConfig()`` when it is imported.

:func:`route_absl_warnings` makes the first one impossible: the ``logging`` name of
every loaded dp-accounting module that uses absl is rebound to a stand-in that
logs to the same ``absl`` logger without ever touching the root logger (a warning
still reaches stderr through Python's last-resort handler, or through whatever
the application configured). :func:`no_new_root_handlers` undoes the second.
Nothing here imports Flower (it is part of the privacy core).
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

ABSL_LOGGER = "absl"
_ABSL_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
    "exception": logging.ERROR,
}
# dp-accounting modules known to log through absl (imported here so they are routed before first use)
_DP_ACCOUNTING_MODULES = ("dp_accounting.rdp.rdp_privacy_accountant",)


class _AbslWithoutRootHandler:
    """Stands in for the ``absl.logging`` module inside a library module.

    ``warning``, ``info``, ... log to the ``absl`` logger directly; everything else
    (constants, ``log_every_n``, flags) is absl's own. absl's own ``log()`` is never
    called, so ``logging.basicConfig()`` is never called.
    """

    def __init__(self, absl_logging: Any) -> None:
        self._absl_logging = absl_logging

    def __getattr__(self, name: str) -> Any:
        level = _ABSL_LEVELS.get(name)
        if level is None:
            return getattr(self._absl_logging, name)

        def emit(msg: object, *args: object, **kwargs: Any) -> None:
            if name == "exception":
                kwargs.setdefault("exc_info", True)
            kwargs.setdefault("stacklevel", 2)  # the record names the library line that logged
            logging.getLogger(ABSL_LOGGER).log(level, msg, *args, **kwargs)

        return emit

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        """absl's ``log(level, ...)``: absl levels (-1 = WARNING, ...) converted to Python's."""
        converter = self._absl_logging.converter
        standard = converter.absl_to_standard(level) if level <= converter.ABSL_DEBUG else logging.DEBUG
        kwargs.setdefault("stacklevel", 2)
        logging.getLogger(ABSL_LOGGER).log(standard, msg, *args, **kwargs)


def route_absl_warnings() -> None:
    """Rebind ``logging`` in the dp-accounting modules that use absl (idempotent).

    After this, no dp-accounting warning can add a handler to the root logger.
    """
    try:
        from absl import logging as absl_logging
    except ImportError:  # absl is dp-accounting's dependency; without it there is nothing to route
        return
    for name in _DP_ACCOUNTING_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # a dp-accounting version without this module
            continue
    for name, module in list(sys.modules.items()):
        if (name == "dp_accounting" or name.startswith("dp_accounting.")) and getattr(
            module, "logging", None
        ) is absl_logging:
            module.logging = _AbslWithoutRootHandler(absl_logging)  # type: ignore[attr-defined]


@contextmanager
def no_new_root_handlers() -> Iterator[None]:
    """No printing handler appears on the root logger inside the block, not even for a moment.

    ``logging.basicConfig()`` does nothing when the root logger already has a handler, so a
    root logger without one gets a :class:`logging.NullHandler` for the duration of the block
    (another thread logging meanwhile, e.g. Flower's ServerApp during a simulation's ClientApp
    import, is not doubled); every handler added inside the block is removed at its end.
    """
    root = logging.getLogger()
    before = list(root.handlers)
    placeholder = logging.NullHandler() if not before else None
    if placeholder is not None:
        root.addHandler(placeholder)
    try:
        yield
    finally:
        for handler in root.handlers[:]:
            if handler not in before:
                root.removeHandler(handler)


__all__ = ["ABSL_LOGGER", "no_new_root_handlers", "route_absl_warnings"]
