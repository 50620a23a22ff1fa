r"""Record-level canary audit of one training run (Steinke, Nasr & Jagielski 2023).

"Privacy Auditing with One (1) Training Run" (NeurIPS 2023): m canary records are each inserted into
a client's training data independently with probability ½; the client trains once; the auditor scores
every canary on the trained model, guesses "in" for the ``k_plus`` highest scores and "out" for the
``k_minus`` lowest (abstaining on the rest), and counts the correct guesses. If the run is ε-DP with
respect to each canary's inclusion, the number of correct guesses is stochastically dominated by
Bin(r, e^ε/(1 + e^ε)) (their Theorem 3.1; Theorem 5.2 with δ), which turns the count into a lower
bound on ε at a stated confidence (:func:`flwr_dp_strategies.privacy.analyses.audit.one_run_lower_bound`).
The bound is compared with the ε the trainer declares for the same run: a sound ledger is never
contradicted except with probability ≤ 1 − confidence; a bound above the declared ε is evidence that
the declaration (or the trainer) is wrong.

The pieces:

* :func:`make_canary_records` - m records unlike the data and easy to memorise: random Gaussian
  directions (at the data's mean row norm, or a given norm) with uniformly random labels;
* :func:`insert_canaries` - each canary in w.p. ½, returning the data and the inclusion mask. Under
  add/remove-one DP (DP-SGD) an excluded canary is omitted; under replace-one DP (the functional
  mechanism) pass ``fill_with``: an excluded canary's slot holds that fixed record, so the data size
  is n + m either way and toggling a canary replaces one record;
* :func:`score_canaries` - a score per canary, larger meaning "looks trained on": the negative loss of
  the trained model, or with ``reference`` (the received model) the decrease in loss from the received
  to the trained model. The decrease is the recommended score for federated rounds: every canary starts
  from the same received model, and subtracting each canary's loss under it removes the part of the
  score the training did not cause (a random canary that the received model happens to fit well), which
  reduces the score's variance without using anything but the two models the client already holds;
* :func:`record_audit_bound` - guesses, their count and the one-run bound, as a :class:`RecordAudit`
  beside the declared ε.

The canaries, the inclusion mask and the guesses are the auditor's; nothing here changes a trainer's
mechanism or its declared events (the canaries are records of the client's data like any other).

The two record-level trainers:

* :class:`client_mods.DpSgdTrainer` (add/remove-one): insert without ``fill_with``, train one round on
  the result, score the returned weights against the received ones, and audit at the round's δ beside
  ``DpSgdRound.epsilon`` (the client's cumulative ε, Opacus' accountant at ``target_delta``; after
  several rounds audit the last model against the cumulative ε).
* :class:`client_mods.FunctionalMechanismTrainer` (replace-one, pure ε with Laplace noise): canaries
  with ``input_norm=1`` (rows are clipped to unit norm), ``fill_with=(zeros, 0)`` (a zero row adds
  nothing to A = Σ x rᵀ or S = Σ x xᵀ: the canary's influence is exactly its term in the objective),
  score the returned head (``loss`` as the trainer's), audit at δ = 0 beside the declared ε. A linear
  head can fit a canary only where the canary's direction is not already spanned by the data and the
  other canaries: the audit has power when the feature dimension q is large against m and the head
  is descended close to the noisy objective's minimiser; with a small q (e.g. a 10-dimensional PCA
  map) the bound stays near 0 whatever the noise, which is a weak audit, not evidence of privacy.

A bound is a lower bound: 0 means the audit rejected nothing, never that the run is private.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from flwr_dp_strategies.privacy.analyses.audit import one_run_lower_bound
from flwr_dp_strategies.privacy.validation import check_int

__all__ = [
    "CanaryRecords",
    "RecordAudit",
    "insert_canaries",
    "make_canary_records",
    "record_audit_bound",
    "score_canaries",
]


@dataclass(frozen=True)
class CanaryRecords:
    """m canary records: ``inputs`` (m, ...) float32 and ``labels`` (m,) int64, as numpy arrays."""

    inputs: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass(frozen=True)
class RecordAudit:
    """The outcome of one one-run audit.

    Attributes:
        epsilon_lower_bound: ε below which the run is rejected as ε-DP (δ = ``delta``) at ``confidence``
            (Steinke et al. 2023, Thm. 3.1 / 5.2); 0 when nothing is rejected, inf when every ε is.
        guesses_made: r = ``k_plus + k_minus`` (the auditor abstains on the other m − r canaries).
        guesses_correct: v, guesses that match the inclusion mask.
        num_canaries: m.
        k_plus, k_minus: "in" guesses (top scores) and "out" guesses (bottom scores).
        confidence, delta: of the bound.
        declared_epsilon: the ε the trainer declared for the same run (at the same δ), or None.
    """

    epsilon_lower_bound: float
    guesses_made: int
    guesses_correct: int
    num_canaries: int
    k_plus: int
    k_minus: int
    confidence: float
    delta: float
    declared_epsilon: Optional[float] = None

    @property
    def contradicts_declaration(self) -> bool:
        """True when the bound exceeds the declared ε (False when none was declared)."""
        return self.declared_epsilon is not None and self.epsilon_lower_bound > self.declared_epsilon


# ---------------------------------------------------------------------- helpers
def _generator(seed: Optional[int], name: str = "seed") -> np.random.Generator:
    """A numpy Generator: seeded for tests, else from OS entropy."""
    if seed is None:
        return np.random.default_rng(secrets.randbits(128))
    return np.random.default_rng(check_int(name, seed, minimum=0))


def _is_torch(value: Any) -> bool:
    return type(value).__module__.split(".")[0] == "torch"


def _to_numpy(value: Any) -> np.ndarray:
    if _is_torch(value):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _xy(data: Any, name: str) -> tuple[Any, Any]:
    """(inputs, labels) of an ``(x, y)`` pair or a sized torch Dataset of (input, target) pairs."""
    if isinstance(data, tuple) and len(data) == 2:
        x, y = data
        if len(x) != len(y):
            raise ValueError(f"{name} inputs and labels must have the same length, got {len(x)} and {len(y)}")
        return x, y
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        if len(data) < 1:
            raise ValueError(f"{name} must hold at least 1 record")
        items = [data[i] for i in range(len(data))]
        if not all(isinstance(it, (tuple, list)) and len(it) == 2 for it in items):
            raise ValueError(f"{name} must yield (input, target) pairs")
        x = np.stack([_to_numpy(it[0]) for it in items])
        y = np.asarray([int(_to_numpy(it[1])) for it in items])
        return x, y
    raise ValueError(f"{name} must be an (x, y) pair of arrays or a sized Dataset of (input, target) pairs")


# ---------------------------------------------------------------------- canaries
def make_canary_records(
    num_canaries: int,
    like: Any,
    seed: Optional[int] = None,
    *,
    num_classes: Optional[int] = None,
    input_norm: Optional[float] = None,
) -> CanaryRecords:
    """``num_canaries`` records shaped like ``like``'s inputs: random directions with random labels.

    Each input is an i.i.d. standard Gaussian vector rescaled to L2 norm ``input_norm`` (default: the
    mean row norm of ``like``'s inputs); each label is uniform over ``[0, num_classes)`` (default:
    ``max(label) + 1`` of ``like``). Random directions in a space of moderate dimension are nearly
    orthogonal to the data and to each other, and a random label is one the data does not teach, so a
    canary the model was trained on is fit far better than one it was not (Steinke et al. 2023, §6:
    input-space canaries; Carlini et al. 2019 for random-label canaries). Use ``input_norm=1`` for
    trainers that clip rows to unit norm (the functional mechanism).

    Args:
        num_canaries: m ≥ 1.
        like: an ``(x, y)`` pair (numpy or torch) or a sized Dataset of (input, target) pairs, with
            integer labels.
        seed: an int for reproducible canaries; None draws from OS entropy.
        num_classes: labels are drawn from ``[0, num_classes)``; ≥ 2.
        input_norm: the L2 norm of every canary input, > 0.
    Raises:
        ValueError naming the argument.
    """
    m = check_int("num_canaries", num_canaries, minimum=1)
    x, y = _xy(like, "like")
    x, y = _to_numpy(x), _to_numpy(y)
    if x.shape[0] < 1:
        raise ValueError("like must hold at least 1 record")
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"like must have 1-D integer labels, got dtype {y.dtype} shape {y.shape}")
    classes = int(y.max()) + 1 if num_classes is None else check_int("num_classes", num_classes, minimum=2)
    if classes < 2:
        raise ValueError(f"num_classes must be at least 2, got {classes} (inferred from like's labels)")
    rows = x.reshape(x.shape[0], -1).astype(np.float64)
    if input_norm is None:
        norm = float(np.mean(np.linalg.norm(rows, axis=1)))
        if not np.isfinite(norm) or norm <= 0:
            raise ValueError("input_norm must be given when like's inputs have no positive finite mean norm")
    else:
        norm = float(input_norm)
        if not np.isfinite(norm) or norm <= 0:
            raise ValueError(f"input_norm must be in (0, inf), got {input_norm!r}")
    rng = _generator(seed)
    z = rng.standard_normal((m, rows.shape[1]))
    z *= norm / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-300)
    labels = rng.integers(0, classes, size=m, dtype=np.int64)
    return CanaryRecords(z.reshape((m,) + x.shape[1:]).astype(np.float32), labels)


def _as_canaries(canaries: Any) -> CanaryRecords:
    if isinstance(canaries, CanaryRecords):
        return canaries
    x, y = _xy(canaries, "canaries")
    return CanaryRecords(np.asarray(_to_numpy(x), dtype=np.float32), np.asarray(_to_numpy(y), dtype=np.int64))


def insert_canaries(
    data: Any, canaries: Any, seed: Optional[int] = None, *, fill_with: Optional[tuple[Any, Any]] = None
) -> tuple[Any, np.ndarray]:
    """The data with each canary included independently with probability ½, and the inclusion mask.

    The included canaries are appended after the data, in canary order (DP-SGD's Poisson sampling and
    the functional mechanism's sums do not depend on order). With ``fill_with=(x0, y0)`` every excluded
    canary is replaced by that fixed record instead of being omitted, so the result always holds
    n + m records and including canary i replaces one record: use it when the trainer is DP under
    replace-one (:class:`client_mods.FunctionalMechanismTrainer`, which also refuses a data size that
    depends on the canaries); without it including a canary adds one record (add/remove-one, DP-SGD).
    Either way the mask is the S ∈ {in, out}^m of Steinke et al. 2023 (§3), drawn uniformly.

    Args:
        data: an ``(x, y)`` pair (numpy arrays or torch tensors: the result is the same kind) or a
            torch Dataset (the result is a ``ConcatDataset`` with a ``TensorDataset`` of the canaries).
        canaries: :class:`CanaryRecords` or an ``(x, y)`` pair.
        seed: an int for a reproducible mask; None draws from OS entropy.
        fill_with: None, or one ``(input, label)`` record standing in for an excluded canary.
    Returns:
        ``(data_with_inserted, inserted_mask)``, the mask a boolean array of length m.
    Raises:
        ValueError naming the argument.
    """
    can = _as_canaries(canaries)
    m = len(can)
    if m < 1:
        raise ValueError("canaries must hold at least 1 record")
    mask = _generator(seed).random(m) < 0.5
    if fill_with is None:
        extra_x, extra_y = can.inputs[mask], can.labels[mask]
    else:
        if not (isinstance(fill_with, tuple) and len(fill_with) == 2):
            raise ValueError("fill_with must be None or one (input, label) pair")
        fx = np.asarray(_to_numpy(fill_with[0]), dtype=np.float32)
        if fx.shape != can.inputs.shape[1:]:
            raise ValueError(f"fill_with's input must have the canaries' shape {can.inputs.shape[1:]}, got {fx.shape}")
        extra_x = np.where(mask.reshape((m,) + (1,) * (can.inputs.ndim - 1)), can.inputs, fx[None])
        extra_y = np.where(mask, can.labels, np.int64(int(_to_numpy(fill_with[1]))))
    if isinstance(data, tuple) and len(data) == 2:
        x, y = _xy(data, "data")
        if tuple(x.shape[1:]) != tuple(can.inputs.shape[1:]):
            raise ValueError(f"canaries must have data's input shape {tuple(x.shape[1:])}, got {can.inputs.shape[1:]}")
        if _is_torch(x):
            import torch

            new_x = torch.cat([x, torch.as_tensor(extra_x, dtype=x.dtype, device=x.device)])
            new_y = torch.cat([y, torch.as_tensor(extra_y, dtype=y.dtype, device=y.device)])
        else:
            new_x = np.concatenate([np.asarray(x), extra_x.astype(np.asarray(x).dtype, copy=False)])
            new_y = np.concatenate([np.asarray(y), extra_y.astype(np.asarray(y).dtype, copy=False)])
        return (new_x, new_y), mask
    try:
        import torch
        from torch.utils.data import ConcatDataset, Dataset, TensorDataset
    except ImportError as err:  # pragma: no cover - torch is a dependency of the Dataset form only
        raise ValueError("data must be an (x, y) pair when torch is not installed") from err
    if not isinstance(data, Dataset) or not hasattr(data, "__len__"):
        raise ValueError("data must be an (x, y) pair of arrays or a sized torch Dataset of (input, target) pairs")
    extra = TensorDataset(torch.as_tensor(extra_x), torch.as_tensor(extra_y))
    return ConcatDataset([data, extra]), mask


# ---------------------------------------------------------------------- scores
def _losses(model_or_params: Any, can: CanaryRecords, criterion: Any, loss: str) -> np.ndarray:
    """Per-canary loss of a torch module (``criterion`` with ``reduction="none"``) or a linear head."""
    if _is_torch(model_or_params) and hasattr(model_or_params, "forward"):
        import torch
        from torch import nn

        module = model_or_params
        crit = criterion if criterion is not None else nn.CrossEntropyLoss(reduction="none")
        if getattr(crit, "reduction", "none") != "none":
            raise ValueError(f"criterion.reduction must be 'none' (one loss per canary), got {crit.reduction!r}")
        params = list(module.parameters())
        device = params[0].device if params else torch.device("cpu")
        was_training = module.training
        module.eval()
        try:
            with torch.no_grad():
                out = crit(
                    module(torch.as_tensor(can.inputs, device=device)), torch.as_tensor(can.labels, device=device)
                )
        finally:
            module.train(was_training)
        values = out.detach().cpu().numpy().astype(np.float64)
    else:
        w = np.asarray(_to_numpy(model_or_params), dtype=np.float64)
        x = can.inputs.reshape(len(can), -1).astype(np.float64)
        if w.ndim != 2 or w.shape[0] != x.shape[1]:
            raise ValueError(
                f"model_or_params must be a torch module or a head of shape ({x.shape[1]}, c), got shape {w.shape}"
            )
        if loss not in ("softmax", "logistic"):
            raise ValueError(f"loss must be 'softmax' or 'logistic', got {loss!r}")
        logits = x @ w
        if loss == "logistic":
            if w.shape[1] != 1:
                raise ValueError(f"loss='logistic' needs a head of shape ({x.shape[1]}, 1), got {w.shape}")
            sign = np.where(can.labels == 1, 1.0, -1.0)
            values = np.logaddexp(0.0, -sign * logits[:, 0])
        else:
            if np.any(can.labels >= w.shape[1]) or np.any(can.labels < 0):
                raise ValueError(f"canary labels must be in [0, {w.shape[1]}) for this head")
            top = logits.max(axis=1, keepdims=True)
            lse = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
            values = lse - logits[np.arange(len(can)), can.labels]
    if values.shape != (len(can),):
        raise ValueError(f"the loss must give one value per canary ({len(can)}), got shape {values.shape}")
    return values


def score_canaries(
    model_or_params: Any, canaries: Any, *, reference: Any = None, criterion: Any = None, loss: str = "softmax"
) -> np.ndarray:
    """One score per canary, larger meaning "the model was trained on it" (float64, length m).

    Without ``reference``: −loss of the trained model on the canary. With ``reference`` (the model the
    client received, same kind): loss(reference) − loss(trained), the decrease in loss that training
    caused (see the module docstring for why it is the better score in a federated round). Either is a
    function of the released model only, so the one-run bound applies to it unchanged (Steinke et al.
    2023: any score the auditor computes from the output).

    Args:
        model_or_params: a torch ``nn.Module`` (its per-example loss is ``criterion``, default
            ``nn.CrossEntropyLoss(reduction="none")``), or a linear head W of shape (q, c) (numpy or
            torch; logits x·W on the flattened canary inputs) with ``loss="softmax"`` (cross-entropy)
            or shape (q, 1) with ``loss="logistic"`` (labels in {0, 1}).
        canaries: :class:`CanaryRecords` or an ``(x, y)`` pair.
        reference: None, or the received model / head (same kind as ``model_or_params``).
        criterion: a per-example loss (``reduction="none"``) for torch modules.
        loss: ``"softmax"`` or ``"logistic"``, for heads.
    Raises:
        ValueError naming the argument.
    """
    can = _as_canaries(canaries)
    after = _losses(model_or_params, can, criterion, loss)
    if reference is None:
        return -after
    return _losses(reference, can, criterion, loss) - after


# ---------------------------------------------------------------------- the bound
def record_audit_bound(
    scores: Any,
    inserted_mask: Any,
    k_plus: int,
    k_minus: int,
    confidence: float = 0.95,
    delta: float = 0.0,
    declared_epsilon: Optional[float] = None,
) -> RecordAudit:
    """Guess "in" for the ``k_plus`` highest scores and "out" for the ``k_minus`` lowest; bound ε.

    Ties are broken by canary index (a stable sort), never by the mask. The guesses depend on the
    scores only, and k_plus, k_minus must be fixed before the scores are seen for the stated
    confidence to hold (Steinke et al. 2023, Alg. 1). Compare with the declared ε at the same δ: a
    trainer that declares (ε, δ) is audited with ``delta=δ``; ``delta=0`` tests pure ε-DP.

    Args:
        scores: m finite scores (larger: "in").
        inserted_mask: m booleans, the inclusion mask of :func:`insert_canaries`.
        k_plus, k_minus: integers ≥ 0 with k_plus + k_minus ≤ m.
        confidence: in (0, 1). delta: in [0, 1).
        declared_epsilon: None or the trainer's declared ε ≥ 0 (reported beside the bound).
    Returns:
        a :class:`RecordAudit`.
    Raises:
        ValueError naming the argument.
    """
    s = np.asarray(_to_numpy(scores), dtype=np.float64)
    if s.ndim != 1 or s.size < 1:
        raise ValueError(f"scores must be a non-empty 1-D array, got shape {s.shape}")
    if not np.all(np.isfinite(s)):
        raise ValueError("scores must be finite")
    mask = np.asarray(_to_numpy(inserted_mask))
    if mask.shape != s.shape or mask.dtype != np.bool_:
        raise ValueError(
            f"inserted_mask must be a boolean array of the scores' shape {s.shape}, "
            f"got dtype {mask.dtype} shape {mask.shape}"
        )
    m = int(s.size)
    kp = check_int("k_plus", k_plus, minimum=0)
    km = check_int("k_minus", k_minus, minimum=0)
    if kp + km > m:
        raise ValueError(f"k_plus + k_minus must be at most num_canaries={m}, got {kp} + {km}")
    if declared_epsilon is not None:
        declared = float(declared_epsilon)
        if not declared >= 0:
            raise ValueError(f"declared_epsilon must be None or in [0, inf], got {declared_epsilon!r}")
    else:
        declared = None
    order = np.argsort(-s, kind="stable")  # highest first, ties by index
    guessed_in, guessed_out = order[:kp], order[m - km :] if km else order[:0]
    correct = int(mask[guessed_in].sum()) + int((~mask[guessed_out]).sum())
    bound = one_run_lower_bound(correct, kp + km, m, delta=delta, confidence=confidence)
    return RecordAudit(
        epsilon_lower_bound=float(bound),
        guesses_made=kp + km,
        guesses_correct=correct,
        num_canaries=m,
        k_plus=kp,
        k_minus=km,
        confidence=float(confidence),
        delta=float(delta),
        declared_epsilon=declared,
    )
