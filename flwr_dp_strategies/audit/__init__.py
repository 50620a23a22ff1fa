"""Empirical privacy auditing of a whole federated run: canary clients (Andrew et al., ICLR 2024).

:class:`~.canaries.CanaryAudit` runs any strategy of this package with k extra canary clients and
estimates, from that one run, the ε of a worst-case client; the statistics live in
:mod:`flwr_dp_strategies.privacy.analyses.audit` (Flower-free).
"""

from .canaries import (
    CANARY_ID_BASE,
    AuditReport,
    CanaryAudit,
    CanaryGrid,
    canary_client_app,
    flatten_arrays,
    plot_audit,
)

__all__ = [
    "AuditReport",
    "CANARY_ID_BASE",
    "CanaryAudit",
    "CanaryGrid",
    "canary_client_app",
    "flatten_arrays",
    "plot_audit",
]
