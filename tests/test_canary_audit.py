"""Canary audit (Andrew et al., ICLR 2024): the grid proxy, canary sampling, the alarm.

Real nodes run a ClientApp that trains trivially (a small fixed shift) on :class:`secagg_harness.LoopbackGrid`; the
canaries run in process behind :class:`CanaryGrid`. The statistics tests need
:mod:`flwr_dp_strategies.privacy.analyses.audit` and are skipped without it.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

from flwr_dp_strategies import AccountedPoissonFixedClipping, AccountedServerSideFixedClipping
from flwr_dp_strategies.audit import CANARY_ID_BASE, AuditReport, CanaryAudit, CanaryGrid, canary_client_app
from flwr_dp_strategies.audit.canaries import add_direction, flatten_arrays
from secagg_harness import LoopbackGrid

DIM = 2000
REAL = list(range(101, 111))


def model() -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros((40, 25), np.float32)), "b": Array(np.zeros(1000, np.float32))})


def real_app(scale: float = 0.01) -> ClientApp:
    """Each real node adds a fixed shift of norm ``scale`` (well below C): training, trivially."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        arrays = next(r for r in msg.content.values() if isinstance(r, ArrayRecord))
        rng = np.random.default_rng(int(context.node_id))
        shift = rng.normal(size=DIM)
        shift *= scale / np.linalg.norm(shift)
        return Message(
            RecordDict({"arrays": add_direction(arrays, shift, 1.0), "metrics": MetricRecord({"num-examples": 10})}),
            reply_to=msg,
        )

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": 10, "loss": 1.0})}), reply_to=msg)

    return app


def local_direction(node: int, dim: int) -> np.ndarray:
    v = np.random.default_rng(node).normal(size=dim)
    return v / np.linalg.norm(v)


# ---------------------------------------------------------------------------- the proxy, without statistics
def test_canary_update_is_the_received_model_plus_its_direction(task_identity):
    app = canary_client_app(local_direction, 3.0)
    canary = CANARY_ID_BASE + 7
    grid = CanaryGrid(LoopbackGrid(real_app(), REAL), [canary], app)
    msg = Message(RecordDict({"arrays": model(), "config": ConfigRecord({})}), canary, "train", group_id="1")
    (reply,) = grid.send_and_receive([msg])
    assert reply.metadata.src_node_id == canary
    assert reply.metadata.reply_to_message_id == msg.metadata.message_id != ""
    assert reply.metadata.message_id not in ("", msg.metadata.message_id)
    arrays = reply.content["arrays"]
    assert list(arrays.keys()) == ["w", "b"] and arrays["w"].numpy().dtype == np.float32
    np.testing.assert_allclose(flatten_arrays(arrays), 3.0 * local_direction(canary, DIM), rtol=1e-6, atol=1e-7)
    assert reply.content["metrics"]["num-examples"] == 1
    assert grid.models["1"].shape == (DIM,)
    (ev,) = grid.send_and_receive([Message(RecordDict(), canary, "evaluate", group_id="1")])
    assert ev.has_error() and "no part in evaluation" in ev.error.reason  # no data: nothing to evaluate


def test_push_and_pull_route_canaries_in_process(task_identity):
    real = LoopbackGrid(real_app(), REAL)
    real.push_messages = lambda msgs: [f"r{m.metadata.dst_node_id}" for m in msgs]  # type: ignore[assignment]
    real.pull_messages = lambda ids: [f"reply-{i}" for i in ids]  # type: ignore[assignment]
    canary = CANARY_ID_BASE
    grid = CanaryGrid(real, [canary], canary_client_app(local_direction, 1.0))
    ids = grid.push_messages(
        [
            Message(RecordDict({"arrays": model()}), 101, "train", group_id="1"),
            Message(RecordDict({"arrays": model()}), canary, "train", group_id="1"),
        ]
    )
    assert "r101" in ids and len(ids) == 2
    replies = grid.pull_messages(ids)
    assert "reply-r101" in replies
    (canary_reply,) = [r for r in replies if isinstance(r, Message)]
    assert canary_reply.metadata.src_node_id == canary
    assert grid.pull_messages([i for i in ids if i != "r101"]) == []  # pulled once


