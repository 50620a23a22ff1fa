r"""DP-FTRL with banded matrix factorisation (BandMF): central user-level DP with correlated noise and an
enforced participation rule, accounted without amplification by sampling.

A drop-in for Flower's ``DifferentialPrivacyServerSideFixedClipping`` (its arguments in its order; the new
ones keyword-only) for deployments that cannot honour Poisson sampling. Release t (1-based, counted over the
whole run, restarts included) of the model is

.. math:: \tilde w_{t+1} = \tilde w_t + \frac1m\Big(\sum_{i \in S_t} \bar\Delta_i + z C\,(C_b^{-1} Z)_t\Big),
          \qquad \bar\Delta_i = \Delta_i \min(1, C/\lVert\Delta_i\rVert_2),

with m = ``num_sampled_clients`` the public expected cohort size (never the number of replies), C the
clipping norm, :math:`C_b` the banded lower-triangular Toeplitz strategy matrix of ``num_bands`` = b bands
(``factorization``: ``"banded-sqrt"``, Kalinin & Lampert's banded square root, or ``"banded-optimal"``,
its b coefficients optimised for ``num_rounds``) and Z i.i.d. standard normal: row t is generated from the
run's secret 256-bit key (OS entropy, drawn at the first release) and t by a counter-based cryptographic
generator (ChaCha20 + Box–Muller: the guarantee is computational with respect to the key, as for any CSPRNG).
The noise does not depend on the replies: row t is made in a background thread from ``configure_train`` on,
while the clients train, and ``aggregate_train`` only collects it. It is generated row by row with O(b·d) memory
(:class:`~flwr_dp_strategies.privacy.mechanisms.matrix_factorization.BandedNoise`): the model follows the noisy
prefix sums :math:`A x + zC\,BZ` with :math:`B = AC_b^{-1}`, whose error grows much more slowly than the
independent noise of DP-FedAvg (docs/bandmf.md).

The round is :class:`~flwr_dp_strategies.rounds.central_gaussian.CentralGaussianRound`'s (screening, clip,
sum over m, the budget stop, booking) with participation ``"cyclic"`` / ``"cyclic-poisson"`` and noise
``"banded"``: this class adds only the participation rule (:meth:`choose_nodes`, :meth:`admit`), the noise
stream (:meth:`noise_row`), the events and the restart state.

Participation is enforced, not assumed
(:class:`~flwr_dp_strategies.privacy.accounting.participation.CyclicParticipation`): the nodes of the grid are split
into b groups, release t asks group (t − 1) mod b (the wrapped strategy makes the instruction; only its
choice of nodes is replaced), each node at most ``max_participations`` = k times (default ⌈T/b⌉). A
train reply from a node whose last aggregated release is less than b ago, or that has k already, is
rejected (reason ``participation``, counted in the server log) before anything of it is added; the round
goes on.

Privacy (:mod:`flwr_dp_strategies.privacy.mechanisms.matrix_factorization`): under b-min-separation and at most k
releases per client, the first t releases are one Gaussian mechanism of noise multiplier
:math:`z / \mathrm{sens}_t` (``add_or_remove_one``, user-level: neighbours differ by one client's whole
data, each of its rounds moving the round's sum by at most C); :math:`\mathrm{sens}_T = \sqrt k` (the
coefficients have unit norm). Release t books ``GaussianDpEvent(z / c_p)``, p = (t − 1) mod b, while
⌊(t−1)/b⌋ < k, nothing after: composed, the ledger holds exactly ``GaussianDpEvent(z / sens_t)`` after
every release. No amplification is claimed (the cohort may be public).

Non-banded factorisations (``factorization="tree"`` or ``"blt"``; then :math:`C_b` above stands for their C and
b = ``num_bands`` is only the min-separation and the number of groups). ``"tree"``: the plain streaming binary tree
(not Honaker's decoder, which reads later nodes): each dyadic node's Gaussian is regenerated from the key and the
node, and release t adds the difference of the tree's consecutive prefix noises (no state besides the row).
``"blt"``: a buffered linear Toeplitz C with n = ``num_buffers`` buffers (default 3), :math:`c_0 = 1`,
:math:`c_i = \sum_j \lambda_j\theta_j^{i-1}`, its parameters optimised for (T, b, k) at the first use (cached), so
that C ≥ 0 with non-increasing coefficients; its noise rows come from the BLT recurrence with n·d floats. Their
columns b apart share rows, so the prefix sensitivities are computed, not the banded closed form: for BLT exactly
(the earliest b-separated pattern is the worst for a Toeplitz C ≥ 0 with non-increasing coefficients), for the tree
as a sound per-level upper bound over every b-separated pattern of at most k rounds (derivations in
:mod:`flwr_dp_strategies.privacy.mechanisms.matrix_factorization`, both checked against the brute force over every
pattern). Release t books ``GaussianDpEvent(z / sqrt(sens_t² − sens_{t−1}²))``, so the ledger again holds exactly
``GaussianDpEvent(z / sens_t)`` after every release. Both need ``num_rounds`` (the sensitivities are for T releases;
past T nothing is released) and ``sampling="cyclic"``: the amplified analyses below assume that the columns of one
client's slots share no row, which only a banded C with at most b bands gives, so they are refused for these.

With ``sampling="cyclic-poisson"`` (amplified BandMF, Choquette-Choo et al., NeurIPS 2023, Theorem 4) each
member of the release's group is asked independently with probability q = m·b/N (N = ``num_clients``,
default the nodes connected at the first release), from OS entropy; the cohort is never published. Each
epoch of b releases then books ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` at its first release
(⌈T/b⌉ in all; what this assumes is spelled out in :mod:`flwr_dp_strategies.privacy.mechanisms.matrix_factorization`).
That analysis ignores the participation cap k, and the un-amplified one above stays valid under any sampling (it
needs only b-min-separation and at most k participations, both enforced): with ``num_rounds`` given, the strategy
books whichever of the two gives the smaller ε for the whole planned run at the ledger's δ (e.g. k = 1, q = 0.5,
z = 0.8, T = 9, b = 3: 5.68 un-amplified against 8.10 amplified). The choice is made once, at the first
release, from public values only (z, q, b, k, T, the coefficients, δ), is kept in the signed state and never
changes within a run (the two analyses cannot be mixed: each bounds the whole prefix). Without ``num_rounds``
the amplified analysis is booked.

With ``sampling="window-allocation"`` (random allocation, Schuchardt & Kalinin 2026; ``allocation_window`` = w) the
nodes are split into G = ⌈(b − 1)/w⌉ + 1 groups; cycle c of G·w releases gives group g the window of releases
c·G·w + g·w + 1 .. c·G·w + g·w + w, and each member of the group is asked in exactly one release of its window: the
slot :func:`~flwr_dp_strategies.privacy.accounting.bandmf_amplification.window_slot` (an HMAC of the node and the
cycle under a key derived from the run's secret noise key: uniform, independent across nodes and cycles, secret,
the same after a restart). A reply from any other node is refused (``participation``). Two releases of a node are
at least (G − 1)·w + 1 ≥ b apart, so the un-amplified analysis holds; the amplified one books, at the first release
of each of the first k cycles (a node counts a participation when it is *asked*, replying or not, so it is asked in at
most k cycles whatever it does), a ``WindowAllocationDpEvent`` (the sampling-free RDP bound of the mixture over the
secret slot, derived and checked in :mod:`~flwr_dp_strategies.privacy.accounting.bandmf_amplification`; RDP only, so a PLD-only
ledger books the un-amplified analysis), and the smaller of the two is chosen as above. The participation history
is kept in the secret file, as for ``"cyclic-poisson"``.
Training stops cleanly before a release would exceed ``ledger.max_epsilon``.

Restart. The participation history, the number of releases, the model's dimension, a keyed check value of
the newest noise row and the SHA-256 of the noise key file are kept in the ledger file's signed state (with, for
the tree and BLT, the factorisation and its parameters: T, and the BLT's n, λ and θ; a restart with any of them
different is refused); the key
itself (secret) goes to its own file beside the ledger, ``<ledger_path>.bandmf-key`` (mode 0600, atomic,
written once, at the first release, before the ledger that names it): O(1) bytes on disk whatever d, nothing
rewritten per release but the ledger. The last b − 1 noise rows stay in memory; a restarted ServerApp given
``ledger_path`` and ``resume=True`` rebuilds them at its first release by regenerating Z_1..Z_t from the key and
replaying the recurrence (O(t·b·d) once), and continues the same noise stream (bit-exact on the same numpy build
and CPU) and participation history. A missing or altered key file, or a replay whose check value differs, is
refused (the run can neither re-use nor lose correlated noise).
"""

