"""Units of privacy (issue 40 item 4): record-level and client-level releases in one ledger.

A declaration carries ``unit`` ("record" or "client", default "client"); the server books it with that unit;
a ledger holding record-level bookings publishes ``privacy/epsilon-record-level`` and
``privacy/epsilon-client-level`` beside the composed ``privacy/epsilon``.
"""

from __future__ import annotations

import gc
import json
import logging

import numpy as np
import pytest
from dp_accounting.dp_event import (
    ComposedDpEvent,
    GaussianDpEvent,
    LaplaceDpEvent,
    NonPrivateDpEvent,
    PoissonSampledDpEvent,
    SelfComposedDpEvent,
)
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from loopback import LoopbackGrid, run_round
from flwr_dp_strategies import AccountedFedAvg, AccountedPoissonFixedClipping
from flwr_dp_strategies.declarations import (
    EVENTS_FIELD,
    PRIVACY_RECORD,
    MalformedDeclaration,
    declare_release,
    read_declarations,
)
from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.privacy.accounting.ledger_file import parse_body
from flwr_dp_strategies.rounds.published_keys import PUBLISHED

pytestmark = pytest.mark.usefixtures("task_identity")

RECORD_KEY = "privacy/epsilon-record-level"
CLIENT_KEY = "privacy/epsilon-client-level"
N = 4
DELTA = 1e-5
CENTRAL = PoissonSampledDpEvent(0.5, GaussianDpEvent(2.0))


def dp_sgd(z: float, steps: int = 20) -> SelfComposedDpEvent:
    return SelfComposedDpEvent(PoissonSampledDpEvent(0.05, GaussianDpEvent(z)), steps)


def mixed_ledger(rounds: int = 2) -> PrivacyLedger:
    """Central releases, per-node DP-SGD (record) events, and one node with a client-level release too."""
    ledger = PrivacyLedger(DELTA)
    for rnd in range(1, rounds + 1):
        ledger.record(CENTRAL, server_round=rnd, label="central")
        for node, z in ((1, 1.0), (2, 1.5), (3, 2.0)):
            ledger.record(dp_sgd(z), server_round=rnd, client=node, label="dp-sgd", unit="record")
        ledger.record(LaplaceDpEvent(2.0), server_round=rnd, client=3, label="inference")  # client level
    return ledger


# ---------------------------------------------------------------------------------------------- the ledger


def test_each_scoped_epsilon_is_that_of_a_ledger_holding_only_those_events():
    ledger = mixed_ledger()
    records, clients = PrivacyLedger(DELTA), PrivacyLedger(DELTA)
    for rnd, event, label in ledger.events():
        clients.record(event, server_round=rnd, label=label)
    for node in ledger.clients:
        for rnd, event, label in ledger.events(node, unit="record"):
            records.record(event, server_round=rnd, client=node, label=label)
        for rnd, event, label in ledger.events(node, unit="client"):
            clients.record(event, server_round=rnd, client=node, label=label)
    assert ledger.units(1) == {"record": 2, "client": 0} and ledger.units(3) == {"record": 2, "client": 2}
    record_level = ledger.record_level_report()
    client_level = ledger.client_level_report(central_covers_replies=True)
    assert record_level.epsilon == pytest.approx(records.epsilon(), rel=1e-12)
    assert record_level.client == "1"  # the least noisy DP-SGD
    assert client_level.epsilon == pytest.approx(clients.epsilon(), rel=1e-12)
    assert client_level.client == "3"  # the only node with its own client-level release
    assert 0 < record_level.epsilon < np.inf and 0 < client_level.epsilon < np.inf
    composed = ledger.epsilon()
    assert composed >= max(record_level.epsilon, client_level.epsilon)
    metrics = ledger.metrics(central_covers_replies=True)
    assert metrics["privacy/epsilon"] == pytest.approx(composed)
    assert metrics[RECORD_KEY] == pytest.approx(record_level.epsilon)
    assert metrics[CLIENT_KEY] == pytest.approx(client_level.epsilon)
    assert metrics[RECORD_KEY] > 0 and metrics["privacy/epsilon"] >= max(metrics[RECORD_KEY], metrics[CLIENT_KEY])