def test_canaries_are_sampled_like_clients_and_never_reach_the_real_grid(task_identity):
    """Poisson sampling over N real + k canaries: each canary's participation rate is q = m/(N + k)."""
    k, rounds, m = 190, 4, 20
    canaries = [CANARY_ID_BASE + i for i in range(k)]
    real = LoopbackGrid(real_app(), REAL)
    grid = CanaryGrid(real, canaries, canary_client_app(local_direction, 10.0))
    strategy = AccountedPoissonFixedClipping(FedAvg(fraction_evaluate=0.0), 1.0, 1.0, m, rng=3)
    result = strategy.start(grid, model(), num_rounds=rounds)
    assert all(int(msg.metadata.dst_node_id) in REAL for msg in real.sent)
    q = m / (len(REAL) + k)
    assert strategy.sampling_rate == pytest.approx(q)
    assert len(grid.models) == rounds  # one sample per round (empty with probability (1 - q)^200: negligible)
    rate = sum(len(nodes) for nodes in grid.canary_participation.values()) / (k * rounds)
    assert abs(rate - q) < 4 * np.sqrt(q * (1 - q) / (k * rounds))
    assert not grid.canary_errors
    assert flatten_arrays(result.arrays).shape == (DIM,)


def test_fixed_size_sampling_sends_every_node_including_canaries(task_identity):
    k = 30
    canaries = [CANARY_ID_BASE + i for i in range(k)]
    real = LoopbackGrid(real_app(), REAL)
    grid = CanaryGrid(real, canaries, canary_client_app(local_direction, 10.0))
    strategy = AccountedServerSideFixedClipping(FedAvg(fraction_evaluate=1.0), 1.0, 1.0, len(REAL) + k, rng=1)
    strategy.start(grid, model(), num_rounds=2)
    assert list(grid.canary_participation.values()) == [set(canaries), set(canaries)]
    assert len(grid.models) == 2
    assert all(int(msg.metadata.dst_node_id) in REAL for msg in real.sent)
    assert not grid.canary_errors


def test_canary_ids_colliding_with_real_nodes_are_refused():
    grid = CanaryGrid(
        LoopbackGrid(real_app(), [CANARY_ID_BASE]), [CANARY_ID_BASE], canary_client_app(local_direction, 1)
    )
    with pytest.raises(RuntimeError, match="collide"):
        grid.get_node_ids()


# ---------------------------------------------------------------------------- argument validation
def fixed(z: float = 5.0, m: int = 10) -> AccountedServerSideFixedClipping:
    return AccountedServerSideFixedClipping(FedAvg(), z, 2.0, m)


def test_defaults():
    audit = CanaryAudit(fixed(), num_canaries=5, seed=11)
    assert audit.canary_norm == 20.0 and audit.delta == 1e-5 and audit.confidence == 0.95
    assert audit.inserted_ids == [CANARY_ID_BASE + i for i in range(5)]
    assert audit.unseen_ids == [CANARY_ID_BASE + 5 + i for i in range(5)]
    assert CanaryAudit(fixed(), num_canaries=1).seed != CanaryAudit(fixed(), num_canaries=1).seed  # OS entropy


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_canaries": 0}, "num_canaries"),
        ({"num_canaries": 2.0}, "num_canaries"),
        ({"num_canaries": True}, "num_canaries"),
        ({"num_canaries": 3, "canary_norm": 0.0}, "canary_norm"),
        ({"num_canaries": 3, "canary_norm": float("inf")}, "canary_norm"),
        ({"num_canaries": 3, "seed": -1}, "seed"),
        ({"num_canaries": 3, "confidence": 1.0}, "confidence"),
        ({"num_canaries": 3, "delta": 0.0}, "delta"),
    ],
)
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CanaryAudit(fixed(), **kwargs)


def test_canary_norm_required_without_clipping_norm():
    from flwr_dp_strategies import AccountedFedAvg

    strategy = AccountedFedAvg()
    with pytest.raises(ValueError, match="canary_norm"):
        CanaryAudit(strategy, num_canaries=3)
    assert CanaryAudit(strategy, num_canaries=3, canary_norm=1.5).canary_norm == 1.5


