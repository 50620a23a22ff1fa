"""Client-side mechanisms for Flower ClientApps (mods, trainers, data wrappers).

Every mechanism here draws its noise from :mod:`flwr_dp_strategies.privacy`
(no mechanism is written twice), describes its release as a DpEvent and
declares it in the reply (:func:`flwr_dp_strategies.declare_release`), so an
accounting strategy (e.g. :class:`flwr_dp_strategies.AccountedFedAvg`) books
it per node.

Mods (act on a message):

* :class:`LaplaceInferenceMod` - ε-LDP Laplace noise on inference results
  (probability vectors, L1 sensitivity 2) in evaluate replies (seed 000);
  :func:`laplace_eval_epsilon` - the seed's ε for a target noise magnitude.
* :class:`LocalUpdateNoiseMod` - clip + analytic-Gaussian noise on model
  updates in train replies (local DP, LDP-FL).
"""

from .laplace_inference import LaplaceInferenceMod, laplace_eval_epsilon
from .local_update_noise import LocalUpdateNoiseMod

__all__ = ["LaplaceInferenceMod", "LocalUpdateNoiseMod", "laplace_eval_epsilon"]