def test_without_record_level_events_nothing_new_is_published():
    ledger = PrivacyLedger(DELTA)
    ledger.record(CENTRAL, server_round=1)
    ledger.record(dp_sgd(1.0), server_round=1, client=1)  # no unit: client level, as before
    assert not ledger.has_record_level()
    assert RECORD_KEY not in ledger.metrics() and CLIENT_KEY not in ledger.metrics(central_covers_replies=True)
    assert ledger.metrics() == ledger.metrics(central_covers_replies=True)
    assert '"record_level"' not in ledger.to_json()  # the body a ledger without units always had


def test_record_level_replies_not_covered_by_a_central_release_have_no_client_level_bound():
    ledger = mixed_ledger()
    assert ledger.client_level_report().epsilon == np.inf  # the ledger alone cannot know what covers them
    assert ledger.metrics()[CLIENT_KEY] == np.inf
    assert np.isfinite(ledger.metrics()[RECORD_KEY])


def test_a_non_private_release_is_non_private_at_every_unit():
    ledger = mixed_ledger()
    ledger.record(NonPrivateDpEvent(), server_round=3, label="client metrics published un-noised")
    assert ledger.record_level_report().epsilon == np.inf
    assert ledger.client_level_report(central_covers_replies=True).epsilon == np.inf
    ledger = mixed_ledger()
    ledger.record(NonPrivateDpEvent(), server_round=3, client=2, label="raw", unit="record")
    assert ledger.non_private_clients() == ["2"]  # left out of every worst case, as of privacy/epsilon
    assert np.isfinite(ledger.record_level_report().epsilon)
    assert ledger.record_level_report().client == "1"


def test_a_non_private_release_inside_a_composed_event_is_non_private_too():
    """Before: only a top-level ``NonPrivateDpEvent`` was recognised; one composed into a declaration left the
    record-level figure finite and its client among the protocol-following ones."""
    nested = ComposedDpEvent([GaussianDpEvent(2.0), NonPrivateDpEvent()])
    ledger = mixed_ledger()
    ledger.record(nested, server_round=3, label="metrics and a model")  # central
    assert ledger.record_level_report().epsilon == np.inf
    assert ledger.client_level_report(central_covers_replies=True).epsilon == np.inf
    ledger = mixed_ledger()
    ledger.record(nested, server_round=3, client=3, label="inference and raw metrics")  # client level, node 3
    assert ledger.non_private_clients() == ["3"]
    ledger = mixed_ledger()
    ledger.record(SelfComposedDpEvent(NonPrivateDpEvent(), 2), server_round=3, client=2, label="raw", unit="record")
    assert ledger.non_private_clients() == ["2"]
    # positive control: a composition without one stays private
    ledger = mixed_ledger()
    ledger.record(ComposedDpEvent([GaussianDpEvent(2.0)]), server_round=3, client=2, label="private", unit="record")
    assert ledger.non_private_clients() == [] and np.isfinite(ledger.record_level_report().epsilon)


def test_the_ledger_refuses_a_bad_unit():
    ledger = PrivacyLedger(DELTA)
    with pytest.raises(ValueError, match="unit"):
        ledger.record(CENTRAL, server_round=1, client=1, unit="household")
    with pytest.raises(ValueError, match="unit"):
        ledger.record(CENTRAL, server_round=1, unit=None)  # a central event's unit is checked too
    with pytest.raises(ValueError, match="unit"):
        ledger.events(1, unit="records")
    assert not ledger.clients and not ledger.rounds()


#: a central release calibrated for one record of any client (SecureObjectiveSum's Skellam sum)
CENTRAL_RECORD = GaussianDpEvent(3.0)


def with_central_record(ledger: PrivacyLedger, rnd: int = 3) -> PrivacyLedger:
    ledger.record(CENTRAL_RECORD, server_round=rnd, label="central record-level", unit="record")
    return ledger