from __future__ import annotations

import glob
import json
import math
import os
from logging import INFO
from typing import Any, Optional, Unpack

import numpy as np
from flwr.app import ArrayRecord
from flwr.common.logger import log
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg

from ..rounds.options import AccountingOptions
from ..privacy import PrivacyLedger
from ..privacy.accounting.bandmf_amplification import (
    MAX_WINDOW,
    WindowAllocationDpEvent,
    check_coefficients,
    window_slot,
)
from ..privacy.accounting.ledger_file import LedgerFileError, write_atomic
from ..privacy.mechanisms.matrix_factorization import (
    BANDED_FACTORIZATIONS,
    FACTORIZATIONS,
    MAX_BUFFERS,
    BandedNoise,
    BltNoise,
    TreeNoise,
    amplified_round_event,
    blt_coefficients,
    increment_event,
    optimal_blt_parameters,
    toeplitz_prefix_sensitivities,
    tree_prefix_sensitivities,
    load_noise_key,
    noise_key,
    round_event,
    read_checked,
    save_noise_key,
    state_checksum,
    strategy_coefficients,
)
from ..privacy.accounting.participation import CyclicParticipation
from ..privacy.accounting.relations import ADD_OR_REMOVE_ONE
from ..privacy.rng import RngLike
from ..privacy.validation import check_int, check_positive
from ..rounds.central_gaussian import CentralGaussianRound
from ..rounds.central_release import check_mean_based, poisson_sample
from ..rounds.template import Screened

EVENT_LABEL = "central-gaussian/banded-matrix-factorization"
STATE_NAME = "banded-matrix-factorization"
PARTICIPATION = "participation"
SAMPLINGS = ("cyclic", "cyclic-poisson", "window-allocation")
AMPLIFIED_SAMPLINGS = ("cyclic-poisson", "window-allocation")  # the sample is secret (amplification)


