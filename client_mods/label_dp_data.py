r"""Randomise a client's labels ONCE and keep them: a dataset wrapper and Flower helpers.

Label DP (:class:`client_mods.label_dp.LabelDp`) protects each label by releasing
a randomised copy of it. Randomising the *same* label again (every epoch, every
round, every rebuilt ClientApp) is a new release: k releases of one label are
k·ε-label-DP at best, and averaging them undoes the protection. So the labels are
randomised exactly once and the randomised copy is reused for all training.

* :class:`LabelDpDataset` wraps a torch ``Dataset`` of ``(x, y)`` items, or
  ``(X, y)`` arrays, and randomises all labels once, at construction; its
  items are ``(x, noisy_y)``. The true labels are not kept. Build it once per
  process (and not once per epoch).
* :func:`private_labels` is for Flower ClientApps (and ServerApps): a ClientApp
  is rebuilt for every message in simulation and deployment, so the randomised
  labels live in ``context.state`` (which Flower persists per node across
  messages and rounds), in an :class:`~flwr.app.ArrayRecord` under
  ``"<key>.labels"`` plus a :class:`~flwr.app.ConfigRecord` ``"<key>.meta"``
  (ε, k, number of labels, a SHA-256 of the true labels to detect a changed
  dataset, and whether the release was already declared). The first call
  randomises and returns ``newly_released=True``; later calls return the stored
  labels. ``context.state`` is local to the node and never sent.
* :func:`declare_label_release` adds the release to a reply **once**
  (``declare_release(content, rr_event(ε, k), label="label-dp/randomized-response")``)
  and marks it declared in ``context.state``.

Ledger entry. The server (:class:`flwr_dp_strategies.strategy.AccountedFedAvg`)
books the declaration once, under the replying node id, in the round it arrives:
event ``rr_event(ε, k)`` = ``RandomizedResponseDpEvent(noise_parameter=k/(e^ε+k−1),
num_buckets=k)``. Its ledger must use ``neighboring_relation="replace_one"``
(randomized response is only defined under replacement; the default
``add_or_remove_one`` ledger rejects the declaration). The ε it reports for that
node is **label-level**: the privacy of each single label of the node against
replacement of that label, not of the node's whole dataset, and the features
are not protected. The declaration's unit is therefore ``"record"`` (one label is one record's; a client
holds many), never ``"client"``: in ``privacy/epsilon-record-level`` it bounds the label of one record,
the features being public as label DP assumes. Everything the client computes from the noisy labels later
(model updates in every round) is post-processing and costs nothing more.

Caveat: the declaration is marked as made when it is attached to a reply; call
:func:`declare_label_release` last, just before returning the reply. If that
reply is lost, the server never books the release (the client under-declares,
which only understates *its own* privacy loss).

Example (a horizontal-FL ClientApp)::

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        x, y = load_partition(...)
        y_noisy, _ = private_labels(context, y, eps=2.0, num_classes=10)
        ...train on (x, y_noisy)...
        content = RecordDict({"arrays": ..., "metrics": ...})
        declare_label_release(context, content)     # only the first reply carries it
        return Message(content=content, reply_to=msg)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence, Sized
from typing import Any, Optional, TypeVar, Union, cast

import numpy as np
import torch
from dp_accounting import dp_event
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, RecordDict
from torch.utils.data import Dataset, TensorDataset

from flwr_dp_strategies._deprecation import resolve_moved
from flwr_dp_strategies.declarations import declare_release, read_declarations
from flwr_dp_strategies.privacy import rr_event
from flwr_dp_strategies.privacy.rng import RngLike, resolve_rng
from flwr_dp_strategies.privacy.validation import check_epsilon, check_int

from .label_dp import like, randomize, to_numpy, validated_indices

LabelsT = TypeVar("LabelsT")

POST_PROCESSING_DECLARATION = "label-dp/post-processing"
LABEL_DP_DECLARATION = "label-dp/randomized-response"
DEFAULT_STATE_KEY = "label-dp"
LABELS_FIELD = "noisy-labels"


# ---------------------------------------------------------------------------- dataset wrapper
def _dataset_labels(dataset: Dataset) -> np.ndarray:
    """All labels of a ``(x, y)`` dataset: its ``targets`` (or a TensorDataset's second tensor), else one pass."""
    targets = getattr(dataset, "targets", None)
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) >= 2:
        targets = dataset.tensors[1]
    if targets is not None:
        return to_numpy(targets)
    n = len(cast(Sized, dataset))
    return np.stack([to_numpy(dataset[i][1]) for i in range(n)]) if n else np.zeros(0, dtype=np.int64)


