"""Per-round log (central test accuracy and epsilon), results JSON and plot."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flwr.app import ArrayRecord, Message, MetricRecord

from flwr_dp_experiments.results import RESULTS_JSON, RESULTS_PNG, write_run_results
from flwr_dp_experiments.results import finite as _finite
from flwr_dp_strategies.privacy import PrivacyLedger

from . import task


def format_row(row: dict[str, Any], delta: float | None) -> str:
    """``round r  accuracy 0.xxx  epsilon y.yy (delta 1e-05)``."""
    if row["epsilon"] is None:
        privacy = "epsilon inf (no DP)"
    else:
        privacy = f"epsilon {row['epsilon']:.2f} (delta {delta:g})"
    suffix = "" if row["released"] else "  [budget exhausted: no release]"
    return f"round {row['round']}  accuracy {row['accuracy']:.3f}  {privacy}{suffix}"


@dataclass
class RoundLog:
    """``evaluate_fn`` for ``Strategy.start``: central test accuracy, plus ε from the ledger, per round."""

    model_kind: str
    ledger: PrivacyLedger | None = None
    initial_accuracy: float | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    _seen_events: int = 0

    def __post_init__(self) -> None:
        self._seen_events = _count_events(self.ledger) if self.ledger is not None else 0

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """Evaluate the global model on the central test split; log and print round >= 1."""
        model = task.build_model(self.model_kind)
        model.load_state_dict(arrays.to_torch_state_dict())
        _, _, x_test, y_test = task.load_data()
        loss, accuracy = task.test(model, x_test, y_test)
        if server_round == 0:
            self.initial_accuracy = accuracy
        else:
            row = {"round": server_round, "accuracy": accuracy, "loss": loss, **self._privacy()}
            self.rows.append(row)
            print(format_row(row, self.delta), flush=True)
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    @property
    def delta(self) -> float | None:
        """The ledger's δ (None without DP)."""
        return None if self.ledger is None else self.ledger.target_delta

    def _privacy(self) -> dict[str, Any]:
        """ε so far, and whether this round released a model (a new ledger event)."""
        if self.ledger is None:
            return {"epsilon": None, "released": True}
        events = _count_events(self.ledger)
        released, self._seen_events = events > self._seen_events, events
        return {"epsilon": _finite(self.ledger.epsilon()), "released": released}


class ReplyLog:
    """A Grid that counts, per round and phase, the replies and the failed (error) replies.

    Wraps the ServerApp's Grid for ``Strategy.start``: a node that dies during a
    round shows up as an error reply (in deployment, Flower's SuperLink answers
    ``NODE_UNAVAILABLE`` once the node missed its heartbeats), which the strategy
    drops; Flower 1.43 drops such a reply instead, and the node is counted as ``missing``. This records it with
    the error's code and reason, so ``results.json`` says which round lost a node; everything else is delegated
    to the Grid.
    """

    def __init__(self, grid: Any) -> None:
        self._grid = grid
        self.rows: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> list[Message]:
        """The Grid's send_and_receive; logs sent/ok/failed and prints a line when replies failed."""
        from flwr_dp_strategies.rounds.exchange import exchange  # Flower's, without waiting for a node that left

        messages = list(messages)
        replies = exchange(self._grid, messages, timeout)
        if not messages:
            return replies
        # An error reply made by the SuperLink comes from the SuperLink's node ID, not from the
        # node that failed: find that node through the message the error replies to.
        destination = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}
        failed = [reply for reply in replies if reply.has_error()]
        row = {
            "round": _server_round(messages[0]),
            "phase": messages[0].metadata.message_type,
            "sent": len(messages),
            "replies": len(replies) - len(failed),
            "failed": len(failed),
            "missing": len(messages) - len(replies),
            "errors": [
                {
                    "node": destination.get(r.metadata.reply_to_message_id),
                    "code": int(r.error.code),
                    "reason": str(r.error.reason),
                }
                for r in failed
            ],
        }
        self.rows.append(row)
        if failed or row["missing"]:
            errors = "; ".join(f"node {e['node']}: {e['reason']}" for e in row["errors"])
            print(
                f"round {row['round']}  {row['phase']}: {row['replies']} of {row['sent']} nodes replied, "
                f"{row['failed']} failed ({errors})",
                flush=True,
            )
        return replies