class AccountedBandedMatrixFactorization(CentralGaussianRound, DifferentialPrivacyServerSideFixedClipping):
    """DP-FTRL with banded matrix factorisation (module docstring), wrapping a FedAvg.

    Args:
        strategy: a FedAvg (its instruction, metric aggregation and evaluation are used).
        noise_multiplier: z in (0, inf): the noise of release t is z·C·(C_b⁻¹Z)_t / m.
        clipping_norm: C in (0, inf).
        num_sampled_clients: m >= 1, the public denominator (the expected cohort, about N/b).

    Keyword-only:
        accountant: Flower's parent's argument, kept so that the signature is a drop-in; must be None (Flower's
            accountant composes independent Gaussian rounds: the ledger accounts the correlated noise).
        num_bands: b >= 1, the bands of C_b and the min-separation (b = 1: DP-FedAvg, every node every round).
        num_rounds: T >= 1, the planned releases (needed for ``factorization="banded-optimal"`` and for the
            default k); releases past T are refused.
        max_participations: k >= 1 (default ⌈T/b⌉).
        factorization: ``"banded-sqrt"`` (default), ``"banded-optimal"``, ``"tree"`` (the plain streaming binary
            tree) or ``"blt"`` (buffered linear Toeplitz); the last two need ``num_rounds`` and ``sampling="cyclic"``
            (module docstring). z is the multiplier of the i.i.d. Z in every case; the booked ε uses each
            factorisation's own sensitivity (for the tree √(levels) per participation, not 1).
        num_buffers: n for ``factorization="blt"`` (1..8, default 3): the BLT's buffers, n·d floats of noise state;
            its (λ, θ) are optimised for (T, b, k) and kept in the signed ledger state. Refused for the others.
        sampling: ``"cyclic"`` (default: the whole group, un-amplified), ``"cyclic-poisson"`` (each member of
            the group with q = m·b/N, amplified) or ``"window-allocation"`` (each member of the group in one secret,
            uniformly random release of its window of ``allocation_window`` releases per cycle; amplified by the
            sampling-free RDP bound of :mod:`~flwr_dp_strategies.privacy.accounting.bandmf_amplification`).
        allocation_window: w for ``"window-allocation"`` (1..6): G = ⌈(b − 1)/w⌉ + 1 groups, cycles of G·w releases,
            so two releases of a client are at least (G − 1)·w + 1 ≥ b apart; choose w with N/(G·w) ≈ m.
        num_clients: N for ``"cyclic-poisson"`` (default: the nodes at the first release); q = m·b/N <= 1.
        **accounting: the accounting options (:class:`~flwr_dp_strategies.rounds.options.AccountingOptions`); the
            noise key is saved beside ``ledger_path``.
        rng: noise key and group assignment (default: OS entropy; an int seed gives the public key
            ``noise_key(seed)`` and the sampling of release t ``default_rng([seed, t, 1])``, reproducible across a
            restart: tests and benchmarks only).
    """

    def __init__(
        self,
        strategy: FedAvg,
        noise_multiplier: float,
        clipping_norm: float,
        num_sampled_clients: int,
        *,
        accountant: Optional[Any] = None,
        num_bands: int,
        num_rounds: Optional[int] = None,
        max_participations: Optional[int] = None,
        factorization: str = "banded-sqrt",
        num_buffers: Optional[int] = None,
        sampling: str = "cyclic",
        num_clients: Optional[int] = None,
        allocation_window: Optional[int] = None,
        rng: RngLike = None,
        **accounting: Unpack[AccountingOptions],
    ) -> None:
        check_mean_based(strategy, 'AccountedBandedMatrixFactorization')
        if accountant is not None:
            raise ValueError(
                "accountant must be None: Flower's PrivacyAccountant composes independent Gaussian rounds, BandMF's "
                "noise is correlated across rounds (its own ledger books one Gaussian of multiplier z / sensitivity)"
            )
        z = check_positive("noise_multiplier", noise_multiplier)
        clip = check_positive("clipping_norm", clipping_norm)
        m = check_int("num_sampled_clients", num_sampled_clients, minimum=1)
        b = check_int("num_bands", num_bands, minimum=1)
        rounds = None if num_rounds is None else check_int("num_rounds", num_rounds, minimum=1)
        if max_participations is None:
            if rounds is None:
                raise ValueError("max_participations must be an integer in [1, inf) (or give num_rounds: k = ⌈T/b⌉)")
            max_participations = math.ceil(rounds / b)
        k = check_int("max_participations", max_participations, minimum=1)
        if factorization not in FACTORIZATIONS:
            raise ValueError(f"factorization must be one of {FACTORIZATIONS}, got {factorization!r}")
        if sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {SAMPLINGS}, got {sampling!r}")
        population = None if num_clients is None else check_int("num_clients", num_clients, minimum=1)
        if population is not None and sampling == "cyclic-poisson" and m * b > population:
            raise ValueError(
                f"num_sampled_clients must be in [1, N/b] with sampling='cyclic-poisson' (q = m·b/N <= 1), got "
                f"m={m}, b={b}, N={population}"
            )
        buffers = None
        if factorization == "blt":
            buffers = check_int("num_buffers", 3 if num_buffers is None else num_buffers, minimum=1)
            if buffers > MAX_BUFFERS:
                raise ValueError(f"num_buffers must be an integer in [1, {MAX_BUFFERS}], got {num_buffers!r}")
        elif num_buffers is not None:
            raise ValueError(f"num_buffers is only for factorization='blt', got factorization={factorization!r}")
        # the non-banded factorisations: C's columns b apart share rows, so the amplified analyses (which need the
        # slots' columns to be orthogonal) do not hold; the prefix sensitivities are computed for T releases
        self._increments: Optional[np.ndarray] = None
        self.factorization_parameters: Optional[dict[str, Any]] = None
        if factorization not in BANDED_FACTORIZATIONS:
            if sampling != "cyclic":
                raise ValueError(
                    f"factorization={factorization!r} needs sampling='cyclic': the amplified analyses of "
                    f"sampling={sampling!r} assume a banded C (the columns of one client's slots share no row), "
                    f"and {factorization!r} is not banded"
                )
            if rounds is None:
                raise ValueError(f"num_rounds must be an integer in [1, inf) for factorization={factorization!r}")
            if factorization == "tree":
                sens = tree_prefix_sensitivities(rounds, b, k)
                self.factorization_parameters = {"num_rounds": rounds}
            else:
                lambdas, thetas = optimal_blt_parameters(rounds, buffers, b, k)
                sens = toeplitz_prefix_sensitivities(blt_coefficients(lambdas, thetas, rounds), b, k)
                self.factorization_parameters = {
                    "num_rounds": rounds,
                    "num_buffers": buffers,
                    "lambdas": [float(v) for v in lambdas],
                    "thetas": [float(v) for v in thetas],
                }
            squared = sens * sens
            self._increments = np.diff(squared, prepend=0.0)
            self.coefficients: Optional[np.ndarray] = None
        else:
            self.coefficients = strategy_coefficients(factorization, b, rounds)
        self.num_buffers = buffers
        window = None
        if sampling == "window-allocation":
            if allocation_window is None:
                raise ValueError("allocation_window must be an integer in [1, 6] with sampling='window-allocation'")
            window = check_int("allocation_window", allocation_window, minimum=1)
            if window > MAX_WINDOW:
                raise ValueError(
                    f"allocation_window must be an integer in [1, {MAX_WINDOW}], got {allocation_window!r}"
                )
            check_coefficients(self.coefficients)  # the window-allocation bound needs C >= 0
        elif allocation_window is not None:
            raise ValueError(f"allocation_window is only for sampling='window-allocation', got sampling={sampling!r}")
        super().__init__(strategy, z, clip, m)
        self.init_accounted_round(
            neighboring_relation=ADD_OR_REMOVE_ONE,
            **accounting,
        )
        self._init_central(
            sampling=sampling,
            clipping="fixed",
            num_clients=None,
            rng=rng,
            publish_client_metrics=False,
            event_label=EVENT_LABEL,
            noise_sampler="banded",
        )
        self.num_bands, self.num_rounds, self.max_participations = b, rounds, k
        self.allocation_window = window
        # window allocation: G groups own windows of w releases in turn (cycles of G·w); otherwise b groups, one release
        self.num_groups = (math.ceil((b - 1) / window) + 1) if window is not None else b
        self.factorization = factorization
        self.population = population
        self._seed = int(rng) if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool) else None
        self.participation = CyclicParticipation(self.num_groups, k, rng)
        self.releases = 0  # releases made so far in the run (restarts included)
        self._analysis: Optional[str] = None  # the analysis booked (chosen at the first release, or restored)
        self.noise: Optional[Any] = None  # BandedNoise, TreeNoise or BltNoise
        self._rng = rng
        self._key: Optional[bytes] = None  # the noise key: drawn at the first release, or restored
        self._key_entry: Optional[dict] = None  # {"sha256": ...} of the key file once written
        self._noise_dimension: Optional[int] = None  # d of the restored stream (its rows are rebuilt lazily)
        self._check_value: Optional[str] = None  # the restored stream's keyed check value
        self._release: Optional[int] = None  # the release the configured round makes
        self._asked: Optional[tuple[int, list[int]]] = None  # window allocation: (release, the nodes asked in it)
        self._restore()

    @property
    def group_sampling_rate(self) -> Optional[float]:
        """q = m·b/N with ``"cyclic-poisson"`` once N is known (None otherwise)."""
        if self.sampling != "cyclic-poisson" or self.population is None:
            return None
        return self.num_sampled_clients * self.num_bands / self.population

    def _check_rate(self) -> float:
        rate = self.group_sampling_rate
        if rate is None or not 0.0 < rate <= 1.0:
            raise ValueError(
                f"num_sampled_clients must be in [1, N/b] with sampling='cyclic-poisson' (q = m·b/N <= 1), got "
                f"m={self.num_sampled_clients}, b={self.num_bands}, N={self.population}"
            )
        return rate

    # ------------------------------------------------------------------ persistence
    def _key_path(self) -> str:
        return f"{self.ledger_path}.bandmf-key"

    def _restore(self) -> None:
        """Continue the run saved in the ledger file (if any): releases, participation, noise stream."""
        state = self.ledger_store.get_state(STATE_NAME)
        if state is None:
            if self.ledger.rounds():
                raise LedgerFileError(
                    self.ledger_store.path, f"the ledger holds releases but no {STATE_NAME!r} state to continue"
                )
            return
        path = self.ledger_store.path
        try:
            expected = {
                "num_bands": self.num_bands,
                "max_participations": self.max_participations,
                "coefficients": self._coefficients_state(),
                "sampling": self.sampling,
            }
            if self.factorization not in BANDED_FACTORIZATIONS or "factorization" in state:
                # a tree or BLT run keeps its factorisation and its parameters (T; the BLT's n, λ, θ): the noise
                # stream and the booked sensitivities are theirs, a restart with any of them different is refused
                if state.get("factorization") != self.factorization:
                    raise ValueError(
                        f"factorization was {state.get('factorization')!r} in the saved run, this run has "
                        f"{self.factorization!r}"
                    )
                saved = state.get("factorization_parameters")
                for key, value in (self.factorization_parameters or {}).items():
                    if not isinstance(saved, dict) or saved.get(key) != value:
                        raise ValueError(
                            f"{key} of factorization={self.factorization!r} was "
                            f"{saved.get(key) if isinstance(saved, dict) else None!r} in the saved run, this run has "
                            f"{value!r}"
                        )
            if self.allocation_window is not None:  # absent from the states of the other samplings
                expected["allocation_window"] = self.allocation_window
            for key, value in expected.items():
                if state.get(key) != value:
                    raise ValueError(f"{key} was {state.get(key)!r} in the saved run, this run has {value!r}")
            releases = state.get("releases")
            if isinstance(releases, bool) or not isinstance(releases, int) or releases < 0:
                raise ValueError(f"releases must be an integer >= 0, got {releases!r}")
            # the noise stream's units: release t adds z·C/m · (C_b⁻¹ Z)_t, and each booked row assumes the z it was
            # drawn with; a stream continued at another z, C or m would be booked for noise it does not have
            for key, value in self._stream_units().items():
                if key not in state and releases == 0:
                    continue
                if state.get(key) != value:
                    raise ValueError(
                        f"{key} was {state.get(key)!r} in the saved run, this run has {value!r}: the restored noise "
                        f"stream is in the saved run's units (a restart must keep z, C and m)"
                    )
            analysis = state.get("analysis")
            if analysis is None and releases and self.sampling == "cyclic-poisson":
                analysis = "amplified"  # a run saved before the choice existed booked the amplified analysis
            if analysis not in (None, "amplified", "unamplified") or (
                analysis == "amplified" and self.sampling not in AMPLIFIED_SAMPLINGS
            ):
                raise ValueError(f"analysis must be 'amplified' or 'unamplified' for this sampling, got {analysis!r}")
            self.participation.load_state(self._load_participation(state.get(PARTICIPATION), releases))
            population = state.get("num_clients")
            if population is not None:
                if self.population is not None and population != self.population:
                    raise ValueError(f"num_clients was {population!r} in the saved run, this run has {self.population}")
                self.population = population
            noise = state.get("noise")
            if releases and noise is not None:
                if not isinstance(noise, dict) or set(noise) != {"key_sha256", "dimension", "check"}:
                    raise ValueError(
                        f"noise must name the noise key file, the model's dimension and the check value, got {noise!r} "
                        "(a run saved before the keyed noise stream cannot continue)"
                    )
                dimension = noise["dimension"]
                if isinstance(dimension, bool) or not isinstance(dimension, int) or dimension < 1:
                    raise ValueError(f"noise dimension must be an integer >= 1, got {dimension!r}")
                self._key = load_noise_key(self._key_path(), noise["key_sha256"])
                self._key_entry = {"sha256": noise["key_sha256"]}
                self._noise_dimension, self._check_value = dimension, noise["check"]
            elif releases and self._stream_has_memory():
                raise ValueError("the saved run has releases but no noise key")
        except ValueError as err:
            raise LedgerFileError(path, f"state {STATE_NAME!r}: {err}") from err
        self.releases = releases
        if analysis is not None:
            self._analysis = analysis  # the run keeps the analysis it booked from its first release
        log(
            INFO,
            "BandMF: continuing after release %d (noise stream and participation restored from %s)",
            releases,
            path,
        )

    def _participation_path(self, release: int) -> str:
        return f"{self.ledger_path}.bandmf-participation.{release}"

    def _participation_entry(self) -> Any:
        """What the signed ledger state holds of the participation history. Under ``"cyclic"`` the history itself
        (each group's members train in every b-th release: nothing secret). Under ``"cyclic-poisson"`` the
        amplification needs the sample to stay secret, so the rows (who was sampled in which release) go to their
        own file, ``<ledger_path>.bandmf-participation.<t>`` (mode 0600, beside the secret noise key), and the
        ledger holds only its release and SHA-256; without a ledger file they stay in memory."""
        state = self.participation.to_state()
        if self.sampling not in AMPLIFIED_SAMPLINGS:
            return state
        if self.ledger_path is None:
            return {"secret": None}
        data = json.dumps(state, sort_keys=True).encode()
        write_atomic(self._participation_path(self.releases), data)
        for stale in glob.glob(glob.escape(self.ledger_path) + ".bandmf-participation.*"):
            suffix = stale.rsplit(".", 1)[-1]
            if suffix.isdigit() and int(suffix) < self.releases - 1:  # release t−1's is the saved ledger's
                os.unlink(stale)
        return {"secret": {"release": self.releases, "sha256": state_checksum(data)}}

    def _load_participation(self, entry: Any, releases: int) -> Any:
        """The participation state an entry of :meth:`_participation_entry` names (ValueError when its file is
        missing, altered or of another release)."""
        if not (isinstance(entry, dict) and set(entry) == {"secret"}):
            if self.sampling in AMPLIFIED_SAMPLINGS and releases:
                raise ValueError(f"the participation history of a {self.sampling} run must be kept in its secret file")
            return entry
        secret = entry["secret"]
        if secret is None:
            raise ValueError("the saved run kept its participation history in memory only: it cannot continue")
        if not isinstance(secret, dict) or set(secret) != {"release", "sha256"} or secret["release"] != releases:
            raise ValueError(f"participation must name the secret file of release {releases}, got {secret!r}")
        return json.loads(read_checked(self._participation_path(releases), secret["sha256"], "participation history"))

    def _coefficients_state(self) -> Optional[list[float]]:
        """The banded coefficients (None for the tree and BLT, whose parameters are in ``factorization_parameters``)."""
        return None if self.coefficients is None else [float(c) for c in self.coefficients]

    def _factorization_state(self) -> dict[str, Any]:
        """The factorisation and its parameters, for the tree and BLT (the banded states keep their old form)."""
        if self.factorization in BANDED_FACTORIZATIONS:
            return {}
        return {"factorization": self.factorization, "factorization_parameters": self.factorization_parameters}

    def _stream_has_memory(self) -> bool:
        """Whether the noise of a release depends on the earlier ones (then a restart needs the key and a replay)."""
        return self.num_bands > 1 or self.factorization not in BANDED_FACTORIZATIONS

    def _stream_units(self) -> dict[str, Any]:
        """What the noise stream's scale z·C/m depends on, kept in the signed state and checked on a restart."""
        return {
            "noise_multiplier": float(self.noise_multiplier),
            "clipping_norm": float(self.clipping_norm),
            "num_sampled_clients": int(self.num_sampled_clients),
        }

    def _save_state(self) -> None:
        """Name the noise key file (written once, at the first release, before the ledger that names it), the
        model's dimension and the stream's keyed check value in the ledger's state: O(1) bytes per release."""
        noise_entry = None
        if self.ledger_path is not None and self.noise is not None:
            if self._key_entry is None:
                self._key_entry = {"sha256": save_noise_key(self._key_path(), self.noise.key)}
            noise_entry = {
                "key_sha256": self._key_entry["sha256"],
                "dimension": self.noise.dimension,
                "check": self.noise.check_value(),
            }
        self.ledger_store.set_state(
            STATE_NAME,
            {
                "num_bands": self.num_bands,
                "max_participations": self.max_participations,
                "coefficients": self._coefficients_state(),
                **self._factorization_state(),
                "sampling": self.sampling,
                **({"allocation_window": self.allocation_window} if self.allocation_window is not None else {}),
                "num_clients": self.population,
                "releases": self.releases,
                "analysis": self._analysis,
                "noise": noise_entry,
                PARTICIPATION: self._participation_entry(),
                **self._stream_units(),
            },
        )

    # ------------------------------------------------------------------ accounting
    def release_event(self) -> Any:
        """What the next release adds (None: nothing, k releases of every pattern are booked)."""
        return self.event_of_release(self.releases + 1)

    def event_of_release(self, release: int) -> Any:
        """The event release t books: its sensitivity increment (un-amplified), or the epoch's Poisson-sampled
        Gaussian at t ≡ 1 mod b (``"cyclic-poisson"`` booked amplified; q needs N, known from the first release
        on)."""
        if self.analysis() == "amplified":
            return self._amplified_event(release)
        if self._increments is not None:  # tree, BLT: the computed prefix sensitivities' increments
            t = check_int("release", release, minimum=1)
            return (
                increment_event(self._increments[t - 1], self.noise_multiplier) if t <= self._increments.size else None
            )
        return round_event(self.coefficients, release, self.noise_multiplier, self.num_bands, self.max_participations)

    def _amplified_event(self, release: int) -> Any:
        """The amplified analysis's event of release t: cyclic-poisson's epoch event (Thm 4), or window allocation's
        cycle event at the first release of each cycle of G·w releases (None otherwise)."""
        if self.sampling == "window-allocation":
            cycle, position = divmod(
                check_int("release", release, minimum=1) - 1, self.num_groups * self.allocation_window
            )
            if position or cycle >= self.max_participations:  # a node is asked in k cycles at most (counted when asked)
                return None
            return WindowAllocationDpEvent(
                float(self.noise_multiplier), int(self.allocation_window), tuple(float(c) for c in self.coefficients)
            )
        return amplified_round_event(release, self.noise_multiplier, self.num_bands, self._check_rate())

    def analysis(self) -> str:
        """``"unamplified"`` or ``"amplified"``: the analysis this run books (module docstring), chosen once."""
        if self._analysis is None:
            self._analysis = self._choose_analysis()
        return self._analysis

    def _choose_analysis(self) -> str:
        """The analysis whose ε for the whole planned run is the smaller at the ledger's δ (public values only)."""
        if self.sampling not in AMPLIFIED_SAMPLINGS:
            return "unamplified"
        if self.sampling == "cyclic-poisson":
            self._check_rate()
        elif self.ledger.accounting == "pld":
            return "unamplified"  # the window-allocation bound is an RDP curve: a PLD-only ledger cannot use it
        if self.num_rounds is None:
            return "amplified"
        ledger = self.ledger
        epsilons = {}
        for analysis in ("amplified", "unamplified"):
            scratch = PrivacyLedger(
                ledger.target_delta, neighboring_relation=ledger.neighboring_relation, accounting=ledger.accounting
            )
            for t in range(1, self.num_rounds + 1):
                event = (
                    self._amplified_event(t)
                    if analysis == "amplified"
                    else round_event(
                        self.coefficients, t, self.noise_multiplier, self.num_bands, self.max_participations
                    )
                )
                if event is not None:
                    scratch.record(event, server_round=t)
            epsilons[analysis] = scratch.epsilon()
        choice = "unamplified" if epsilons["unamplified"] < epsilons["amplified"] else "amplified"
        log(
            INFO,
            "BandMF (%s): booking the %s analysis: its ε for the planned %d releases is %.4g against %.4g",
            self.sampling,
            choice,
            self.num_rounds,
            epsilons[choice],
            epsilons["amplified" if choice == "unamplified" else "unamplified"],
        )
        return choice

    def add_remove_event(self) -> Any:
        event = self.release_event()
        if event is None:
            from dp_accounting.dp_event import NoOpDpEvent

            return NoOpDpEvent()
        return event

    def _ledger_would_exceed(self) -> bool:
        event = self.release_event()
        return event is not None and self.ledger.would_exceed(
            central_events=[event], neighboring_relation=ADD_OR_REMOVE_ONE
        )

    def booking_round(self, server_round: int) -> int:
        return self.releases

    # ------------------------------------------------------------------ participation and noise (the round is the base's)
    def start_round(self, arrays: ArrayRecord, nodes: list[int]) -> None:
        """The base's, then: the restored noise stream must be for this model (a restart rebuilds its rows here);
        the next noise row starts in the background; N fixed from the first release."""
        super().start_round(arrays, nodes)
        dimension = self.noise.dimension if self.noise is not None else self._noise_dimension
        if dimension is not None and dimension != self._dimension:
            raise ValueError(
                f"the model has {self._dimension} values, the restored noise stream {dimension}: "
                "the correlated noise cannot continue on another model"
            )
        if not self.budget_exhausted and (self.num_rounds is None or self.releases < self.num_rounds):
            self._noise_stream().prepare()  # the next row is made while the clients train (unused if none is released)
        if self.sampling == "cyclic-poisson" and self.population is None:
            self.population = check_int("num_clients", len(nodes), minimum=1)

    def plan_exhausted(self) -> bool:
        """The planned ``num_rounds`` releases are made (logged once)."""
        if self.num_rounds is None or self.releases < self.num_rounds:
            return False
        if not self.budget_exhausted:
            log(INFO, "BandMF: the planned num_rounds=%d releases are made; no further training", self.num_rounds)
        return True

    def choose_nodes(self, server_round: int, nodes: list[int]) -> list[int]:
        """The group of the next release (the nodes the rule admits); each member with q = m·b/N under
        ``"cyclic-poisson"``."""
        release = self.releases + 1
        if self.sampling == "window-allocation":
            chosen = self._window_nodes(nodes, release)
            self._asked = (release, list(chosen))
        else:
            chosen = self.participation.select(nodes, release)
        if self.sampling == "cyclic-poisson":
            chosen = poisson_sample(chosen, self._check_rate(), self._generator(release, "sample"))
        self._release = release
        log(
            INFO,
            "configure_train: release %d, group %d of %d: %d nodes",
            release,
            self._group_of_release(release),
            self.num_groups,
            len(chosen),
        )
        return chosen

    def _window_position(self, release: int) -> tuple[int, int, int]:
        """(cycle, group, slot) of release t under window allocation: cycle c = ⌊(t−1)/(G·w)⌋, then group g owns
        releases g·w .. g·w + w − 1 of the cycle, slot = the release's place in that window."""
        cycle, position = divmod(release - 1, self.num_groups * self.allocation_window)
        group, slot = divmod(position, self.allocation_window)
        return cycle, group, slot

    def _group_of_release(self, release: int) -> int:
        if self.sampling == "window-allocation":
            return self._window_position(release)[1]
        return self.participation.group_of_release(release)

    def _window_key(self) -> bytes:
        """The run's secret key (the noise key, drawn now if this is the first use): the slots are keyed by it."""
        if self._key is None:
            self._key = noise_key(self._rng)
        return self._key

    def _window_refusal(self, node: int, release: int) -> Optional[str]:
        """Why ``node`` may not take part in release t under window allocation (None: it may): not of the window's
        group, not its secret slot of the cycle, the rule's cap or separation, or less than b releases since its
        last."""
        cycle, group, slot = self._window_position(release)
        if self.participation.groups.get(int(node)) != group:
            return f"node {node} is not in group {group}, whose window release {release} is in"
        if window_slot(self._window_key(), int(node), cycle, self.allocation_window) != slot:
            return f"release {release} is not node {node}'s slot of cycle {cycle}"
        last = self.participation.last.get(int(node))
        if last is not None and release - last < self.num_bands:
            return f"node {node} trained in release {last}, less than b={self.num_bands} releases before {release}"
        return self.participation.violation(int(node), release)

    def _window_nodes(self, nodes: list[int], release: int) -> list[int]:
        """The nodes asked in release t: the members of the window's group whose secret slot of the cycle it is."""
        nodes = sorted({int(n) for n in nodes})
        self.participation.assign(nodes)
        return [n for n in nodes if self._window_refusal(n, release) is None]

    def _generator(self, release: int, purpose: str = "noise") -> np.random.Generator:
        if self._seed is not None:
            return np.random.default_rng([self._seed, release, 0 if purpose == "noise" else 1])
        return self.rng()  # a fresh OS-entropy generator per release unless a Generator was given

    def _this_release(self) -> int:
        return self._release if self._release is not None else self.releases + 1

    def admit(self, server_round: int, screened: Screened) -> None:
        """Reject (``participation``) every reply from a node the rule does not admit to this release."""
        release = self._this_release()
        refuse = self._window_refusal if self.sampling == "window-allocation" else self.participation.violation
        refused = [reply for reply in screened.accepted if refuse(int(reply.metadata.src_node_id), release) is not None]
        screened.reject(refused, PARTICIPATION)

    def noise_generator(self, server_round: int) -> np.random.Generator:
        return self._generator(self._this_release())

    def noise_row(self, generator: np.random.Generator) -> np.ndarray:
        """Row t of :math:`C_b^{-1}Z` under the run's key (``generator`` is unused): made in the background since
        the round's instructions were sent (:meth:`start_round`), collected here."""
        return self._noise_stream().next()

    def _noise_stream(self) -> Any:
        """The stream, made at the first use: the first release draws the key
        (:func:`~flwr_dp_strategies.privacy.mechanisms.matrix_factorization.noise_key`: OS entropy unless ``rng``
        is a test seed); after a restart the rows are rebuilt from the key (replaying the releases made) and a
        replay whose check value differs from the saved one is refused."""
        if self.noise is None:
            if self._key is None:
                self._key = noise_key(self._rng)
            if self.factorization == "tree":
                self.noise = TreeNoise(self._dimension, self._key)
            elif self.factorization == "blt":
                parameters = self.factorization_parameters
                self.noise = BltNoise(parameters["lambdas"], parameters["thetas"], self._dimension, self._key)
            else:
                self.noise = BandedNoise(self.coefficients, self._dimension, self._key)
            if self.releases:
                self.noise.fast_forward(self.releases)
                if self._stream_has_memory() and self.noise.check_value() != self._check_value:
                    raise LedgerFileError(
                        self.ledger_store.path,
                        f"state {STATE_NAME!r}: the noise stream replayed from the key differs from the released one "
                        "(another numpy build or CPU?): the correlated noise cannot continue",
                    )
        return self.noise

    def released(self, server_round: int, screened: Screened) -> None:
        """Record the participants and the release; name the noise key and keep the participation with the ledger."""
        release = self._this_release()
        if self.sampling == "window-allocation":
            # a node counts when it is asked, replying or not: each node is then asked in at most k cycles,
            # whatever it does, and the amplified analysis books min(k, cycles) cycles (_amplified_event)
            if self._asked is None or self._asked[0] != release:
                nodes = [n for n in self.participation.groups if self._window_refusal(n, release) is None]
            else:
                nodes = self._asked[1]
            accepted = {int(r.metadata.src_node_id) for r in screened.accepted}
            if not accepted <= set(nodes):
                raise ValueError(f"release {release} aggregated nodes it did not ask: {sorted(accepted - set(nodes))}")
            self.participation.record(nodes, release)
            self._asked = None
        else:
            self.participation.record([int(r.metadata.src_node_id) for r in screened.accepted], release)
        self.releases = release
        self._release = None
        self._save_state()

    def summary(self) -> None:
        """The factorisation, the rule and the privacy spent, then Flower's DP settings and the FedAvg's."""
        report = self.ledger.report()
        log(
            INFO,
            "\t├──> BandMF (%s, b=%d, k=%d): %d releases, epsilon=%.4f at delta=%g",
            self.factorization,
            self.num_bands,
            self.max_participations,
            self.releases,
            report.epsilon,
            report.delta,
        )
        super().summary()

    def __repr__(self) -> str:
        return (
            f"AccountedBandedMatrixFactorization(z={self.noise_multiplier}, C={self.clipping_norm}, "
            f"m={self.num_sampled_clients}, b={self.num_bands}, k={self.max_participations}, {self.factorization!r})"
        )


__all__ = ["AccountedBandedMatrixFactorization", "EVENT_LABEL", "STATE_NAME"]
