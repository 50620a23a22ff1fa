"""ServerApp: the label party of a vertical (split) learning run with label DP.

Custom ``@app.main()`` loop on the Grid (no Strategy: vertical FL exchanges
embeddings and gradients, not models). Per round r:

1. send each feature party a ``train`` message with the indices of batch r and,
   from round 2 on, the gradient for its embeddings of batch r-1;
2. the parties apply that gradient to their bottom models and reply with their
   embeddings of batch r;
3. the label party concatenates the embeddings (party order), computes the
   cross-entropy against its *randomised* labels, takes an Adam step on the top
   model and keeps the gradients w.r.t. each party's embeddings for step 1 of
   round r+1.

Every ``eval-every`` rounds and after the last one, an ``evaluate`` message
(carrying the pending gradient) asks for the embeddings of the test split; the
test accuracy is measured against the TRUE test labels (evaluation only, never
sent). Every round prints one progress line (``round r/N``, the loss on the
noisy labels, the test accuracy on evaluation rounds, ε and the elapsed
seconds). Results go to ``<results-dir>/<results-file>`` (default
``run-eps-<eps>.json``), with a plot of test accuracy and ε against the round
next to it (``.png``; see :mod:`.results`).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable
from typing import Any, Optional

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from flwr_dp_experiments.results import write_run_results
from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.privacy.accounting.events import event_to_dict

from . import task
from .config import label_epsilon, resolve_run_config
from .label_party import LabelParty, LabelRelease, make_label_party

app = ServerApp()

POLL_INTERVAL_S = 0.01
REPLY_TIMEOUT_S = 300.0
NODE_WAIT_S = 120.0


def wait_for_parties(grid: Grid, num_parties: int) -> list[int]:
    """Node ids of the feature parties, once ``num_parties`` nodes are connected."""
    deadline = time.monotonic() + NODE_WAIT_S
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= num_parties:
            return nodes[:num_parties]
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(nodes)} of {num_parties} feature parties connected")
        time.sleep(0.5)


def exchange(grid: Grid, messages: Iterable[Message]) -> list[Message]:
    """Push ``messages`` and pull every reply, polling every 10 ms (``send_and_receive`` may sleep 3 s).

    Vertical FL needs every party in every step, so a message that could not be sent (Flower 1.43's ``""`` id), an
    error reply or a timeout aborts the run.
    """
    messages = list(messages)
    ids = list(grid.push_messages(messages))
    failed = [int(m.metadata.dst_node_id) for m, i in zip(messages, ids) if not i]
    if failed:  # Flower 1.43's HttpGrid returns "" for a message it could not push: no reply will ever come
        raise RuntimeError(f"could not send to feature parties {failed}: every party is needed in every step")
    pending = set(ids)
    replies: list[Message] = []
    deadline = time.monotonic() + REPLY_TIMEOUT_S
    while pending:
        got = list(grid.pull_messages(pending))
        replies.extend(got)
        pending -= {reply.metadata.reply_to_message_id for reply in got}
        if pending and time.monotonic() > deadline:
            raise RuntimeError(f"{len(pending)} feature parties did not reply within {REPLY_TIMEOUT_S} s")
        if pending:
            time.sleep(POLL_INTERVAL_S)
    for reply in replies:
        if reply.has_error():
            raise RuntimeError(f"feature party {reply.metadata.src_node_id} failed: {reply.error.reason}")
    return replies


def party_config(config: dict[str, Any], server_round: int, experiment: str = "") -> ConfigRecord:
    """What the feature parties need: model sizes, learning rate, seeds and the split (no labels).

    ``experiment`` tags a run; a new tag makes the parties start fresh bottom models.
    """
    return ConfigRecord(
        {
            "server-round": server_round,
            "experiment": experiment,
            "num-parties": int(config["num-parties"]),
            "lr": float(config["lr"]),
            "hidden-dim": int(config["hidden-dim"]),
            "embedding-dim": int(config["embedding-dim"]),
            "seed": int(config["seed"]),
            "split-seed": int(config["split-seed"]),
            "test-fraction": float(config["test-fraction"]),
            "dataset": str(config["dataset"]),
            "data-dir": str(config["data-dir"]),
        }
    )


class Exchanges:
    """Requests embeddings from the feature parties, carrying each party's pending gradient once."""

    def __init__(self, grid: Grid, nodes: list[int], config: dict[str, Any], experiment: str = "") -> None:
        self.grid, self.nodes, self.config, self.experiment = grid, nodes, config, experiment
        self.party_of: dict[int, int] = {}
        self.pending: Optional[dict[int, np.ndarray]] = None

    def request(self, server_round: int, message_type: str, indices: Optional[np.ndarray]) -> list[np.ndarray]:
        """Embeddings (party order) of train ``indices``, or of the test split when ``indices`` is None."""
        messages = [
            Message(self._content(node, server_round, indices), dst_node_id=node, message_type=message_type)
            for node in self.nodes
        ]
        self.pending = None
        by_party = {}
        for reply in exchange(self.grid, messages):
            party = int(reply.content[task.PARTY]["party-id"])  # type: ignore[arg-type]
            self.party_of[reply.metadata.src_node_id] = party
            by_party[party] = reply.content[task.EMBEDDINGS]["embeddings"].numpy()
        if sorted(by_party) != list(range(len(self.nodes))):
            raise RuntimeError(f"expected party ids 0..{len(self.nodes) - 1}, got {sorted(by_party)}")
        return [by_party[p] for p in range(len(self.nodes))]

    def _content(self, node: int, server_round: int, indices: Optional[np.ndarray]) -> RecordDict:
        content = RecordDict({task.CONFIG: party_config(self.config, server_round, self.experiment)})
        if indices is not None:
            content[task.BATCH] = ArrayRecord({"indices": Array(indices.astype(np.int64))})
        if self.pending is not None:
            content[task.GRAD] = ArrayRecord({"grad": Array(self.pending[node])})
        return content

    def set_gradients(self, grads: list[np.ndarray]) -> None:
        """Remember each party's gradient, to send with the next request to that node."""
        node_of = {party: node for node, party in self.party_of.items()}
        self.pending = {node_of[p]: np.ascontiguousarray(g) for p, g in enumerate(grads)}


def evaluate(party: LabelParty, exchanges: Exchanges, server_round: int, test_labels: np.ndarray) -> float:
    """Test accuracy against the true test labels (the parties first apply their pending gradients)."""
    embeddings = exchanges.request(server_round, MessageType.EVALUATE, None)
    return float(np.mean(party.predict(embeddings) == test_labels))


def train(
    party: LabelParty,
    exchanges: Exchanges,
    config: dict[str, Any],
    test_labels: np.ndarray,
    epsilon: Optional[float] = None,
) -> list[dict[str, Any]]:
    """The round loop; returns one row per evaluation (round, test accuracy, mean loss on noisy labels, ε so
    far, elapsed seconds) and prints one progress line per round.

    ``epsilon`` is the ledger's ε (None: no label DP); the labels are released once, before round 1, so
    it is the same in every round.
    """
    num_rounds, every = int(config["num-server-rounds"]), int(config["eval-every"])
    rows: list[dict[str, Any]] = []
    losses: list[float] = []
    eps_text = "inf (no label DP)" if epsilon is None else f"{epsilon:.3f} (label-DP, released once)"
    start = time.perf_counter()
    for server_round in range(1, num_rounds + 1):
        indices = party.next_batch(int(config["batch-size"]))
        grads, loss = party.step(exchanges.request(server_round, MessageType.TRAIN, indices), indices)
        exchanges.set_gradients(grads)
        losses.append(loss)
        line = f"round {server_round}/{num_rounds}  loss (noisy labels) {loss:.3f}"
        if server_round % every == 0 or server_round == num_rounds:
            accuracy = evaluate(party, exchanges, server_round, test_labels)
            rows.append(
                {
                    "round": server_round,
                    "accuracy": accuracy,
                    "noisy_label_loss": float(np.mean(losses)),
                    "epsilon": epsilon,
                    "elapsed_s": time.perf_counter() - start,
                }
            )
            line += f"  test accuracy {accuracy:.3f}"
            losses = []
        print(f"{line}  epsilon {eps_text}  [{time.perf_counter() - start:.0f} s]", flush=True)
    return rows


def _finite(value: float) -> Optional[float]:
    return float(value) if math.isfinite(value) else None


def privacy_summary(ledger: PrivacyLedger, release: LabelRelease) -> dict[str, Any]:
    """The ledger's events and ε (label-level, replace_one), and the measured randomisation."""
    events = [
        {"client": client, "round": rnd, "event": event_to_dict(event), "label": label}
        for client in ledger.clients
        for rnd, event, label in ledger.events(client)
    ]
    dp = release.epsilon is not None
    return {
        "label_epsilon": release.epsilon,
        "neighboring_relation": ledger.neighboring_relation,
        "delta": ledger.target_delta,
        "ledger_epsilon": _finite(ledger.epsilon()) if events else None,
        "events": events,
        "num_labels": release.num_labels,
        "changed_fraction": release.changed_fraction,
        "expected_changed_fraction": release.expected_changed_fraction,
        "guarantee": (
            "each training label is eps-label-DP against replacement of that label (randomized "
            "response, once; everything sent to the feature parties is post-processing); the "
            "features are not protected"
        )
        if dp
        else "none (trained on the true labels)",
    }


def results_path(config: dict[str, Any]) -> str:
    """``<results-dir>/<results-file>``; default file name ``run-eps-<eps>.json``."""
    name = str(config["results-file"]) or f"run-eps-{config['label-epsilon']}.json"
    return os.path.join(os.path.abspath(str(config["results-dir"])), name)


def run_vertical(grid: Grid, context: Context, config: dict[str, Any], experiment: str = "") -> dict[str, Any]:
    """One vertical training run: randomise the labels once, train, evaluate; return the results.

    The label party's ``context.state`` keeps the randomised labels; give every
    experiment its own Context (a new randomisation is a new release).
    """
    start = time.perf_counter()
    ledger = PrivacyLedger(float(config["target-delta"]), neighboring_relation="replace_one")
    true_train, true_test = task.load_labels(
        float(config["test-fraction"]), int(config["split-seed"]), str(config["dataset"]), str(config["data-dir"])
    )
    party, release = make_label_party(context, config, true_train, ledger)
    del true_train  # from here on the label party only has the noisy train labels
    exchanges = Exchanges(grid, wait_for_parties(grid, int(config["num-parties"])), config, experiment)
    epsilon = _finite(ledger.epsilon()) if ledger.clients else None
    rows = train(party, exchanges, config, true_test, epsilon)
    eps = label_epsilon(config)
    return {
        "label_epsilon": "inf" if eps is None else eps,
        "final_accuracy": rows[-1]["accuracy"],
        "rounds": rows,
        "privacy": privacy_summary(ledger, release),
        "config": {k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in config.items()},
        "wall_s": time.perf_counter() - start,
    }


def write_json(results: dict[str, Any], path: str) -> str:
    """Write ``results`` to ``path`` (folders created); return the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as handle:
        json.dump(results, handle, indent=2)
        handle.write("\n")
    return path


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run once with the run config's ``label-epsilon``; write the results JSON and its plot.

    With ``sweep-file`` (a JSON list of run-config overrides), run those experiments one after the
    other instead (``run_experiment.py``) and write the list of their results to ``results-file``.
    """
    torch.set_num_threads(1)
    config = resolve_run_config(context)
    if str(config["sweep-file"]):
        from .sweep import run_sweep

        if not str(config["results-file"]):
            raise ValueError("sweep-file needs results-file (where the list of results goes)")
        with open(str(config["sweep-file"])) as handle:
            experiments = json.load(handle)
        path = write_json(run_sweep(grid, context, experiments), results_path(config))
        print(f"sweep of {len(experiments)} experiments: results written to {path}", flush=True)
        return
    results = run_vertical(grid, context, config)
    path = results_path(config)
    png = os.path.splitext(path)[0] + ".png"
    eps = results["label_epsilon"]
    write_run_results(
        os.path.dirname(path),
        f"label eps {eps}",
        results["rounds"],
        extra=results,
        json_name=os.path.basename(path),
        png_name=os.path.basename(png),
        title=f"vertical FL on {config['dataset']}\nlabel eps {eps}",
        accuracy_label="test accuracy (true labels)",
        epsilon_label="epsilon (label-level, replace-one)",
        no_dp_text="no label DP: epsilon = inf",
        epsilon_title="privacy spent\n(one randomized-response release, round 0)",
    )
    print(
        f"label eps {results['label_epsilon']}: final test accuracy {results['final_accuracy']:.3f}; "
        f"results written to {path}, plot to {png}",
        flush=True,
    )