def test_strategy_must_be_an_accounted_flower_strategy():
    with pytest.raises(ValueError, match="Strategy"):
        CanaryAudit(object(), num_canaries=3, canary_norm=1.0)
    with pytest.raises(ValueError, match="ledger"):
        CanaryAudit(FedAvg(), num_canaries=3, canary_norm=1.0)


def test_report_metric_record():
    report = AuditReport(1.0, 2.0, 0.5, 0.25, 0.95, 1e-5, 3.0, 10, 7, alarm=True, shift_lower_bound_final=1.5)
    assert dict(report.metric_record()) == {
        "audit/epsilon-estimate/final": 1.0,
        "audit/epsilon-estimate/all-iterates": 2.0,
        "audit/epsilon-lower-bound/final": 0.5,
        "audit/epsilon-lower-bound/all-iterates": 0.25,
        "audit/epsilon-lower-bound-shift/final": 1.5,
        "audit/epsilon-lower-bound-shift/all-iterates": 0.0,
        "audit/ledger-epsilon": 3.0,
        "audit/alarm": 1.0,
    }


# ---------------------------------------------------------------------------- the statistics (privacy.analyses.audit)
class UnderNoised(AccountedServerSideFixedClipping):
    """Books z but releases with ``release_fraction · z`` (the misconfiguration the audit must catch)."""

    release_fraction = 0.1

    def _fixed_release(self, summed, generator):
        z = self.noise_multiplier
        self.noise_multiplier = z * self.release_fraction
        try:
            return super()._fixed_release(summed, generator)
        finally:
            self.noise_multiplier = z


def audited_run(cls, z: float, k: int, rounds: int, seed: int = 1, fraction: float = 0.1):
    pytest.importorskip("flwr_dp_strategies.privacy.analyses.audit")
    if issubclass(cls, UnderNoised):
        cls = type(cls.__name__, (cls,), {"release_fraction": fraction})
    strategy = cls(FedAvg(fraction_evaluate=0.0), z, 1.0, len(REAL) + k, rng=seed)
    audit = CanaryAudit(strategy, num_canaries=k, seed=seed)
    result, report = audit.start(LoopbackGrid(real_app(), REAL), model(), num_rounds=rounds)
    return strategy, audit, result, report


def test_correct_noise_gives_a_lower_bound_within_the_ledger(task_identity, caplog):
    with caplog.at_level(logging.INFO, logger="flwr"):
        strategy, audit, result, report = audited_run(AccountedServerSideFixedClipping, 5.0, 200, 3)
    assert report is audit.report
    assert report.ledger_epsilon == pytest.approx(strategy.ledger.epsilon())
    assert report.epsilon_lower_bound_final <= report.ledger_epsilon
    assert report.epsilon_lower_bound_all_iterates <= report.ledger_epsilon
    assert not report.alarm and report.metric_record()["audit/alarm"] == 0.0
    assert report.inserted_final.shape == report.null_final.shape == (200,)
    assert report.inserted_all_iterates.shape == report.null_all_iterates.shape == (200,)
    assert len(audit.iterates(model())) == 3  # initial, round 2's and round 3's models; the final one is apart
    assert "never a replacement for the ledger" in caplog.text and "misconfiguration" not in caplog.text
    # the canaries are regenerated from the seed: the reported cosines are those of the final model's change
    from flwr_dp_strategies.privacy.analyses.audit import canary_cosines

    delta = flatten_arrays(result.arrays) - flatten_arrays(model())
    np.testing.assert_allclose(report.inserted_final, canary_cosines(delta, audit.vectors(audit.inserted_ids, DIM)))


def test_under_noised_release_raises_the_alarm(task_identity, caplog):
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _, _, _, report = audited_run(UnderNoised, 5.0, 200, 3)
    assert max(report.epsilon_lower_bound_final, report.epsilon_lower_bound_all_iterates) > report.ledger_epsilon
    assert report.alarm
    assert "misconfiguration" in caplog.text


