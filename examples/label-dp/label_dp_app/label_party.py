r"""The label party: randomise the train labels once (ε-label-DP), then train the top model on them.

:func:`make_label_party` is the only place that sees the true train labels: it
randomises them with k-ary randomized response
(:func:`client_mods.label_dp_data.private_labels`, kept in ``context.state``),
books the one release in a ``replace_one`` :class:`PrivacyLedger`, measures how
many labels changed, and returns a :class:`LabelParty` that holds **only** its
own copy of the noisy labels. Everything the label party sends afterwards
(gradients w.r.t. the feature parties' embeddings) is computed by
:meth:`LabelParty.step` from the noisy labels, the top model and the received
embeddings: post-processing of the randomized-response output, so the feature
parties learn only ε-label-DP information about the labels.

With mean cross-entropy over a batch of size b, the gradient sent to party p for
sample i is :math:`\frac{1}{b}(\mathrm{softmax}(z_i) - e_{\tilde y_i})^\top W_p`
(through the top model's ReLU), where :math:`\tilde y_i` is the *noisy* label.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch
from flwr.app import Context
from torch import nn

from client_mods.label_dp_data import LABEL_DP_DECLARATION, label_release_event, private_labels
from flwr_dp_strategies.privacy import PrivacyLedger, keep_probability

from . import task
from .config import label_epsilon

LABEL_PARTY = "label-party"


class LabelParty:
    """Top model + noisy train labels. It never holds the true train labels.

    Args:
        noisy_labels: the randomised train labels (int class indices); copied.
        num_parties: number of feature parties (embeddings are concatenated in party order).
        embedding_dim: width of each party's embedding.
        lr: Adam learning rate of the top model.
        seed: seed of the top model's initialisation and of the batch order.
    """

    def __init__(
        self,
        noisy_labels: np.ndarray,
        *,
        num_parties: int,
        embedding_dim: int,
        lr: float,
        seed: int,
        num_classes: int = task.NUM_CLASSES,
    ) -> None:
        self._labels = torch.as_tensor(np.array(noisy_labels, dtype=np.int64, copy=True))
        torch.manual_seed(seed)
        self.top = task.build_top(num_parties, embedding_dim, num_classes)
        self.optimizer = torch.optim.Adam(self.top.parameters(), lr=lr)
        self.num_parties = num_parties
        self._batches = np.random.default_rng(seed)
        self._order = np.zeros(0, dtype=np.int64)

    @property
    def num_train(self) -> int:
        """Number of training samples."""
        return int(self._labels.shape[0])

    @property
    def noisy_labels(self) -> np.ndarray:
        """A copy of the labels the top model trains on."""
        return self._labels.numpy().copy()

    def next_batch(self, batch_size: int) -> np.ndarray:
        """Indices of the next batch: epochs of uniform random permutations (label-independent); 0 = all."""
        if batch_size <= 0 or batch_size >= self.num_train:
            return np.arange(self.num_train, dtype=np.int64)
        while self._order.size < batch_size:
            self._order = np.concatenate([self._order, self._batches.permutation(self.num_train)])
        batch, self._order = self._order[:batch_size], self._order[batch_size:]
        return np.sort(batch)

    def step(self, embeddings: Sequence[np.ndarray], indices: np.ndarray) -> tuple[list[np.ndarray], float]:
        """One Adam step of the top model on the noisy labels of ``indices``.

        Returns the gradient of the mean cross-entropy w.r.t. each party's
        embeddings (in party order) and the loss (against the noisy labels).
        """
        inputs = [torch.tensor(e, dtype=torch.float32, requires_grad=True) for e in embeddings]
        logits = self.top(torch.cat(inputs, dim=1))
        loss = nn.functional.cross_entropy(logits, self._labels[torch.as_tensor(indices, dtype=torch.int64)])
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return [x.grad.numpy().astype(np.float32) for x in inputs], float(loss.item())  # type: ignore[union-attr]

    @torch.no_grad()
    def predict(self, embeddings: Sequence[np.ndarray]) -> np.ndarray:
        """Predicted classes from the parties' embeddings."""
        logits = self.top(torch.cat([torch.as_tensor(e, dtype=torch.float32) for e in embeddings], dim=1))
        return logits.argmax(dim=1).numpy()


@dataclass(frozen=True)
class LabelRelease:
    """What the label party released, for the results."""

    epsilon: Optional[float]  # None: no label DP
    num_labels: int
    changed_fraction: float  # measured once, at randomisation
    expected_changed_fraction: float  # (k-1)/(e^eps + k - 1)


def make_label_party(
    context: Context, config: dict[str, Any], true_train_labels: np.ndarray, ledger: PrivacyLedger
) -> tuple[LabelParty, LabelRelease]:
    """Randomise ``true_train_labels`` once, book the release, return a party holding only noisy labels.

    ``label-epsilon = inf`` trains on the true labels (no label DP, nothing booked).
    The randomisation is drawn from OS entropy unless ``rr-seed >= 0``.
    """
    eps = label_epsilon(config)
    k = task.NUM_CLASSES
    if eps is None:
        noisy, changed, expected = np.array(true_train_labels, dtype=np.int64, copy=True), 0.0, 0.0
    else:
        rng = None if int(config["rr-seed"]) < 0 else int(config["rr-seed"])
        noisy, newly_released = private_labels(context, true_train_labels, eps, k, rng)
        if newly_released:
            ledger.record(label_release_event(context), server_round=0, client=LABEL_PARTY, label=LABEL_DP_DECLARATION)
        changed = float(np.mean(noisy != true_train_labels))
        expected = 1.0 - keep_probability(eps, k)
    party = LabelParty(
        noisy,
        num_parties=int(config["num-parties"]),
        embedding_dim=int(config["embedding-dim"]),
        lr=float(config["lr"]),
        seed=int(config["seed"]),
    )
    return party, LabelRelease(eps, int(noisy.shape[0]), changed, expected)
