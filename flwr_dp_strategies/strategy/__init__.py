"""Message-API strategies (Flower 1.41+) whose releases are accounted by a PrivacyLedger.

* :class:`AccountedServerSideFixedClipping` - Flower's server-side fixed-clipping
  central DP wrapper, with every released aggregate recorded as a Gaussian
  event, ``privacy/epsilon`` and ``privacy/delta`` in each round's train
  metrics, a clean stop at ``max_epsilon`` and a persistent ledger.
* :class:`AccountedFedAvg` - FedAvg that screens replies (malformed ones are
  rejected and counted, the round goes on) and books what clients declare they
  released (client mods), publishing per-round ε.
* :class:`AccountedPoissonFixedClipping` - Flower's server-side fixed clipping
  with Poisson client sampling and a fixed denominator, accounted with
  amplification by sampling (which Flower's accountant refuses).
* :class:`AccountedAdaptiveClipping` - Flower's server-side adaptive clipping
  (Andrew et al. 2021) made correct (unclipped-fraction update, centred count,
  noise with the round's own C, fixed denominator) and accounted as one
  (Poisson-sampled) Gaussian mechanism per round;
  :class:`AccountedClientSideAdaptiveClipping` - the same with clients clipping
  (``client_mods.adaptive_clipping_mod``).
* :class:`AccountedBandedMatrixFactorization` - DP-FTRL with banded matrix factorisation
  (correlated noise, Choquette-Choo et al. 2023): cyclic participation with b-min-separation
  enforced on the grid's nodes, accounted as one Gaussian mechanism without amplification.
* :class:`ClusterEvaluation` - wraps any strategy; scores the clients'
  (Laplace-protected) inference results with silhouette / Calinski-Harabasz /
  Davies-Bouldin every evaluate round (Laplace-protected inference, MindSpore Federated's
  ``privacy_eval_type: LAPLACE``).
* :class:`SignDS` - SignDS + MagRR (Jiang, Zhou & Grossklags, ACM TIST 2022): clients upload a few sorted
  indices, a sign and one randomized-response bit; the server rebuilds, averages
  and tracks the step size.
* :class:`MinDivergenceExpSampling` - DELM's ε-DP minimum-divergence exponential
  sampling aggregation (DELM §5.3): per layer, the weighted mean of k replies
  drawn by the exponential mechanism on their sign-flip divergence (or the k
  lowest with ``epsilon=None``), the selection booked in its own ledger.
* :class:`ShuffleAmplifiedFedAvg` - DELM's layer-wise Split & Shuffle (DELM
  §3.4): accepted updates are permuted per layer before averaging; a sound
  FMT shuffle-amplified ε is booked only for LDP reports (the paper's ε/m is not).
* :class:`NoisyObjectiveSum` - sums the clients' noisy functional-mechanism
  objectives (DELM's functional mechanism, uploaded as coefficients), repairs and solves the
  sum once on the server instead of averaging heads trained on each client's
  repaired objective (less bias, same privacy).
* :class:`DistributedDpFedAvg` - distributed DP under secure aggregation: clients
  clip, round and add a share of Skellam noise, SecAgg+ reveals only the sum (the
  server never sees an update), the Skellam event is booked per round
  (``client_mods.distributed_dp_mod`` on the clients).
* :class:`SecureObjectiveSum` - the functional mechanism's objective summed under
  secure aggregation: clients send exact, rounded coefficients with a Skellam share,
  the sum carries the noise of one release (√m less than ``NoisyObjectiveSum``),
  solved once on the server (``client_mods.secure_objective`` on the clients).

This package exports strategies only. The helpers every accounted strategy uses live in
:mod:`flwr_dp_strategies.rounds`: ``ClientAccountingMixin`` in
:mod:`flwr_dp_strategies.rounds.client_accounting`, ``privacy_metric_record`` and
``with_privacy_metrics`` in :mod:`flwr_dp_strategies.rounds.metrics`.

Every strategy aggregates dense replies by streaming them
(:mod:`flwr_dp_strategies.rounds.streaming_aggregation`: payloads read zero-copy, one in-place accumulator
per key, O(d) memory), and counts replies of SuperNodes that died mid-round, and
rejected replies, in the server's log only (never in the round's metrics, which
would publish data-dependent counts; see :mod:`flwr_dp_strategies.rounds.client_accounting`) while
aggregating the others (nothing is booked for a failed reply).
"""

from .accounted_fedavg import AccountedFedAvg
from .adaptive_clipping import AccountedAdaptiveClipping
from .banded_matrix_factorization import AccountedBandedMatrixFactorization
from .client_side_adaptive_clipping import AccountedClientSideAdaptiveClipping
from .accounted_fixed_clipping import AccountedServerSideFixedClipping
from .cluster_evaluation import ClusterEvaluation
from .distributed_dp_fedavg import DistributedDpFedAvg
from .min_divergence import MinDivergenceExpSampling
from .noisy_objective_sum import NoisyObjectiveSum
from .poisson_fixed_clipping import AccountedPoissonFixedClipping
from .secure_objective_sum import SecureObjectiveSum
from .shuffle_amplified import ShuffleAmplifiedFedAvg
from .signds import SignDS

__all__ = [
    "AccountedAdaptiveClipping",
    "AccountedBandedMatrixFactorization",
    "AccountedClientSideAdaptiveClipping",
    "AccountedFedAvg",
    "AccountedPoissonFixedClipping",
    "AccountedServerSideFixedClipping",
    "ClusterEvaluation",
    "DistributedDpFedAvg",
    "MinDivergenceExpSampling",
    "NoisyObjectiveSum",
    "SecureObjectiveSum",
    "ShuffleAmplifiedFedAvg",
    "SignDS",
]

#: names that left this package -> "module:name" (they resolve, with a DeprecationWarning; PEP 562)
_MOVED = {
    "ClientAccountingMixin": "flwr_dp_strategies.rounds.client_accounting:ClientAccountingMixin",
    "privacy_metric_record": "flwr_dp_strategies.rounds.metrics:privacy_metric_record",
    "with_privacy_metrics": "flwr_dp_strategies.rounds.metrics:with_privacy_metrics",
}


def __getattr__(name: str):
    from .._deprecation import resolve_moved

    return resolve_moved(__name__, name, _MOVED)