def test_server_adding_a_third_of_its_booked_noise_is_caught_by_the_shift_bound(task_identity):
    """z/3 instead of z: ε is about 3× the ledger's here, out of reach of the count bound with 300 canaries
    (≤ log 300 − 2.5 and far less in practice), within reach of the shift bound."""
    strategy, _, _, report = audited_run(UnderNoised, 5.0, 300, 3, seed=5, fraction=1 / 3)
    assert report.ledger_epsilon == pytest.approx(strategy.ledger.epsilon())
    assert max(report.shift_lower_bound_final, report.shift_lower_bound_all_iterates) > report.ledger_epsilon
    assert max(report.epsilon_lower_bound_final, report.epsilon_lower_bound_all_iterates) < report.ledger_epsilon
    assert report.alarm


@pytest.mark.slow
def test_correctly_configured_runs_are_never_flagged_over_20_seeds(task_identity):
    """The alarm's false-positive rate is ≤ 5 % per run (the four bounds hold together at 95 %); the central
    Gaussian release at the booked z is the tightest case (the final model's ε equals the ledger's)."""
    reports = [audited_run(AccountedServerSideFixedClipping, 4.0, 100, 2, seed=seed)[3] for seed in range(20)]
    assert not any(r.alarm for r in reports)
    # not vacuous: the shift bound sees the release in most runs
    assert sum(r.shift_lower_bound_final > 0 for r in reports) >= 10


def test_plot_audit(task_identity, tmp_path):
    pytest.importorskip("matplotlib")
    from flwr_dp_strategies.audit import plot_audit

    _, _, _, report = audited_run(AccountedServerSideFixedClipping, 5.0, 50, 1)
    plot_audit(report, tmp_path / "audit.png")
    assert (tmp_path / "audit.png").stat().st_size > 0


def test_poisson_audit_samples_canaries_and_stays_within_the_ledger(task_identity):
    pytest.importorskip("flwr_dp_strategies.privacy.analyses.audit")
    k, m = 150, 16
    strategy = AccountedPoissonFixedClipping(FedAvg(fraction_evaluate=0.0), 3.0, 1.0, m, rng=4)
    audit = CanaryAudit(strategy, num_canaries=k, seed=4)
    real = LoopbackGrid(real_app(), REAL)
    _, report = audit.start(real, model(), num_rounds=3)
    assert strategy.sampling_rate == pytest.approx(m / (len(REAL) + k))
    assert 0 < sum(len(n) for n in audit.grid.canary_participation.values()) < k * 3
    assert all(int(msg.metadata.dst_node_id) in REAL for msg in real.sent)
    assert not report.alarm and report.epsilon_lower_bound_final <= report.ledger_epsilon


def distributed_dp_audit(k: int, halved: bool):
    pytest.importorskip("flwr_dp_strategies.privacy.analyses.audit")
    from client_mods.distributed_dp_mod import make_distributed_dp_mod
    from flwr_dp_benchmarks.bench_audit import halved_noise_mod
    from flwr_dp_strategies import DistributedDpFedAvg
    from secagg_harness import shifting_app

    deltas = {n: np.random.default_rng(n).normal(size=DIM) * 1e-3 for n in REAL}
    # a client that halves its noise (the broken configuration) also runs with a floor it meets
    floor = 0.2 if halved else 0.5
    app = shifting_app(deltas, rng=1, min_noise_multiplier=floor)
    real = LoopbackGrid(app, REAL)
    strategy = DistributedDpFedAvg(
        fraction_evaluate=0.0, noise_multiplier=0.5, clipping_norm=1.0, bits=24, rotation_seed=3
    )
    # the operator admits the canaries to the roster (to the real clients they are peers like any other)
    mod = make_distributed_dp_mod(rng=2, min_noise_multiplier=floor, identity=app.roster)
    audit = CanaryAudit(strategy, num_canaries=k, seed=2, canary_mods=[halved_noise_mod(mod) if halved else mod])
    result, report = audit.start(real, model(), num_rounds=2)
    return strategy, audit, real, result, report