def test_a_central_record_level_event_counts_at_the_record_level_and_bounds_no_client():
    ledger = with_central_record(mixed_ledger())
    assert ledger.has_record_level()
    assert [(r, e) for r, e, _ in ledger.events(unit="record")] == [(3, CENTRAL_RECORD)]
    assert [r for r, _, _ in ledger.events(unit="client")] == [1, 2]  # CENTRAL, client level
    assert len(ledger.events()) == 3
    records = PrivacyLedger(DELTA)  # each node's own record-level events and the central record-level one
    records.record(CENTRAL_RECORD, server_round=3)
    for node in ledger.clients:
        for rnd, event, label in ledger.events(node, unit="record"):
            records.record(event, server_round=rnd, client=node, label=label)
    record_level = ledger.record_level_report()
    assert record_level.epsilon == pytest.approx(records.epsilon(), rel=1e-12)
    assert record_level.epsilon > mixed_ledger().record_level_report().epsilon  # it was left out
    for covered in (False, True):  # one record of any client bounds nothing about a client's whole data
        assert ledger.client_level_report(central_covers_replies=covered).epsilon == np.inf
    composed = PrivacyLedger(DELTA)  # privacy/epsilon: everything composed, whatever the unit
    for node in [None, *ledger.clients]:
        for rnd, event, label in ledger.events(node):
            composed.record(event, server_round=rnd, client=node, label=label)
    assert ledger.epsilon() == pytest.approx(composed.epsilon(), rel=1e-12)
    metrics = ledger.metrics(central_covers_replies=True)
    assert metrics[RECORD_KEY] == pytest.approx(record_level.epsilon) and metrics[CLIENT_KEY] == np.inf
    assert metrics["privacy/epsilon"] == pytest.approx(composed.epsilon())


def test_a_central_record_level_event_alone_publishes_both_figures():
    ledger = with_central_record(PrivacyLedger(DELTA), rnd=1)
    only = PrivacyLedger(DELTA)
    only.record(CENTRAL_RECORD, server_round=1)
    assert ledger.has_record_level() and ledger.units(1) == {"record": 0, "client": 0}
    metrics = ledger.metrics()
    assert metrics[RECORD_KEY] == pytest.approx(only.epsilon()) and 0 < metrics[RECORD_KEY] < np.inf
    assert metrics[CLIENT_KEY] == np.inf
    assert metrics["privacy/epsilon"] == pytest.approx(only.epsilon())
    ledger.record(NonPrivateDpEvent(), server_round=2, label="raw metrics")  # non-private: at every unit
    assert ledger.record_level_report().epsilon == np.inf


# ---------------------------------------------------------------------------------------------- persistence


def test_save_and_load_keep_a_central_record_level_event(tmp_path):
    ledger = with_central_record(mixed_ledger())
    body = json.loads(ledger.to_json())
    assert list(body["central_record_level"].values()) == [[3]]
    assert "central_record_level" not in mixed_ledger().to_json()  # written only when there is one
    path = tmp_path / "ledger.json"
    ledger.save(path)
    loaded = PrivacyLedger.load(path)
    assert loaded.to_json() == ledger.to_json()
    assert [(r, e) for r, e, _ in loaded.events(unit="record")] == [(3, CENTRAL_RECORD)]
    assert loaded.metrics() == pytest.approx(ledger.metrics())
    assert loaded.client_level_report(central_covers_replies=True).epsilon == np.inf


def test_a_body_without_the_central_record_level_field_loads_as_before():
    ledger = with_central_record(mixed_ledger())
    body = json.loads(ledger.to_json())
    del body["central_record_level"]  # what a body saved before central record-level events holds
    old = PrivacyLedger.from_json(json.dumps(body))
    assert old.events(unit="record") == [] and len(old.events(unit="client")) == 3
    assert old.epsilon() == pytest.approx(ledger.epsilon())
    assert np.isfinite(old.client_level_report(central_covers_replies=True).epsilon)
    assert json.loads(old.to_json()) == body  # and it writes the body it was loaded from


@pytest.mark.parametrize(
    "central_record_level",
    [
        {},  # written only when non-empty
        [],
        {"K": "3"},
        {"K": []},
        {"K": [4]},  # a round not booked for that central event
        {"K": [3, 3]},  # more bookings than the central event has
        {"unknown-event": [3]},
        {"C": [1]},  # an event booked for a client, not centrally
    ],
)
def test_a_malformed_central_record_level_field_is_refused(central_record_level):
    body = json.loads(with_central_record(mixed_ledger()).to_json())
    parse_body(json.dumps(body))  # the well-formed field is accepted
    key = next(iter(body["central_record_level"]))
    client_key = next(k for k in body["clients"]["1"])
    text = json.dumps(central_record_level).replace('"K"', json.dumps(key)).replace('"C"', json.dumps(client_key))
    body["central_record_level"] = json.loads(text)
    with pytest.raises(ValueError, match="central_record_level"):
        parse_body(json.dumps(body))
    with pytest.raises(ValueError):
        PrivacyLedger.from_json(json.dumps(body))


