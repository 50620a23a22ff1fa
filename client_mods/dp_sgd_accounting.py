r"""Accounting of DP-SGD on Opacus: the DpEvent a client declares, and the history kept across rounds.

Guarantee (record level). For a client holding a dataset :math:`D` of size
:math:`N`, neighbouring datasets differ by adding or removing one example
(``add_or_remove_one``), and the dataset size :math:`N` is treated as public
(it sets the sampling rate and is sent as ``num-examples``, as in every DP-SGD
accounting). Everything the client sends over all rounds -- the weights of every
round, the ε metrics (functions of :math:`z, q, T` only) and the declarations --
is :math:`(\varepsilon, \delta)`-DP with the ε reported at ``target_delta``:

* Step. Each logical batch :math:`B_t` is Poisson-sampled, every example in it
  independently with probability :math:`q`. Per-sample gradients are clipped,
  :math:`\bar g_i = g_i \min(1, C/\lVert g_i\rVert_2)`, and Opacus computes
  :math:`S_t = \sum_{i \in B_t} \bar g_i + \mathcal N(0, \sigma^2 I)` with
  :math:`\sigma = z C`; the update
  :math:`\theta_{t+1} = \theta_t - \eta S_t / \lfloor qN \rfloor` is
  post-processing. Adding or removing one example moves :math:`\sum \bar g_i`
  by at most :math:`C`, so each step is the Sampled Gaussian Mechanism
  SGM(:math:`q, z`) (Abadi et al. 2016).
* RDP of one step (Mironov, Talwar & Zhang 2019). With
  :math:`\mu_0 = \mathcal N(0, z^2)`, :math:`\mu_1 = \mathcal N(1, z^2)`,
  :math:`\varepsilon_{\mathrm{SGM}}(\alpha) = \frac{1}{\alpha-1}\log
  \mathbb E_{x\sim\mu_0}\big[(1-q+q\,\mu_1(x)/\mu_0(x))^{\alpha}\big]`, which for
  integer :math:`\alpha` is
  :math:`\frac{1}{\alpha-1}\log\sum_{k=0}^{\alpha}\binom{\alpha}{k}(1-q)^{\alpha-k}
  q^k e^{(k^2-k)/(2z^2)}`; both Opacus and dp-accounting evaluate it numerically
  for fractional orders too.
* Composition (Mironov 2017, Prop. 1). RDP adds up over the :math:`T` steps of a
  round and over the rounds :math:`r = 1..R` (adaptively: the global model a
  round starts from is a function of earlier releases and of other clients'
  data, which are not the neighbouring dimension):
  :math:`\varepsilon(\alpha) = \sum_r T_r\,\varepsilon_{\mathrm{SGM}}(q_r, z_r, \alpha)`.
* Conversion (Balle et al. 2020, Thm. 21, used by both Opacus and dp-accounting):
  :math:`\varepsilon = \min_\alpha \varepsilon(\alpha) + \log\frac{\alpha-1}{\alpha}
  - \frac{\log\delta + \log\alpha}{\alpha-1}`.

Opacus' conventions, declared as they are: :math:`q = 1/\lceil N/B\rceil`
(:math:`= B/N` when the batch size :math:`B` divides :math:`N`) and
:math:`T = \lceil N/B\rceil` steps per epoch; an empty Poisson batch is still a
step (pure noise) and is counted. The declared event uses the :math:`(z, q, T)`
read back from Opacus' accountant history, so the server ledger composes exactly
what Opacus accounted: the ledger's RDP ε equals Opacus' up to the grid of RDP
orders (dp-accounting adds 11, 128, ..., 1024 and drops the fractional orders
whose series does not converge) and the numerics of fractional orders -- within
0.1 % in the tests and the example -- and the ledger may report a lower ε still
through its PLD accountant (10-15 % lower in the example).

Per-layer clipping (``clipping="per_layer"``). Parameter tensor :math:`m` is
clipped to :math:`C_m`; then :math:`\lVert \bar g_i \rVert_2 \le
C := \lVert (C_1..C_M) \rVert_2`. Opacus adds noise of std
:math:`\sigma_m = z C` to every tensor. In the grouped form of McMahan et al.
2018 (per-group multipliers :math:`z_m = \sigma_m / C_m`), the combined
multiplier is :math:`z^* = (\sum_m z_m^{-2})^{-1/2} = (\sum_m C_m^2/\sigma_m^2)^{-1/2}
= zC/C = z` (:func:`combined_noise_multiplier`): per-layer clipping is accounted as
flat clipping with bound :math:`C`, and the trainer checks :math:`z^* = z` on the
optimizer Opacus built before declaring the event. A single number for
``max_grad_norm`` with per-layer clipping is split evenly,
:math:`C_m = C/\sqrt M`, so that the total bound stays :math:`C`.

``poisson_sampling=False`` (shuffled fixed-size batches). Opacus' own ε then
assumes Poisson sampling, a heuristic that can under-state ε (Chua et al. 2024),
so the trainer does not declare that. It declares what was done: a shuffled
epoch puts each record in exactly one batch, so replacing one record changes one
step per epoch, whose clipped-gradient sum moves by at most 2C against noise zC;
no amplification by sampling is claimed. The declared event is
``SelfComposedDpEvent(GaussianDpEvent(z/2), epochs)`` under ``replace_one``
(epochs = ⌈steps / ⌈1/q⌉⌉ passes per history entry; at z = 1, q = 0.01, 500
steps: ε = 11.48 at δ = 1e-5 where the Poisson event claimed 1.33). An
add/remove ledger refuses it (a fixed-size shuffled loader has no add/remove
analysis): book it in a ``replace_one`` ledger. The training loss is returned to the caller but
never put in the reply (it is not privatised). Without ``secure_mode`` the noise
comes from torch's PRNG (seeded from OS entropy, or from ``seed`` for tests), which
is neither cryptographically secure nor protected against floating-point attacks.

References: Abadi et al., "Deep Learning with Differential Privacy", CCS 2016;
Mironov, "Rényi Differential Privacy", CSF 2017; Mironov, Talwar & Zhang, "Rényi
Differential Privacy of the Sampled Gaussian Mechanism", arXiv:1908.10530, 2019;
Balle et al., "Hypothesis Testing Interpretations and Rényi Differential Privacy",
AISTATS 2020; McMahan et al., "A General Approach to Adding Differential Privacy
to Iterative Training Procedures", arXiv:1812.06210, 2018; Yousefpour et al.,
"Opacus: User-Friendly Differential Privacy Library in PyTorch",
arXiv:2109.12298, 2021; Li et al., "Large Language Models Can Be Strong
Differentially Private Learners" (ghost clipping), ICLR 2022; Chua et al., "How
Private are DP-SGD Implementations?", ICML 2024.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Optional

import numpy as np
from dp_accounting import dp_event
from flwr.app import ConfigRecord, RecordDict

from flwr_dp_strategies.privacy._logging import no_new_root_handlers

# Opacus calls logging.basicConfig() on import: its root handler would print every Flower line twice.
with no_new_root_handlers():
    from opacus.accountants import RDPAccountant, create_accountant
    from opacus.accountants.analysis import rdp as rdp_analysis

STATE_KEY = "dp-sgd/opacus"
STATE_FORMAT = 1
ACCOUNTANTS = ("rdp", "prv")

History = list[tuple[float, float, int]]


def dp_sgd_event(history: Sequence[tuple[float, float, int]], poisson_sampling: bool = True) -> dp_event.DpEvent:
    """The DpEvent of an Opacus accountant history.

    Poisson batches: one SGM(q, z) self-composed per entry (add/remove relation).
    Shuffled fixed-size batches (``poisson_sampling=False``): no amplification; each
    pass over the data touches a record once, with replace-one sensitivity 2C against
    noise zC: ``SelfComposed(Gaussian(z/2), passes)`` (replace-one relation; see
    :func:`dp_sgd_relation`).
    """
    if not history:
        raise ValueError("history must hold at least one (noise_multiplier, sample_rate, steps) entry")
    if poisson_sampling:
        events = [
            dp_event.SelfComposedDpEvent(
                dp_event.PoissonSampledDpEvent(float(q), dp_event.GaussianDpEvent(float(z))), int(steps)
            )
            for z, q, steps in history
        ]
    else:
        events = [
            dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(float(z) / 2.0), _passes(q, steps))
            for z, q, steps in history
        ]
    return events[0] if len(events) == 1 else dp_event.ComposedDpEvent(events)


def dp_sgd_relation(poisson_sampling: bool) -> str:
    """The relation :func:`dp_sgd_event` is calibrated under: add/remove for Poisson batches, else replace-one."""
    return "add_or_remove_one" if poisson_sampling else "replace_one"


def _passes(sample_rate: float, steps: int) -> int:
    """Passes over the data that ``steps`` shuffled batches of rate q make: ⌈steps / ⌈1/q⌉⌉ (at least 1)."""
    per_pass = max(1, math.ceil(1.0 / float(sample_rate) - 1e-9))
    return max(1, math.ceil(int(steps) / per_pass))


def combined_noise_multiplier(noise_stds: Sequence[float], clip_norms: Sequence[float]) -> float:
    r"""z* = (Σ_m C_m²/σ_m²)^(-1/2) of grouped clipping (bounds C_m, noise stds σ_m; McMahan et al. 2018)."""
    stds = np.asarray(noise_stds, dtype=np.float64)
    clips = np.asarray(clip_norms, dtype=np.float64)
    if stds.shape != clips.shape or stds.ndim != 1 or stds.size == 0:
        raise ValueError("noise_stds and clip_norms must be non-empty sequences of the same length")
    if np.any(stds <= 0) or np.any(clips <= 0):
        raise ValueError("noise_stds and clip_norms must be in (0, inf)")
    return float(1.0 / np.sqrt(np.sum((clips / stds) ** 2)))


@lru_cache(maxsize=256)
def _sgm_rdp(sample_rate: float, noise_multiplier: float) -> np.ndarray:
    """Opacus' RDP curve of one SGM step on ``RDPAccountant.DEFAULT_ALPHAS`` (cached: it costs ~0.2 s)."""
    curve = rdp_analysis.compute_rdp(
        q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=RDPAccountant.DEFAULT_ALPHAS
    )
    curve.setflags(write=False)
    return curve


