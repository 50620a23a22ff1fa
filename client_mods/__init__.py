"""Client-side mechanisms for Flower ClientApps (mods, trainers, data wrappers).

Every mechanism here draws its noise from :mod:`flwr_dp_strategies.privacy`
(no mechanism is written twice), describes its release as a DpEvent and
declares it in the reply (:func:`flwr_dp_strategies.declare_release`), so an
accounting strategy (e.g. :class:`flwr_dp_strategies.AccountedFedAvg`) books
it per node.

Mods (act on a message):

* :class:`LaplaceInferenceMod` - ε-LDP Laplace noise on inference results
  (probability vectors, L1 sensitivity 2) in evaluate replies;
  :func:`laplace_eval_epsilon` - the ε for a target noise magnitude (MindSpore's rule).
* :class:`LocalUpdateNoiseMod` - clip + analytic-Gaussian noise on model
  updates in train replies (local DP, LDP-FL).
* :func:`adaptive_clipping_mod` - central DP with adaptive clipping: clip the
  train update to the server's C_t and report the unclipped bit (for
  :class:`flwr_dp_strategies.AccountedClientSideAdaptiveClipping`).
* :func:`distributed_dp_mod` - distributed DP under secure aggregation: run the
  client side of SecAgg+ and upload only the masked, clipped, rounded, Skellam-noised
  update (for :class:`flwr_dp_strategies.DistributedDpFedAvg`);
  :func:`make_distributed_dp_mod` sets a noise floor the client insists on.
* :func:`signds_mod` - SignDS encoding of the train update (a few sorted
  indices, a sign and a MagRR bit replace the weights; Jiang et al. 2022).

Data wrappers (act on local data):

* :class:`LabelDp` - randomized-response label DP on a batch of labels
  (binary, one-hot or integer; numpy or torch; Ghazi et al. 2021);
* :class:`LabelDpDataset`, :func:`private_labels`, :func:`declare_label_release`
  - randomise a client's labels once, keep them in ``context.state`` and declare
  the release exactly once (ledger with ``neighboring_relation="replace_one"``).

Trainers (act on local data):

* :class:`FunctionalMechanismTrainer` - DELM's functional mechanism: a softmax /
  logistic head trained on a Taylor objective whose coefficients are perturbed
  once per client (ε does not grow with rounds); :class:`SecureObjectiveTrainer` - its
  exact objective under secure aggregation (for :class:`flwr_dp_strategies.SecureObjectiveSum`);
  :func:`covariance_reply`,
  :func:`store_projection`, :func:`project` - the client side of LDP federated PCA.

* :class:`DpSgdTrainer` - DP-SGD on Opacus (per-sample clipping, Poisson
  sampling, noise multiplier or target ε calibrated once for the whole run,
  virtual steps, per-layer clipping) whose accountant persists across rounds in
  ``context.state``; :func:`dp_sgd_train_reply` is the ``@app.train`` glue.
  Imported lazily (Opacus takes seconds to import and reconfigures logging).
"""

from typing import TYPE_CHECKING

#: name -> submodule: imported on first use (PEP 562), so a ClientApp that uses one mod does not pay
#: for torch (label DP: 1.5 s per ClientApp process) or Opacus (DP-SGD) at start-up.
_LAZY = {
    "covariance_reply": "federated_pca",
    "project": "federated_pca",
    "projection_from_state": "federated_pca",
    "store_projection": "federated_pca",
    "FunctionalMechanismTrainer": "functional_mechanism",
    "LabelDp": "label_dp",
    "LABEL_DP_DECLARATION": "label_dp_data",
    "LabelDpDataset": "label_dp_data",
    "declare_label_release": "label_dp_data",
    "is_label_release_declared": "label_dp_data",
    "label_release_event": "label_dp_data",
    "private_labels": "label_dp_data",
    "LaplaceInferenceMod": "laplace_inference",
    "laplace_eval_epsilon": "laplace_inference",
    "LocalUpdateNoiseMod": "local_update_noise",
    "SecureObjectiveTrainer": "secure_objective",
}

_DP_SGD_NAMES = (
    "DpSgdBudgetExhausted",
    "DpSgdRound",
    "DpSgdTrainer",
    "EPSILON_METRIC",
    "ROUND_EPSILON_METRIC",
    "STATE_KEY",
    "choose_grad_sample_mode",
    "combined_noise_multiplier",
    "declare_opacus_round",
    "dp_sgd_event",
    "dp_sgd_train_reply",
)
_LAZY.update({name: "dp_sgd" for name in _DP_SGD_NAMES})

# Mods named like their module are bound eagerly: ``import client_mods.signds_mod`` anywhere would
# otherwise leave the *module* under ``client_mods.signds_mod`` (the import system binds it).
from .adaptive_clipping_mod import adaptive_clipping_mod  # noqa: E402
from .distributed_dp_mod import distributed_dp_mod, make_distributed_dp_mod  # noqa: E402
from .signds_mod import make_signds_mod, signds_mod  # noqa: E402

if TYPE_CHECKING:  # static analysers and the docs generator see the real names
    from .federated_pca import covariance_reply, project, projection_from_state, store_projection
    from .functional_mechanism import FunctionalMechanismTrainer
    from .label_dp import LabelDp
    from .label_dp_data import (
        LABEL_DP_DECLARATION,
        LabelDpDataset,
        declare_label_release,
        is_label_release_declared,
        label_release_event,
        private_labels,
    )
    from .laplace_inference import LaplaceInferenceMod, laplace_eval_epsilon
    from .local_update_noise import LocalUpdateNoiseMod


#: former names -> "module:new name": they still resolve, with a DeprecationWarning naming the new import.
_MOVED = {"LabelDP": "client_mods:LabelDp", "LabelDPDataset": "client_mods:LabelDpDataset"}


def __getattr__(name: str):
    """Import the submodule that defines ``name`` on first use (Opacus, torch: seconds)."""
    module = _LAZY.get(name)
    if module is None:
        from flwr_dp_strategies._deprecation import resolve_moved

        return resolve_moved(__name__, name, _MOVED)
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    *_DP_SGD_NAMES,
    "FunctionalMechanismTrainer",
    "adaptive_clipping_mod",
    "distributed_dp_mod",
    "LABEL_DP_DECLARATION",
    "covariance_reply",
    "project",
    "projection_from_state",
    "store_projection",
    "LabelDp",
    "LabelDpDataset",
    "LaplaceInferenceMod",
    "LocalUpdateNoiseMod",
    "SecureObjectiveTrainer",
    "declare_label_release",
    "is_label_release_declared",
    "label_release_event",
    "laplace_eval_epsilon",
    "make_distributed_dp_mod",
    "make_signds_mod",
    "private_labels",
    "signds_mod",
]