def test_a_ledger_body_without_units_loads_as_client_level():
    ledger = mixed_ledger()
    body = json.loads(ledger.to_json())
    assert set(body["record_level"]) == {"1", "2", "3"}
    del body["record_level"]  # what a ledger saved before units existed holds
    old = PrivacyLedger.from_json(json.dumps(body))
    assert not old.has_record_level() and old.units(1) == {"record": 0, "client": 2}
    assert old.epsilon() == pytest.approx(ledger.epsilon())
    assert RECORD_KEY not in old.metrics()


def test_a_saved_file_without_units_loads_as_client_level(tmp_path):
    ledger = PrivacyLedger(DELTA)
    ledger.record(CENTRAL, server_round=1)
    ledger.record(dp_sgd(1.0), server_round=1, client=7)
    path = tmp_path / "old.json"
    ledger.save(path)
    assert "record_level" not in path.read_text()
    loaded = PrivacyLedger.load(path)
    assert loaded.units(7) == {"record": 0, "client": 1} and not loaded.has_record_level()


def test_save_and_load_keep_the_units(tmp_path):
    ledger = mixed_ledger()
    path = tmp_path / "ledger.json"
    ledger.save(path)
    loaded = PrivacyLedger.load(path)
    assert loaded.to_json() == ledger.to_json()
    assert loaded.units(3) == {"record": 2, "client": 2}
    assert loaded.metrics(central_covers_replies=True) == pytest.approx(ledger.metrics(central_covers_replies=True))


@pytest.mark.parametrize(
    "record_level",
    [
        {},  # written only when non-empty
        {"9": {"K": [1]}},  # a client not in clients
        {"1": {"K": [5]}},  # a round not booked for that client and event
        {"1": {"K": [1, 1, 1]}},  # more bookings than the client has
        {"1": []},
        {"1": {}},
    ],
)
def test_a_malformed_record_level_field_is_refused(record_level):
    ledger = mixed_ledger()
    body = json.loads(ledger.to_json())
    key = next(iter(body["clients"]["1"]))
    body["record_level"] = json.loads(json.dumps(record_level).replace('"K"', json.dumps(key)))
    with pytest.raises(ValueError):
        parse_body(json.dumps(body))


# ---------------------------------------------------------------------------------------------- declarations


def test_a_declaration_carries_its_unit_and_defaults_to_client():
    content = RecordDict()
    declare_release(content, dp_sgd(1.0), label="dp-sgd", neighboring_relation="add_or_remove_one", unit="record")
    declare_release(content, LaplaceDpEvent(1.0), label="ldp", neighboring_relation="replace_one")
    entries = content.config_records[PRIVACY_RECORD][EVENTS_FIELD]
    assert "unit" not in json.loads(entries[1])  # a client-level declaration is byte-for-byte as before
    assert [d.unit for d in read_declarations(content)] == ["record", "client"]
    with pytest.raises(ValueError, match="unit"):
        declare_release(content, dp_sgd(1.0), label="x", neighboring_relation="replace_one", unit="example")


@pytest.mark.parametrize("unit", ["household", "", None, 1, ["record"], "Record"])
def test_a_malformed_unit_is_a_malformed_declaration(unit):
    entry = json.dumps({"event": {"type": "NoOpDpEvent"}, "label": "", "relation": "replace_one", "unit": unit})
    with pytest.raises(MalformedDeclaration, match="unit"):
        read_declarations(RecordDict({PRIVACY_RECORD: ConfigRecord({EVENTS_FIELD: [entry]})}))


def test_record_level_client_mechanisms_declare_unit_record():
    from client_mods.dp_sgd import declare_opacus_round
    from client_mods.label_dp_data import declare_label_release, private_labels

    class Engine:  # an Opacus PrivacyEngine's accountant history: (z, q, steps)
        class accountant:  # noqa: N801
            history = [(1.0, 0.05, 20)]

    content = declare_opacus_round(RecordDict(), Engine())  # the DP-SGD event and the dataset size it reveals
    assert [d.unit for d in read_declarations(content)] == ["record", "record"]
    context = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})
    private_labels(context, np.array([0, 1, 2, 1]), eps=1.0, num_classes=3, rng=0)
    for _ in range(2):  # the release, then its post-processing
        content = RecordDict()
        declare_label_release(context, content)
        assert [d.unit for d in read_declarations(content)] == ["record"]


# ---------------------------------------------------------------------------------------------- rounds


def _model() -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros(3))})