def _server_round(message: Message) -> int | None:
    """The ``server-round`` the strategy put into a message's ConfigRecord (None if absent)."""
    for record in message.content.config_records.values():
        if "server-round" in record:
            return int(record["server-round"])
    return None


def _count_events(ledger: PrivacyLedger) -> int:
    """Central events plus every client's declared events."""
    return len(ledger.events()) + sum(len(ledger.events(client)) for client in ledger.clients)


#: mechanism -> (granularity, whose data one ε protects).
PRIVACY_UNITS = {
    "dp-sgd": ("record-level", "one training example of one client; worst client"),
    "local-dp": ("user-level", "one client's whole data, local DP; worst client"),
}
DEFAULT_UNIT = ("user-level", "one client's whole data")


def privacy_unit(mechanism: str) -> str:
    """Whose data one ε protects under ``mechanism``, e.g. ``"record-level (one training example ...)"``."""
    level, whose = PRIVACY_UNITS.get(mechanism, DEFAULT_UNIT)
    return f"{level} ({whose})"


def noise_multiplier(config: dict[str, Any]) -> float:
    """The noise multiplier z the mechanism uses."""
    key = {"local-dp": "local-noise-multiplier", "dp-sgd": "dp-sgd-noise-multiplier"}.get(
        str(config["mechanism"]), "noise-multiplier"
    )
    return float(config[key])


def privacy_summary(ledger: PrivacyLedger | None, config: dict[str, Any]) -> dict[str, Any] | None:
    """What the final ε means, for the results JSON."""
    if ledger is None:
        return None
    report = ledger.report()
    return {
        "epsilon": _finite(report.epsilon),
        "delta": report.delta,
        "method": report.method,
        "epsilon_rdp": _finite(report.epsilon_rdp),
        "epsilon_pld": _finite(report.epsilon_pld),
        "neighboring_relation": ledger.neighboring_relation,
        "unit": privacy_unit(str(config["mechanism"])),
        "noise_multiplier": noise_multiplier(config),
        "clipping_norm": float(config["clipping-norm"]),
        "clients_per_round": int(config["num-partitions"]),
        "sampling_amplification": config["mechanism"] in ("central-dp-poisson", "dp-sgd"),
        "max_epsilon": ledger.max_epsilon,
        "releases": len(ledger.events()),
    }


def _metrics_by_round(history: dict[int, MetricRecord]) -> dict[str, dict[str, Any]]:
    """``{round: {key: value}}`` of a Result's per-round MetricRecords, JSON-safe."""
    return {
        str(rnd): {key: (_finite(value) if isinstance(value, float) else value) for key, value in record.items()}
        for rnd, record in sorted(history.items())
    }


def write_results(
    log: RoundLog, config: dict[str, Any], results_dir: str, result: Any = None, replies: ReplyLog | None = None
) -> str:
    """Write results.json and results.png into ``results_dir`` (the shared writer); return the JSON path.

    ``result`` (the strategy's ``Result``) adds the aggregated train and evaluate
    metrics of every round; ``replies`` adds the replies and failures per round.
    """
    mechanism = str(config["mechanism"])
    extra: dict[str, Any] = {"mechanism": mechanism, "config": config, "privacy": privacy_summary(log.ledger, config)}
    if result is not None:
        extra["train_metrics"] = _metrics_by_round(result.train_metrics_clientapp)
        extra["evaluate_metrics"] = _metrics_by_round(result.evaluate_metrics_clientapp)
    if replies is not None:
        extra["replies"] = replies.rows
    level = PRIVACY_UNITS.get(mechanism, DEFAULT_UNIT)[0]
    return write_run_results(
        results_dir,
        mechanism,
        log.rows,
        extra=extra,
        initial_accuracy=log.initial_accuracy,
        delta=float(config["target-delta"]),
        epsilon_label=f"epsilon ({level})",
        json_name=RESULTS_JSON,
        png_name=RESULTS_PNG,
    )
