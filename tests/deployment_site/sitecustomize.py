"""Loaded by every process the deployment tests start (``tests/deployment_harness.py`` puts this folder on their
``PYTHONPATH``): the SuperNodes' heartbeat at Flower's minimum interval (10 s) instead of its default (30 s), so the
SuperLink declares a killed SuperNode unavailable after about 2 x 10 s instead of 2 x 30 s. Only the waiting time
changes; what the tests check (the dead node's error reply, the round going on without it) does not. Flower has no
flag for it (``HEARTBEAT_DEFAULT_INTERVAL`` is a constant), so the constant is set before any Flower module reads it.
"""

try:
    import flwr.common.constant as _constant
except ImportError:  # a process without Flower: nothing to set
    pass
else:
    _constant.HEARTBEAT_DEFAULT_INTERVAL = _constant.HEARTBEAT_MIN_INTERVAL
