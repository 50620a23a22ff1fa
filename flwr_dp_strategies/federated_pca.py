r"""Server side of LDP federated PCA (DELM Algorithm 2, lines 7-9).

:class:`LdpFederatedPCA` asks every node for its noisy second-moment matrix
(message ``train.pca``, answered by :func:`client_mods.federated_pca.covariance_reply`),
books each declared release in the ledger (share the ledger with the training
strategy, so that ``privacy/epsilon`` includes the PCA), rejects malformed
replies (wrong shape, NaN, asymmetric, oversized, undeclared: logged and counted
in ``rejections``, the others go on), averages the accepted ones, eigendecomposes and
sends the top-k eigenvectors back (``train.pca_projection``). Everything after
the clients' releases is post-processing.

A reply that declares nothing is booked as ``NonPrivateDpEvent`` (ε = inf).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from dp_accounting.dp_event import NonPrivateDpEvent
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from .declarations import PRIVACY_RECORD
from .privacy import PrivacyLedger
from .privacy.mechanisms.covariance import top_eigenvectors
from .privacy.validation import check_int
from .rounds.client_accounting import ClientAccountingMixin

COVARIANCE_KEY = "covariance"
PROJECTION_KEY = "projection"
PCA_MESSAGE = "train.pca"
PROJECTION_MESSAGE = "train.pca_projection"


class LdpFederatedPCA(ClientAccountingMixin):
    """Run Algorithm 2 over a Flower Grid; :meth:`run` returns the projection (d × k).

    Args:
        dim: d, the clients' feature dimension.
        num_components: k in [1, d] (the paper's p·d).
        ledger, ledger_path, resume, high_water_path, per_client_metrics, max_reply_bytes: as in AccountedFedAvg.
        symmetry_tolerance: largest accepted max|C − Cᵀ| / max(1, max|C|).
    """

    def __init__(
        self,
        dim: int,
        num_components: int,
        *,
        ledger: Optional[PrivacyLedger] = None,
        ledger_path: Optional[str] = None,
        resume: bool = False,
        high_water_path: Optional[str] = None,
        per_client_metrics: bool = False,
        max_reply_bytes: Optional[int] = None,
        symmetry_tolerance: float = 1e-6,
    ) -> None:
        self.dim = check_int("dim", dim, minimum=1)
        self.num_components = check_int("num_components", num_components, minimum=1)
        if self.num_components > self.dim:
            raise ValueError(f"num_components must be in [1, {self.dim}], got {num_components}")
        self.symmetry_tolerance = float(symmetry_tolerance)
        self._init_accounting(
            ledger, ledger_path, per_client_metrics, max_reply_bytes, resume=resume, high_water_path=high_water_path
        )
        self.metrics: Optional[MetricRecord] = None

    def requests(self, grid: Grid) -> list[Message]:
        """One ``train.pca`` message per node."""
        config = ConfigRecord({"pca-dim": self.dim, "pca-components": self.num_components})
        return [
            Message(RecordDict({"config": config}), dst_node_id=node, message_type=PCA_MESSAGE)
            for node in grid.get_node_ids()
        ]

    def aggregate(self, server_round: int, replies: list[Message]) -> Optional[np.ndarray]:
        """Screen and book the replies; the top-k eigenvectors of the mean accepted matrix (None if none)."""
        replies = list(replies)
        undeclared = [r for r in replies if not r.has_error() and PRIVACY_RECORD not in r.content.config_records]
        accepted, rejected = self.screen_and_book(server_round, replies, self._check)
        for reply in undeclared:
            self.ledger.record(
                NonPrivateDpEvent(),
                server_round=server_round,
                client=reply.metadata.src_node_id,
                label="ldp-fpca/undeclared (non-private)",
            )
        total = np.zeros((self.dim, self.dim))
        for reply in accepted:
            total += _matrix(reply.content)
        self.metrics = self.round_metrics(None, rejected)  # the ledger's figures; counts stay in the log
        return top_eigenvectors(total / len(accepted), self.num_components) if accepted else None

    def _check(self, content: RecordDict) -> Optional[str]:
        records = list(content.array_records.values())
        if len(records) != 1 or list(records[0].keys()) != [COVARIANCE_KEY]:
            return "structure"
        array = records[0][COVARIANCE_KEY]
        if self.max_reply_bytes is not None and len(array.data) > self.max_reply_bytes:
            return "oversized"
        if tuple(array.shape) != (self.dim, self.dim):
            return "shape"
        matrix = array.numpy()
        if not np.isfinite(matrix).all():
            return "non-finite"
        if np.abs(matrix - matrix.T).max() > self.symmetry_tolerance * max(1.0, float(np.abs(matrix).max())):
            return "values"
        return None

    def broadcast(self, projection: np.ndarray, grid: Grid) -> list[Message]:
        """One ``train.pca_projection`` message per node carrying the projection."""
        record = ArrayRecord({PROJECTION_KEY: Array(np.ascontiguousarray(projection))})
        return [
            Message(RecordDict({"arrays": record}), dst_node_id=node, message_type=PROJECTION_MESSAGE)
            for node in grid.get_node_ids()
        ]

    def run(self, grid: Grid, server_round: int = 0, timeout: Optional[float] = None) -> np.ndarray:
        """Ask, aggregate, send the projection back; ``RuntimeError`` if no valid reply came."""
        projection = self.aggregate(server_round, list(grid.send_and_receive(self.requests(grid), timeout=timeout)))
        if projection is None:
            raise RuntimeError("LDP-FPCA: no valid covariance reply; see the rejected replies in the server log")
        list(grid.send_and_receive(self.broadcast(projection, grid), timeout=timeout))
        return projection


def _matrix(content: RecordDict) -> np.ndarray:
    return next(iter(content.array_records.values()))[COVARIANCE_KEY].numpy()


__all__ = ["LdpFederatedPCA", "PCA_MESSAGE", "PROJECTION_MESSAGE"]