def history_epsilon(history: Sequence[tuple[float, float, int]], delta: float, accountant: str = "rdp") -> float:
    """ε at ``delta`` of an Opacus accountant history, computed by Opacus' ``accountant``.

    For ``"rdp"`` this is ``RDPAccountant.get_privacy_spent`` with the per-step
    curve cached per (q, z): ``compute_rdp`` is linear in the step count, so
    Σ steps·curve(q, z) is exactly what the accountant sums.
    """
    if not history:
        return 0.0
    return _history_epsilon(
        tuple((float(z), float(q), int(steps)) for z, q, steps in history), float(delta), accountant
    )


@lru_cache(maxsize=1024)
def _history_epsilon(history: tuple[tuple[float, float, int], ...], delta: float, accountant: str) -> float:
    """:func:`history_epsilon` of a non-empty history (cached: clients with the same (z, q, steps) and rounds
    share it; the value is a function of its arguments only)."""
    if accountant == "rdp":
        rdp = sum(int(steps) * _sgm_rdp(float(q), float(z)) for z, q, steps in history)
        eps, _ = rdp_analysis.get_privacy_spent(orders=RDPAccountant.DEFAULT_ALPHAS, rdp=rdp, delta=delta)
        return float(eps)
    acc = create_accountant(mechanism=accountant)
    acc.history = [tuple(entry) for entry in history]
    return float(acc.get_epsilon(delta=delta))