def _client(unit, bad_node: int | None = None):
    def answer(msg: Message) -> Message:
        node = msg.metadata.dst_node_id
        arrays = ArrayRecord({"w": Array(np.full(3, 0.01 * (node - 100)))})
        content = RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": 1.0})})
        kwargs = {} if unit is None else {"unit": unit}
        declare_release(
            content,
            dp_sgd(1.0 + 0.1 * (node - 100)),
            label="dp-sgd",
            neighboring_relation="add_or_remove_one",
            **kwargs,
        )
        if node == bad_node:  # a declaration with an unknown unit, written by hand
            entries = list(content.config_records[PRIVACY_RECORD][EVENTS_FIELD])
            data = json.loads(entries[0])
            data["unit"] = "household"
            content.config_records[PRIVACY_RECORD][EVENTS_FIELD] = [json.dumps(data)]
        return Message(content, reply_to=msg)

    return answer


def _poisson(**kwargs):
    return AccountedPoissonFixedClipping(
        FedAvg(fraction_train=1.0, min_available_nodes=N, min_train_nodes=1, weighted_by_key="num-examples"),
        0.8,
        1.0,
        N,  # q = 1: every node every round, a fixed public count
        num_clients=N,
        ledger=PrivacyLedger(DELTA),
        rng=0,
        **kwargs,
    )


def _rounds(strategy, unit, rounds=2, bad_node=None) -> dict[str, float]:
    grid = LoopbackGrid.of(N, _client(unit, bad_node))
    metrics: dict[str, float] = {}
    for rnd in range(1, rounds + 1):
        arrays, published = run_round(strategy, grid, _model(), rnd).result
        assert arrays is not None
        metrics = dict(published or {})
    assert grid.errors == []
    return metrics


def test_a_central_dp_round_over_dp_sgd_clients_publishes_both_guarantees():
    strategy = _poisson()
    metrics = _rounds(strategy, "record")
    ledger = strategy.ledger
    assert ledger.has_record_level() and all(ledger.units(n) == {"record": 2, "client": 0} for n in ledger.clients)
    assert [r for r, _, _ in ledger.events()] == [1, 2]  # the central release, client level
    assert metrics[RECORD_KEY] == pytest.approx(ledger.record_level_report().epsilon)
    assert metrics[CLIENT_KEY] == pytest.approx(ledger.client_level_report(central_covers_replies=True).epsilon)
    only_central = PrivacyLedger(DELTA)
    for rnd, event, _ in ledger.events():
        only_central.record(event, server_round=rnd)
    assert metrics[CLIENT_KEY] == pytest.approx(only_central.epsilon())  # every reply is covered by the central noise
    assert 0 < metrics[CLIENT_KEY] < np.inf and 0 < metrics[RECORD_KEY] < np.inf
    assert metrics["privacy/epsilon"] >= max(metrics[RECORD_KEY], metrics[CLIENT_KEY])
    assert {RECORD_KEY, CLIENT_KEY} <= set(PUBLISHED)


def test_without_record_level_declarations_the_round_publishes_what_it_did():
    strategy = _poisson()
    metrics = _rounds(strategy, None)
    assert RECORD_KEY not in metrics and CLIENT_KEY not in metrics
    assert not strategy.ledger.has_record_level()
    assert np.isfinite(metrics["privacy/epsilon"])


def test_accounted_fedavg_over_dp_sgd_clients_has_no_client_level_bound():
    strategy = AccountedFedAvg(
        fraction_train=1.0, min_available_nodes=N, min_train_nodes=1, ledger=PrivacyLedger(DELTA)
    )
    metrics = _rounds(strategy, "record", rounds=1)
    assert metrics[CLIENT_KEY] == np.inf  # the model is the plain mean of record-level replies
    assert metrics[RECORD_KEY] == pytest.approx(metrics["privacy/epsilon"])


def test_a_malformed_unit_rejects_the_reply_and_the_round_goes_on(caplog):
    strategy = _poisson()
    with caplog.at_level(logging.WARNING):
        metrics = _rounds(strategy, "record", rounds=1, bad_node=102)
    assert strategy.rejections["train"]["declaration"] == 1
    assert "unit" in caplog.text
    assert "102" not in strategy.ledger.clients  # nothing booked for it
    assert sorted(strategy.ledger.clients) == ["101", "103", "104"]
    assert np.isfinite(metrics[RECORD_KEY])


