"""LaplaceInferenceMod, laplace_eval_epsilon and ClusterEvaluation on real Flower Messages."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.dp_event import LaplaceDpEvent, SelfComposedDpEvent
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from scipy import stats

from client_mods import LaplaceInferenceMod, laplace_eval_epsilon
from loopback import LoopbackGrid, run_round
from flwr_dp_strategies import AccountedFedAvg, ClusterEvaluation, read_declarations
from flwr_dp_strategies.cluster_scores import cluster_scores

pytestmark = pytest.mark.usefixtures("task_identity")


def context() -> Context:
    return Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})


def evaluate_message(config: dict | None = None, message_type: str = MessageType.EVALUATE) -> Message:
    content = RecordDict({"arrays": ArrayRecord([np.zeros(2)]), "config": ConfigRecord(config or {})})
    return Message(content, dst_node_id=7, message_type=message_type)


def app_returning(vectors: np.ndarray, key: str = "inference"):
    """A ClientApp callable whose evaluate reply holds ``vectors`` under ``key``."""

    def call_next(msg: Message, ctx: Context) -> Message:
        content = RecordDict(
            {
                key: ArrayRecord({"probs": Array(np.asarray(vectors))}),
                "metrics": MetricRecord({"num-examples": 10, "accuracy": 0.9}),
            }
        )
        return Message(content, reply_to=msg)

    return call_next


def test_laplace_eval_epsilon_reproduces_the_seed():
    assert laplace_eval_epsilon() == pytest.approx(math.log(10) / 1e-5)  # 230 258.5
    assert laplace_eval_epsilon() == pytest.approx(230258.5, abs=0.1)
    assert laplace_eval_epsilon(sensitivity=2.0) == pytest.approx(2 * 230258.5, abs=0.2)
    # the defining property: P(|L| < 1e-5) = 0.9 for L ~ Laplace(1/eps)
    b = 1.0 / laplace_eval_epsilon()
    assert 1 - math.exp(-1e-5 / b) == pytest.approx(0.9)
    with pytest.raises(ValueError, match="probability"):
        laplace_eval_epsilon(probability=1.0)
    with pytest.raises(ValueError, match="noise_bound"):
        laplace_eval_epsilon(noise_bound=0.0)


def _residuals(mod: LaplaceInferenceMod, m: int = 5000, k: int = 10) -> tuple[np.ndarray, Message]:
    vectors = np.random.default_rng(1).dirichlet(np.ones(k), size=m)
    reply = mod(evaluate_message(), context(), app_returning(vectors))
    noisy = reply.content["inference"]["probs"].numpy()
    return (noisy - vectors).ravel(), reply


@pytest.mark.parametrize("seed_calibration, expected_scale", [(False, 2.0 / 3.0), (True, 1.0 / 3.0)])
def test_noise_scale_is_sensitivity_over_epsilon_and_off_by_10_percent_is_rejected(seed_calibration, expected_scale):
    """n = 50 000 residuals; KS at the true scale passes, ×0.9 and ×1.1 are rejected at p < 1e-6."""
    mod = LaplaceInferenceMod(3.0, seed_calibration=seed_calibration, rng=11)
    residuals, reply = _residuals(mod)
    assert stats.kstest(residuals, "laplace", args=(0, expected_scale)).pvalue > 1e-3
    for factor in (0.9, 1.1):
        assert stats.kstest(residuals, "laplace", args=(0, factor * expected_scale)).pvalue < 1e-6
    (declaration,) = read_declarations(reply.content)
    assert declaration.event == SelfComposedDpEvent(LaplaceDpEvent(expected_scale / 2.0), 5000)
    # the declared per-vector epsilon is the true one: sensitivity 2 / scale
    assert 2.0 / expected_scale == pytest.approx(3.0 if not seed_calibration else 6.0)


def test_missing_or_malformed_inference_results_fail_loudly_never_unnoised():
    mod = LaplaceInferenceMod(1.0, rng=0)
    with pytest.raises(ValueError, match="no ArrayRecord"):
        mod(evaluate_message(), context(), app_returning(np.full(3, 1 / 3), key="other"))
    with pytest.raises(ValueError, match="probability vector"):
        mod(evaluate_message(), context(), app_returning(np.array([0.7, 0.7, 0.1])))
    with pytest.raises(ValueError, match="probability vector"):
        mod(evaluate_message(), context(), app_returning(np.array([1.5, -0.5])))
    with pytest.raises(ValueError, match="finite"):
        mod(evaluate_message(), context(), app_returning(np.array([np.nan, 1.0])))


def test_train_messages_pass_through_untouched():
    mod = LaplaceInferenceMod(1.0, rng=0)
    vectors = np.full(4, 0.25)
    reply = mod(evaluate_message(message_type=MessageType.TRAIN), context(), app_returning(vectors))
    np.testing.assert_array_equal(reply.content["inference"]["probs"].numpy(), vectors)
    assert read_declarations(reply.content) == []


def test_server_driven_epsilon_and_not_encrypt():
    vectors = np.full(4, 0.25)
    mod = LaplaceInferenceMod(rng=0)  # epsilon from the server
    reply = mod(
        evaluate_message({"privacy-eval-type": "LAPLACE", "laplace-eval-eps": 4.0}), context(), app_returning(vectors)
    )
    assert read_declarations(reply.content)[0].event == SelfComposedDpEvent(LaplaceDpEvent(0.25), 1)
    reply = mod(evaluate_message({"privacy-eval-type": "NOT_ENCRYPT"}), context(), app_returning(vectors))
    np.testing.assert_array_equal(reply.content["inference"]["probs"].numpy(), vectors)
    assert read_declarations(reply.content) == []
    with pytest.raises(ValueError, match="privacy-eval-type"):
        mod(evaluate_message(), context(), app_returning(vectors))
    # a client epsilon is never loosened by the server, only tightened
    strict = LaplaceInferenceMod(1.0, rng=0)
    reply = strict(
        evaluate_message({"privacy-eval-type": "LAPLACE", "laplace-eval-eps": 100.0}), context(), app_returning(vectors)
    )
    assert read_declarations(reply.content)[0].event == SelfComposedDpEvent(LaplaceDpEvent(1.0), 1)


def test_default_randomness_is_not_a_fixed_seed():
    vectors = np.full(4, 0.25)
    a = LaplaceInferenceMod(1.0)(evaluate_message(), context(), app_returning(vectors))
    b = LaplaceInferenceMod(1.0)(evaluate_message(), context(), app_returning(vectors))
    assert not np.array_equal(a.content["inference"]["probs"].numpy(), b.content["inference"]["probs"].numpy())


@pytest.mark.parametrize(
    "kwargs, name", [({"epsilon": 0.0}, "epsilon"), ({"epsilon": 1.0, "sensitivity": -1}, "sensitivity")]
)
def test_bad_parameters_name_themselves(kwargs, name):
    with pytest.raises(ValueError, match=name):
        LaplaceInferenceMod(**kwargs)


# ---------------------------------------------------------------------- ClusterEvaluation
def clustered_points(n: int = 30, k: int = 3, spread: float = 0.05, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % k
    points = np.full((n, k), 0.1 / (k - 1))
    points[np.arange(n), labels] = 0.9
    points = np.abs(points + rng.normal(0, spread, points.shape))
    return points / points.sum(axis=1, keepdims=True)  # probability vectors


def test_cluster_scores_match_sklearn_and_degenerate_cases_give_zero():
    from sklearn.metrics import calinski_harabasz_score, davies_bouldin_score, silhouette_score

    x = clustered_points()
    labels = x.argmax(axis=1)
    scores = cluster_scores(x)
    assert scores["silhouette"] == pytest.approx(silhouette_score(x, labels))
    assert scores["calinski-harabasz"] == pytest.approx(calinski_harabasz_score(x, labels))
    assert scores["davies-bouldin"] == pytest.approx(davies_bouldin_score(x, labels))
    assert scores["silhouette"] > 0.5
    one_cluster = np.tile([0.8, 0.2], (5, 1))
    assert cluster_scores(one_cluster)["silhouette"] == 0.0 and cluster_scores(one_cluster)["labels"] == 1


def evaluate_round(strategy: ClusterEvaluation, points: list[np.ndarray], server_round: int = 1):
    grid = LoopbackGrid.of(len(points), by_index=lambda i, msg: app_returning(points[i])(msg, context()))
    msgs, _, result = run_round(strategy, grid, ArrayRecord([np.zeros(2)]), server_round, phase="evaluate")
    return msgs, result


def test_cluster_evaluation_sends_mode_scores_and_rejects_bad_vectors():
    n = 12
    inner = FedAvg(min_evaluate_nodes=n, min_available_nodes=n)
    strategy = ClusterEvaluation(
        inner,
        eval_type="CALINSKI_HARABASZ_SCORE",
        laplace_eval_eps=50.0,
        cluster_client_num=1000,
        num_classes=3,
        evaluate_metrics="flower",
    )
    points = list(clustered_points(n))
    points[0] = np.array([np.nan, 0.5, 0.5])
    points[1] = np.array([0.5, 0.5])  # wrong length
    msgs, metrics = evaluate_round(strategy, points)
    config = msgs[0].content["config"]
    assert config["privacy-eval-type"] == "LAPLACE" and config["laplace-eval-eps"] == 50.0
    assert config["eval-type"] == "CALINSKI_HARABASZ_SCORE"
    assert strategy.rejections["evaluate"]["non-finite"] == 1 and strategy.rejections["evaluate"]["shape"] == 1
    assert strategy.server_figures["evaluate"]["cluster/points"] == n - 2
    expected = cluster_scores(np.stack(points[2:]))
    assert metrics["unsupervised-eval"] == pytest.approx(expected["calinski-harabasz"])
    assert metrics["accuracy"] == pytest.approx(0.9)  # the wrapped strategy's evaluation is kept


def test_cluster_client_num_caps_the_points_and_run_config_keys_are_read():
    n = 10
    strategy = ClusterEvaluation.from_run_config(
        FedAvg(min_evaluate_nodes=n, min_available_nodes=n),
        {
            "privacy-eval-type": "NOT_ENCRYPT",
            "laplace-eval-eps": 230260,
            "cluster-client-num": 4,
            "eval-type": "SILHOUETTE_SCORE",
        },
    )
    assert strategy.privacy_eval_type == "NOT_ENCRYPT" and strategy.cluster_client_num == 4
    _, metrics = evaluate_round(strategy, list(clustered_points(n)))
    assert strategy.server_figures["evaluate"]["cluster/points"] == 4
    assert metrics["privacy/epsilon"] == float("inf")  # un-noised results are booked as non-private
    assert set(strategy.points_history[-1]) == set(range(101, 105))  # scored in node-id order
    with pytest.raises(ValueError, match="eval_type"):
        ClusterEvaluation(FedAvg(), eval_type="ACCURACY")
    with pytest.raises(ValueError, match="cluster_client_num"):
        ClusterEvaluation(FedAvg(), cluster_client_num=1)
    with pytest.raises(ValueError, match="privacy_eval_type"):
        ClusterEvaluation(FedAvg(), privacy_eval_type="ENCRYPT")


def test_end_to_end_mod_and_wrapper_book_each_release_once():
    """Mod on the clients, ClusterEvaluation(AccountedFedAvg) on the server: one booking per reply."""
    n = 6
    inner = AccountedFedAvg(min_evaluate_nodes=n, min_available_nodes=n)
    strategy = ClusterEvaluation(inner, laplace_eval_eps=10.0)
    assert strategy.ledger is inner.ledger
    mod = LaplaceInferenceMod(rng=3)
    points = clustered_points(n)
    for rnd in (1, 2):
        msgs = list(strategy.configure_evaluate(rnd, ArrayRecord([np.zeros(2)]), ConfigRecord(), LoopbackGrid.of(n)))
        replies = [mod(msg, context(), app_returning(p)) for msg, p in zip(msgs, points)]
        metrics = strategy.aggregate_evaluate(rnd, replies)
    # two rounds of one 10-LDP release each, booked once per round: basic composition gives 20
    assert metrics["privacy/epsilon"] == pytest.approx(20.0, rel=1e-3)
    assert len(strategy.ledger.clients) == n


def test_pickled_copies_of_a_default_mod_draw_different_noise():
    """Flower's simulation pickles the ClientApp (mods included) for every message: no shared stream."""
    import pickle

    mod = LaplaceInferenceMod(1.0)
    vectors = np.full(8, 0.125)
    outputs = [
        pickle.loads(pickle.dumps(mod))(evaluate_message(), context(), app_returning(vectors))
        .content["inference"]["probs"]
        .numpy()
        for _ in range(3)
    ]
    assert not np.array_equal(outputs[0], outputs[1]) and not np.array_equal(outputs[1], outputs[2])
    seeded = LaplaceInferenceMod(1.0, rng=7)  # an explicit seed is reproducible, by request
    first, second = (
        pickle.loads(pickle.dumps(seeded))(evaluate_message(), context(), app_returning(vectors))
        .content["inference"]["probs"]
        .numpy()
        for _ in range(2)
    )
    np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize("sensitivity, relation", [(2.0, "replace_one"), (1.0, "add_or_remove_one")])
def test_declared_relation_is_the_one_the_sensitivity_covers(sensitivity, relation):
    """Δ₁ = 2 is the simplex's diameter (any two vectors); the seed's Δ₁ = 1 only bounds a vector against the zero
    one (add/remove): a replace-one ledger must then book 2ε, not the ε the noise was calibrated for."""
    from flwr_dp_strategies.privacy import PrivacyLedger

    mod = LaplaceInferenceMod(1.0, sensitivity=sensitivity, rng=0)
    reply = mod(evaluate_message(), context(), app_returning(np.array([0.2, 0.8])))
    (declaration,) = read_declarations(reply.content)
    assert declaration.neighboring_relation == relation
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    ledger.record(declaration.event, server_round=1, client=7, neighboring_relation=declaration.neighboring_relation)
    assert ledger.epsilon(7) == pytest.approx(2.0 / sensitivity, rel=1e-3)  # noise b = Δ₁/1 against diameter 2
    with pytest.raises(ValueError, match="sensitivity"):
        LaplaceInferenceMod(1.0, sensitivity=0.5)