def history_delta(before: Sequence[tuple[float, float, int]], after: Sequence[tuple[float, float, int]]) -> History:
    """The entries ``after`` added to ``before`` (Opacus merges a repeated (z, q) into the last entry)."""
    before, after = [tuple(e) for e in before], [tuple(e) for e in after]
    if not before:
        return list(after)  # type: ignore[arg-type]
    last = len(before) - 1
    z, q, steps = after[last]
    if after[:last] != before[:last] or (z, q) != before[last][:2] or steps < before[last][2]:
        raise RuntimeError("the accountant history was rewritten during the round, not extended")
    added = int(steps) - int(before[last][2])
    return ([(z, q, added)] if added else []) + list(after[last + 1 :])  # type: ignore[list-item]


def load_history(state: RecordDict, state_key: str = STATE_KEY) -> tuple[History, Optional[ConfigRecord]]:
    """The accountant history stored in ``state`` (empty if none) and its record."""
    record = state.config_records.get(state_key)
    if record is None:
        return [], None
    zs, qs, steps = (list(record.get(k, [])) for k in ("history-z", "history-q", "history-steps"))
    if not len(zs) == len(qs) == len(steps):
        raise ValueError(f"state[{state_key!r}] is corrupt: history lists of different lengths")
    return [(float(z), float(q), int(s)) for z, q, s in zip(zs, qs, steps)], record


def history_record(
    history: History,
    *,
    accountant: str,
    rounds: int,
    noise_multiplier: float,
    target_epsilon: float,
    planned_steps: int,
) -> ConfigRecord:
    """The ConfigRecord :func:`load_history` reads (floats stored as float64: exact round trip)."""
    return ConfigRecord(
        {
            "format": STATE_FORMAT,
            "accountant": accountant,
            "history-z": [float(z) for z, _, _ in history],
            "history-q": [float(q) for _, q, _ in history],
            "history-steps": [int(s) for _, _, s in history],
            "rounds": int(rounds),
            "noise-multiplier": float(noise_multiplier),
            "target-epsilon": float(target_epsilon),
            "planned-steps": int(planned_steps),
        }
    )


__all__ = [
    "ACCOUNTANTS",
    "STATE_KEY",
    "History",
    "combined_noise_multiplier",
    "dp_sgd_event",
    "dp_sgd_relation",
    "history_delta",
    "history_epsilon",
    "history_record",
    "load_history",
]