def test_a_restarted_strategy_keeps_the_units(tmp_path):
    path = str(tmp_path / "ledger.json")
    first = _poisson(ledger_path=path)
    _rounds(first, "record", rounds=1)
    saved = first.ledger.to_json()
    del first
    gc.collect()  # the file's lock is released with its store
    again = AccountedPoissonFixedClipping(
        FedAvg(fraction_train=1.0, min_available_nodes=N, min_train_nodes=1, weighted_by_key="num-examples"),
        0.8,
        1.0,
        N,
        num_clients=N,
        ledger_path=path,
        resume=True,
        rng=0,
    )
    assert again.ledger.to_json() == saved
    assert all(again.ledger.units(n) == {"record": 1, "client": 0} for n in again.ledger.clients)
    before = again.ledger.metrics(central_covers_replies=True)
    arrays, metrics = run_round(again, LoopbackGrid.of(N, _client("record")), _model(), 2).result
    assert all(again.ledger.units(n) == {"record": 2, "client": 0} for n in again.ledger.clients)
    assert metrics[RECORD_KEY] > before[RECORD_KEY]


def _secure_objective_sum(**kwargs):
    from flwr_dp_strategies import SecureObjectiveSum

    return SecureObjectiveSum(num_classes=3, max_records=1000, epsilon=1.0, bits=32, min_survivors=8, **kwargs)


def _secure_objective_round(strategy) -> dict[str, float]:
    from client_mods.secure_objective import SecureObjectiveTrainer
    from flwr.clientapp import ClientApp
    from secagg_harness import TEST_FLOOR, LazyRoster
    from secagg_harness import LoopbackGrid as SecAggGrid

    nodes, q, c = list(range(201, 211)), 6, 3
    rng = np.random.default_rng(1)
    data = {n: (rng.normal(size=(30, q)), rng.integers(0, c, size=30)) for n in nodes}
    roster = LazyRoster(len(nodes) + 8)
    trainers = {
        n: SecureObjectiveTrainer(num_classes=c, rng=n, min_noise_multiplier=TEST_FLOOR, identity=roster) for n in nodes
    }
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        node = int(context.node_id)
        return trainers[node].train(msg, context, *data[node])

    _, _, (arrays, metrics) = run_round(
        strategy, SecAggGrid(app, nodes), ArrayRecord({"head.weight": Array(np.zeros((q, c)))})
    )
    assert arrays is not None
    return dict(metrics)


def test_secure_objective_sum_books_a_record_level_event_with_no_client_level_bound(tmp_path):
    from flwr_dp_strategies.strategy.secure_objective_sum import EVENT_LABEL

    path = str(tmp_path / "ledger.json")
    strategy = _secure_objective_sum(ledger_path=path)
    metrics = _secure_objective_round(strategy)
    ledger = strategy.ledger
    ((rnd, event, label),) = ledger.events(unit="record")  # central (client=None), record level
    assert label == EVENT_LABEL and ledger.events(unit="client") == [] and not ledger.clients
    fresh = PrivacyLedger(DELTA)
    fresh.record(event, server_round=rnd)
    assert 0 < fresh.epsilon() <= 1.0 + 1e-9
    assert metrics[RECORD_KEY] == pytest.approx(fresh.epsilon())  # the Skellam event's ε, one record of any client
    assert metrics[CLIENT_KEY] == np.inf  # calibrated for one record: nothing bounds a client's whole data
    assert metrics["privacy/epsilon"] == pytest.approx(fresh.epsilon())  # unchanged
    saved = ledger.to_json()
    del strategy, ledger
    gc.collect()  # the file's lock is released with its store
    again = _secure_objective_sum(ledger_path=path, resume=True)
    assert again.ledger.to_json() == saved and again.ledger.has_record_level()
    assert again.ledger.metrics() == pytest.approx({k: v for k, v in metrics.items() if k.startswith("privacy/")})


def test_which_strategies_cover_every_reply_with_a_client_level_release():
    from flwr_dp_strategies import DistributedDpFedAvg, SecureObjectiveSum
    from flwr_dp_strategies.strategy import AccountedServerSideFixedClipping

    assert (
        AccountedPoissonFixedClipping.central_covers_replies and AccountedServerSideFixedClipping.central_covers_replies
    )
    assert DistributedDpFedAvg.central_covers_replies  # one client's clipped update added or removed
    assert not SecureObjectiveSum.central_covers_replies  # its noise is calibrated for one record
    assert not AccountedFedAvg.central_covers_replies  # the model is the plain mean of the replies
