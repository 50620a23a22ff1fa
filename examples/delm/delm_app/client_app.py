"""ClientApp: the client's side of DELM (Algorithm 1 with the LDP-FPCA of Algorithm 2).

* ``train.pca``: the noisy second moment of the client's unit-norm features
  (Analyze Gauss, ε/3 of the client's budget), declared (:func:`covariance_reply`);
* ``train.pca_projection``: keep the server's projection V in ``context.state``;
* ``train``: the functional-mechanism head on xᵀV (2ε/3, released once, kept in
  ``context.state``; later rounds are post-processing and declare ``NoOpDpEvent``);
  with ``components`` = 0 there is no PCA and the head sits on the unit-norm pixels
  with the whole ε. With ``variant`` = "sum" the reply is the noisy objective itself.

Settings come from the run config (``flwr run``) or ``DELM_RUN_CONFIG``
(``run_demo.py``); the partition from ``node_config``. The privacy settings are
the client's own: in a real deployment each node would fix them itself.
"""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client_mods import FunctionalMechanismTrainer
from client_mods.federated_pca import covariance_reply, project, projection_from_state, store_projection

from . import task
from .config import fm_epsilon, resolve_run_config

app = ClientApp()
RELATION = "replace_one"  # the paper's neighbouring relation; the server's ledger uses the same


def _data(context: Context) -> tuple[dict, object, object]:
    config = resolve_run_config(context)
    x, y = task.client_data(
        config, int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    )
    return config, x, y


@app.train("pca")
def pca(msg: Message, context: Context) -> Message:
    """Reply with the noisy second moment of the local features (ε/3)."""
    config, x, _ = _data(context)
    return covariance_reply(
        msg,
        context,
        x,
        epsilon=float(config["epsilon"]) / 3.0,
        delta=float(config["target-delta"]),
        neighboring_relation=RELATION,
    )


@app.train("pca_projection")
def projection(msg: Message, context: Context) -> Message:
    """Store the server's projection."""
    return store_projection(msg, context)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """A few gradient steps on the client's noisy FM objective (released once) from the global head;
    with ``variant`` = "sum", that noisy objective itself (for NoisyObjectiveSum)."""
    config, x, y = _data(context)
    features = project(x, projection_from_state(context)) if int(config["components"]) > 0 else x
    trainer = FunctionalMechanismTrainer(
        fm_epsilon(config),
        num_classes=task.num_classes(config),
        noise=str(config["fm-noise"]),
        delta=float(config["target-delta"]),
        neighboring_relation=RELATION,
        calibration=str(config["fm-calibration"]),
        local_steps=int(config["local-steps"]),
        learning_rate=None,
        max_learning_rate=float(config["max-lr"]),
        ridge=float(config["ridge"]),
        upload="objective" if config["variant"] == "sum" else "head",
    )
    return trainer.train(msg, context, features, y)