def test_distributed_dp_canaries_run_the_client_mod_and_secure_aggregation(task_identity):
    """Canaries behind ``distributed_dp_mod`` join every secure-aggregation stage as real clients do."""
    k = 20
    strategy, audit, real, result, report = distributed_dp_audit(k, halved=False)
    assert audit.canary_norm == 10.0
    assert not audit.grid.canary_errors and not real.errors
    assert list(audit.grid.canary_participation.values()) == [set(audit.inserted_ids)] * 2
    assert all(int(msg.metadata.dst_node_id) in REAL for msg in real.sent)
    assert len(audit.iterates(model())) == 2 and np.all(np.isfinite(flatten_arrays(result.arrays)))
    assert not report.alarm and report.ledger_epsilon == pytest.approx(strategy.ledger.epsilon())


def test_client_mods_adding_half_their_noise_share_are_caught(task_identity, monkeypatch):
    """The broken client configuration: every client's mod (the real clients' and the canaries') adds half the noise
    std the server planned and booked."""
    import secagg_harness
    from flwr_dp_benchmarks.bench_audit import halved_noise_mod

    real_factory = secagg_harness.make_distributed_dp_mod
    monkeypatch.setattr(secagg_harness, "make_distributed_dp_mod", lambda **kw: halved_noise_mod(real_factory(**kw)))
    _, _, _, _, report = distributed_dp_audit(20, halved=True)
    assert max(report.shift_lower_bound_final, report.shift_lower_bound_all_iterates) > report.ledger_epsilon
    assert report.alarm


def test_canaries_never_enter_the_published_evaluation_means(task_identity):
    """Issue 37 item 5: a canary sampled for evaluation answers with an error reply (skipped, counted in the server
    log); the evaluation metrics are aggregated over the real clients' replies only."""
    seen: list[int] = []

    def aggregate(contents, weighted_by_key):
        seen.append(len(contents))
        total = sum(c["metrics"][weighted_by_key] for c in contents)
        return MetricRecord(
            {"loss": sum(c["metrics"]["loss"] * c["metrics"][weighted_by_key] for c in contents) / total}
        )

    k = 5
    strategy = AccountedServerSideFixedClipping(
        FedAvg(fraction_evaluate=1.0, evaluate_metrics_aggr_fn=aggregate),
        5.0,
        1.0,
        len(REAL) + k,
        rng=3,
        evaluate_metrics="flower",  # the canaries' absence is seen through Flower's mean
    )
    audit = CanaryAudit(strategy, num_canaries=k, seed=3)
    result, _ = audit.start(LoopbackGrid(real_app(), REAL), model(), num_rounds=1)
    assert seen == [len(REAL)]  # before: 15 replies, the 5 canaries' among them
    assert result.evaluate_metrics_clientapp[1]["loss"] == pytest.approx(1.0)
    assert strategy.rejections["evaluate"] == {"error": k}  # skipped as failed replies: server log only
    assert not audit.grid.canary_errors


def test_pull_messages_takes_every_flower_form(task_identity):
    """Issue 38: Flower 1.43's ``pull_messages(reply_to_message_ids=None, *, message_ids=None)``; the old positional
    and keyword forms keep working, None pulls every reply not yet pulled."""
    real = LoopbackGrid(real_app(), REAL)
    real.push_messages = lambda msgs: [f"r{m.metadata.dst_node_id}" for m in msgs]  # type: ignore[assignment]
    real.pull_messages = lambda ids=None: ["everything"] if ids is None else [f"reply-{i}" for i in ids]  # type: ignore[assignment]
    canaries = [CANARY_ID_BASE, CANARY_ID_BASE + 1, CANARY_ID_BASE + 2]
    grid = CanaryGrid(real, canaries, canary_client_app(local_direction, 1.0))
    ids = grid.push_messages([Message(RecordDict({"arrays": model()}), c, "train", group_id="1") for c in canaries])
    assert len(grid.pull_messages(reply_to_message_ids=[ids[0]])) == 1
    assert len(grid.pull_messages(message_ids=[ids[1]])) == 1
    rest = grid.pull_messages()
    assert [r for r in rest if isinstance(r, Message)][0].metadata.src_node_id == canaries[2]
    assert "everything" in rest and grid.pull_messages([ids[2]]) == []