class LabelDpDataset(Dataset):
    r"""A dataset whose labels were randomised once with ε-label-DP randomized response.

    Args:
        data: a torch ``Dataset`` whose items are ``(x, y)`` (its ``targets``
            attribute is used when present, otherwise the labels are read in one
            pass), or a pair ``(X, y)`` of arrays/tensors with ``len(X) == len(y)``.
        eps: ε in ``(0, inf)``.
        num_classes: k ≥ 2 (integer labels in ``[0, k)``, or one-hot with k columns).
        rng: ``None`` (OS entropy, default), an ``int`` seed or a numpy Generator.

    Items are ``(x, noisy_y)``, with ``noisy_y`` a tensor of the labels' dtype.
    :attr:`labels` holds all randomised labels; :attr:`event` is the DpEvent of
    one label's release (``rr_event(eps, k)``, relation ``replace_one``).
    Build it once: a new instance is a new release of the same labels.
    """

    def __init__(
        self,
        data: Union[Dataset, Sequence[Any]],
        eps: float,
        num_classes: int,
        rng: RngLike = None,
    ) -> None:
        self.epsilon = check_epsilon(eps, "eps")
        self.num_classes = check_int("num_classes", num_classes, minimum=2)
        self._features, true_labels = self._split(data)
        noisy, k = randomize(true_labels, self.epsilon, self.num_classes, resolve_rng(rng))
        self.labels: torch.Tensor = torch.as_tensor(like(noisy, true_labels))
        self.event: dp_event.RandomizedResponseDpEvent = rr_event(self.epsilon, k)

    @staticmethod
    def _split(data: Union[Dataset, Sequence[Any]]) -> tuple[Any, np.ndarray]:
        """(features source, true labels as numpy)."""
        if isinstance(data, (tuple, list)) and len(data) == 2 and not isinstance(data, Dataset):
            features, labels = data
            features = torch.as_tensor(to_numpy(features)) if not isinstance(features, torch.Tensor) else features
            labels_np = to_numpy(labels)
            if len(features) != len(labels_np):
                raise ValueError(f"data: X and y must have the same length, got {len(features)} and {len(labels_np)}")
            return features, labels_np
        if isinstance(data, Dataset):
            return data, _dataset_labels(data)
        raise ValueError(f"data must be a torch Dataset of (x, y) items or an (X, y) pair, got {type(data).__name__}")

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __getitem__(self, index: int) -> tuple[Any, torch.Tensor]:
        if isinstance(self._features, torch.Tensor):
            return self._features[index], self.labels[index]
        return self._features[index][0], self.labels[index]


# ---------------------------------------------------------------------------- Flower helpers
def _keys(key: str) -> tuple[str, str]:
    return f"{key}.labels", f"{key}.meta"


def _fingerprint(indices: np.ndarray, shape: tuple[int, ...]) -> str:
    """SHA-256 of the validated class indices and the shape (kept only in the node-local state)."""
    digest = hashlib.sha256(repr(tuple(shape)).encode())
    digest.update(np.ascontiguousarray(indices, dtype=np.int64).tobytes())
    return digest.hexdigest()


def _check_stored(meta: ConfigRecord, eps: float, k: int, fingerprint: str) -> None:
    if float(meta["epsilon"]) != eps or int(meta["num-classes"]) != k:
        raise ValueError(
            f"eps={eps}, num_classes={k} differ from the stored label release (eps={meta['epsilon']}, "
            f"num_classes={meta['num-classes']}); randomising the labels again would be a second release"
        )
    if meta["labels-sha256"] != fingerprint:
        raise ValueError(
            "labels differ from those randomised earlier on this node; randomising new labels is a "
            "new release: use another state key for another dataset"
        )


