"""SignDS with MagRR, Flower-free core.

SignDS: Jiang, Zhou, Grossklags, "SignDS-FL: Local Differentially-Private Federated Learning with
Sign-based Dimension Selection", ACM TIST 2022;
MagRR and the parameter domains as in MindSpore Federated's local-DP SignDS training.

* :func:`encode_update` - the client algorithm on a flat update vector;
* :func:`optimal_output_dim` - h when ``sign_dim_out = 0`` (exact, log space);
* :mod:`.magrr` - the step-size estimate (client bit, server debiasing and phases);
* :func:`round_event` - one round's DpEvent (ε-LDP index set + ε_rr RR bit).
"""

from .encoder import SignDSUpload, encode_update, output_dim, round_event
from .magrr import MagRRConfig, MagRRState, debiased_ones, magnitude_bit, step_size, update_state
from .params import SignDSParams, check_global_lr
from .selection import MAX_DIM_OUT, optimal_output_dim, optimal_threshold

__all__ = [
    "MAX_DIM_OUT",
    "MagRRConfig",
    "MagRRState",
    "SignDSParams",
    "SignDSUpload",
    "check_global_lr",
    "debiased_ones",
    "encode_update",
    "magnitude_bit",
    "optimal_output_dim",
    "optimal_threshold",
    "output_dim",
    "round_event",
    "step_size",
    "update_state",
]
