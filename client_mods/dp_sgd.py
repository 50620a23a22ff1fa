r"""DP-SGD client trainer on Opacus, with the privacy accountant carried across Flower rounds.

:class:`DpSgdTrainer` trains the global model received in a round with Opacus'
DP-SGD (per-sample clipping, Gaussian noise, Poisson sampling, optional virtual
steps and per-layer clipping) and returns

(a) the new weights, under exactly the keys of the global model (no ``_module.``
    prefix, Opacus issue #435);
(b) the dp-accounting event of *this* round's release,
    ``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(z)), steps)``,
    which :func:`dp_sgd_train_reply` declares in the reply
    (:func:`flwr_dp_strategies.declarations.declare_release`) so that
    :class:`flwr_dp_strategies.strategy.AccountedFedAvg` composes it in its
    :class:`~flwr_dp_strategies.privacy.PrivacyLedger`, with the unit ``"record"`` (it bounds
    what one training example changes, not the client's whole data; so do the ``NonPrivateDpEvent``
    declarations beside it), which lets the ledger publish ``privacy/epsilon-record-level`` apart;
(c) the client's **cumulative** ε over all its rounds from Opacus' own
    accountant (metric ``dp-sgd/epsilon-opacus``), next to the ε of this round
    alone (``dp-sgd/epsilon-round-only``: what Flower's Opacus example reports,
    since it builds a fresh ``PrivacyEngine`` every round).

Why a state. In Flower simulation (and in deployment, where every message runs
in a new process) the ClientApp and everything it built are gone after each
round; only ``context.state`` (a :class:`flwr.app.RecordDict`) persists. The
trainer keeps Opacus' accountant history there (one ConfigRecord under
:data:`STATE_KEY`: the list of ``(noise_multiplier, sample_rate, steps)`` of
``RDPAccountant.history``), loads it into the round's fresh ``PrivacyEngine``
before training, and writes it back after. Without a cache key a fresh
``GradSampleModule`` is built every round from the received weights and unwrapped
with ``to_standard_module()`` afterwards, so hooks are never registered twice on
the same module (Opacus issue #608). With one (:func:`dp_sgd_train_reply` passes
the run and node id) the client's wrapped module is kept wrapped between rounds
in this process and reset as new each round (:mod:`client_mods.dp_sgd_trainer`);
either way no stale per-sample state leaks between rounds (#433).

The module is split by concept: :mod:`client_mods.dp_sgd_accounting` (the event,
its derivation and the history kept in ``context.state``), :mod:`client_mods.dp_sgd_trainer` (the
Opacus trainer) and this module (the Flower glue, :func:`dp_sgd_train_reply`; it re-exports the
public names of the other two).
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import torch
from dp_accounting.dp_event import NonPrivateDpEvent
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from flwr_dp_strategies.declarations import declare_release
from flwr_dp_strategies.privacy.validation import check_int

from .dp_sgd_accounting import (
    ACCOUNTANTS,
    STATE_KEY,
    combined_noise_multiplier,
    dp_sgd_event,
    dp_sgd_relation,
    history_delta,
    history_epsilon,
    history_record,
    load_history,
)
from .dp_sgd_trainer import (
    CLIPPING_MODES,
    DECLARATION_LABEL,
    EPSILON_METRIC,
    GRAD_SAMPLE_MODES,
    NOISE_METRIC,
    ROUND_EPSILON_METRIC,
    DataSource,
    DpSgdBudgetExhausted,
    DpSgdRound,
    DpSgdTrainer,
    as_dataset,
    choose_grad_sample_mode,
    clear_wrapped_cache,
    trainable_parameters,
)
from .reply_metrics import NON_PRIVATE_METRICS_LABEL


def dp_sgd_train_reply(
    msg: Message,
    context: Context,
    trainer: DpSgdTrainer,
    dataset: DataSource,
    *,
    arrays_key: str = "arrays",
    state_key: str = STATE_KEY,
    label: str = DECLARATION_LABEL,
    num_threads: Optional[int] = 1,
    release_metrics: bool = False,
    weighted_by_key: str = "num-examples",
    keep_wrapped: bool = True,
) -> Message:
    """The reply of a ``@app.train()`` function that trains ``msg``'s model with ``trainer``.

    The reply holds the ArrayRecord ``arrays_key`` (same keys as received), one
    MetricRecord ``"metrics"`` (:meth:`DpSgdRound.metrics`: the public weight
    ``{weighted_by_key: 1.0}``, ``dp-sgd/epsilon-opacus``, ...) and the declaration of this
    round's event (``label``) for :class:`~flwr_dp_strategies.strategy.AccountedFedAvg`. The
    accountant history is kept in ``context.state[state_key]``.
    ``num_threads``: torch threads for this client (1 suits simulated clients
    sharing a few cores; None leaves torch's setting alone).
    ``release_metrics``: also send the exact ``num-examples`` (under ``weighted_by_key``) and the
    round's ``train-loss``, un-noised, and declare them as a ``NonPrivateDpEvent`` (the client's ε
    is then ∞, the truth about sending them); default False: neither leaves the client.
    A trainer without a public ``sample_rate`` (Opacus' convention) declares a q and a step count that are
    functions of the dataset size N (``ceil(N/B)``); the reply then also declares that size as a
    ``NonPrivateDpEvent`` (label :data:`DATASET_SIZE_LABEL`: the client's ε is ∞, the truth about it) and a
    warning says so once per process. Give the trainer ``sample_rate`` to send only public values.
    ``keep_wrapped``: keep the client's wrapped model between rounds while this process lives on
    (``cache_key=(run_id, node_id)``, see :mod:`client_mods.dp_sgd_trainer`; the round is the same).
    """
    if num_threads is not None:
        torch.set_num_threads(check_int("num_threads", num_threads, minimum=1))
    arrays = msg.content.array_records.get(arrays_key)
    if arrays is None:
        raise ValueError(f"the train message has no ArrayRecord {arrays_key!r}")
    result = trainer.train_round(
        arrays,
        dataset,
        context.state,
        state_key=state_key,
        cache_key=(context.run_id, context.node_id) if keep_wrapped else None,
    )
    metrics = result.metrics(weighted_by_key)
    if release_metrics:
        metrics.update({weighted_by_key: int(result.num_examples), "train-loss": float(result.train_loss)})
    content = RecordDict(
        {
            arrays_key: ArrayRecord({k: result.state_dict[k] for k in arrays.keys()}),
            "metrics": MetricRecord(metrics),
        }
    )
    declare_release(content, result.event, label=label, neighboring_relation=result.neighboring_relation, unit="record")
    if result.reveals_dataset_size:
        _warn_dataset_size_once()
        declare_release(
            content,
            NonPrivateDpEvent(),
            label=DATASET_SIZE_LABEL,
            neighboring_relation=result.neighboring_relation,
            unit="record",
        )
    if release_metrics:
        declare_release(
            content,
            NonPrivateDpEvent(),
            label=NON_PRIVATE_METRICS_LABEL,
            neighboring_relation=result.neighboring_relation,
            unit="record",
        )
    return Message(content=content, reply_to=msg)


#: The label of the ``NonPrivateDpEvent`` a reply declares when its DP-SGD event reveals the dataset size.
DATASET_SIZE_LABEL = "dp-sgd/dataset-size (non-private: Opacus' q and steps are functions of N)"
_WARNED: set[str] = set()


def _warn_dataset_size_once() -> None:
    if "size" in _WARNED:
        return
    _WARNED.add("size")
    warnings.warn(
        "DpSgdTrainer without sample_rate: Opacus' q = 1/ceil(N/B) and its step count reveal the dataset size "
        "N under add/remove-one, so the reply declares it as non-private (epsilon = inf); give the trainer a "
        "public sample_rate",
        UserWarning,
        stacklevel=3,
    )


def declare_opacus_round(
    content: RecordDict,
    privacy_engine: Any,
    *,
    poisson_sampling: bool = True,
    label: str = "opacus dp-sgd",
    public_sample_rate: bool = False,
) -> RecordDict:
    """Declare in a reply's ``content`` the DP-SGD release an Opacus ``PrivacyEngine`` made; return ``content``.

    For ClientApps that already train with Opacus (Flower's Opacus example): the two lines that
    make :class:`~flwr_dp_strategies.strategy.AccountedFedAvg` account for them are the import
    and ``content=declare_opacus_round(RecordDict({...}), privacy_engine)``. The event is read
    from the engine's own accountant history (one ``(z, q, steps)`` entry per ``make_private``):
    ``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(z)), steps)`` per entry
    (:func:`dp_sgd_event`), declared under :func:`dp_sgd_relation` (add/remove one example for
    Opacus' default Poisson batches, ``poisson_sampling=False`` for shuffled fixed-size batches).
    The engine must be this round's (a fresh ``PrivacyEngine`` per round, as in Flower's example);
    an engine kept across rounds would declare its earlier rounds again (over-counting, never
    under-counting). Raises ``ValueError`` when the engine has no history (it has not trained).

    Opacus' ``make_private`` sets q = 1/len(loader) = 1/ceil(N/B) and ceil(N/B) steps an epoch, functions of
    the dataset size N, which add/remove-one changes: with Poisson batches the declaration then also holds a
    ``NonPrivateDpEvent`` for that size (label :data:`DATASET_SIZE_LABEL`, ε = ∞, the truth). Pass
    ``public_sample_rate=True`` only when the loader's rate is a public setting (a ``DPDataLoader`` built with
    a fixed ``sample_rate``, the step count fixed by it), as :class:`DpSgdTrainer`'s ``sample_rate`` does.
    """
    history = getattr(getattr(privacy_engine, "accountant", None), "history", None)
    if not history:
        raise ValueError(
            "privacy_engine must be an Opacus PrivacyEngine that trained this round "
            "(privacy_engine.accountant.history is empty or missing)"
        )
    entries = [(float(z), float(q), int(steps)) for z, q, steps in history]
    declare_release(
        content,
        dp_sgd_event(entries, poisson_sampling),
        label=label,
        neighboring_relation=dp_sgd_relation(poisson_sampling),
        unit="record",
    )
    if poisson_sampling and not public_sample_rate:
        declare_release(
            content,
            NonPrivateDpEvent(),
            label=DATASET_SIZE_LABEL,
            neighboring_relation=dp_sgd_relation(poisson_sampling),
            unit="record",
        )
    return content


__all__ = [
    "ACCOUNTANTS",
    "declare_opacus_round",
    "CLIPPING_MODES",
    "DATASET_SIZE_LABEL",
    "DECLARATION_LABEL",
    "DpSgdBudgetExhausted",
    "DpSgdRound",
    "DpSgdTrainer",
    "EPSILON_METRIC",
    "GRAD_SAMPLE_MODES",
    "NOISE_METRIC",
    "ROUND_EPSILON_METRIC",
    "STATE_KEY",
    "as_dataset",
    "choose_grad_sample_mode",
    "clear_wrapped_cache",
    "combined_noise_multiplier",
    "dp_sgd_event",
    "dp_sgd_relation",
    "dp_sgd_train_reply",
    "history_delta",
    "history_epsilon",
    "history_record",
    "load_history",
    "trainable_parameters",
]