def private_labels(
    context: Context,
    labels: LabelsT,
    eps: float,
    num_classes: Optional[int] = None,
    rng: RngLike = None,
    *,
    key: str = DEFAULT_STATE_KEY,
) -> tuple[LabelsT, bool]:
    """Randomised ``labels`` (same type, dtype, device, shape), randomised once per node and kept.

    The first call randomises with :class:`~client_mods.label_dp.LabelDp` rules
    (binary / k-ary / one-hot) and stores the result in ``context.state``; every
    later call (another round, a rebuilt ClientApp) returns the stored labels.

    Returns:
        ``(noisy_labels, newly_released)``: ``newly_released`` is True only on the
        call that randomised.

    Raises:
        ValueError: bad ``eps``/``num_classes``/labels, or a later call whose
            ``eps``, ``num_classes`` or labels differ from the stored release.
    """
    epsilon = check_epsilon(eps, "eps")
    k_given = None if num_classes is None else check_int("num_classes", num_classes, minimum=2)
    arr = to_numpy(labels)
    indices, _, k = validated_indices(arr, k_given)
    fingerprint = _fingerprint(indices, arr.shape)
    labels_key, meta_key = _keys(key)
    meta = context.state.config_records.get(meta_key)
    if meta is not None and labels_key in context.state.array_records:
        _check_stored(meta, epsilon, k, fingerprint)
        return like(context.state.array_records[labels_key][LABELS_FIELD].numpy(), labels), False
    noisy, _ = randomize(arr, epsilon, k_given, resolve_rng(rng))
    out = like(noisy, labels)
    context.state[labels_key] = ArrayRecord({LABELS_FIELD: Array(np.ascontiguousarray(to_numpy(out)))})
    context.state[meta_key] = ConfigRecord(
        {
            "epsilon": epsilon,
            "num-classes": k,
            "num-labels": int(arr.shape[0]),
            "labels-sha256": fingerprint,
            "declared": False,
        }
    )
    return out, True


def label_release_event(
    context: Context, *, key: str = DEFAULT_STATE_KEY
) -> Optional[dp_event.RandomizedResponseDpEvent]:
    """``rr_event(eps, k)`` of the release stored in ``context.state`` (None if there is none)."""
    meta = context.state.config_records.get(_keys(key)[1])
    if meta is None:
        return None
    return rr_event(float(meta["epsilon"]), int(meta["num-classes"]))


def declare_label_release(context: Context, content: RecordDict, *, key: str = DEFAULT_STATE_KEY) -> bool:
    """Declare the stored label release in the reply ``content`` if not yet declared; True if it did.

    Adds ``rr_event(eps, k)`` with label :data:`LABEL_DP_DECLARATION` via
    :func:`flwr_dp_strategies.declarations.declare_release` and marks it declared
    in ``context.state``, so exactly one reply per node carries it. Later replies
    declare a ``NoOpDpEvent`` ("post-processing of an already declared release"):
    an accounting strategy books a train reply that declares nothing as non-private.

    Raises:
        ValueError: no label release in ``context.state`` (call :func:`private_labels` first).
    """
    meta = context.state.config_records.get(_keys(key)[1])
    if meta is None:
        raise ValueError(f"no label release under key={key!r} in context.state: call private_labels first")
    if bool(meta["declared"]):
        if not any(d.label.startswith("label-dp/") for d in read_declarations(content)):
            declare_release(
                content,
                dp_event.NoOpDpEvent(),
                label=POST_PROCESSING_DECLARATION,
                neighboring_relation="replace_one",
                unit="record",
            )
        return False
    declare_release(
        content,
        rr_event(float(meta["epsilon"]), int(meta["num-classes"])),
        label=LABEL_DP_DECLARATION,
        neighboring_relation="replace_one",
        unit="record",
    )
    meta["declared"] = True
    return True


def is_label_release_declared(context: Context, *, key: str = DEFAULT_STATE_KEY) -> bool:
    """Whether the stored label release was already declared in a reply."""
    meta = context.state.config_records.get(_keys(key)[1])
    return bool(meta is not None and meta["declared"])


def __getattr__(name: str):
    """``LabelDPDataset``, the former spelling of :class:`LabelDpDataset`: still resolves, with a DeprecationWarning."""
    return resolve_moved(__name__, name, {"LabelDPDataset": "client_mods:LabelDpDataset"})


__all__ = [
    "DEFAULT_STATE_KEY",
    "LABEL_DP_DECLARATION",
    "LabelDpDataset",
    "declare_label_release",
    "is_label_release_declared",
    "label_release_event",
    "private_labels",
]
