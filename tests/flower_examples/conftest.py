"""Keep pytest out of the vendored Flower sources: they are run by tests/test_flower_*.py, not collected here.

``flower_strategy_tests/*_test.py`` are Flower's own unit tests, vendored unmodified; they use
package-relative imports (``from .fedavgm import FedAvgM``) and only make sense through the
shim in ``tests/test_flower_strategy_parity.py``.
"""

collect_ignore_glob = ["*"]
