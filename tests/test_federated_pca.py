"""LDP federated PCA: Analyze Gauss calibration, the paper's Wishart noise is not DP, the Flower round trip."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.dp_event import GaussianDpEvent, NonPrivateDpEvent
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from scipy import stats as st

from client_mods import covariance_reply, project, projection_from_state, store_projection
from flwr_dp_strategies import declare_release
from flwr_dp_strategies.federated_pca import LdpFederatedPCA
from flwr_dp_strategies.privacy import PrivacyLedger, gaussian_sigma
from flwr_dp_strategies.privacy.mechanisms.covariance import (
    analyze_gauss,
    covariance_l2_sensitivity,
    paper_wishart_noise,
    second_moment,
    top_eigenvectors,
)
from loopback import LoopbackGrid, node_context

RNG = np.random.default_rng(3)


def unit_rows(n: int, d: int, rng=RNG) -> np.ndarray:
    x = rng.normal(size=(n, d)) * np.linspace(2.0, 0.2, d)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_sensitivity_holds_and_is_attained():
    rows, cols = np.triu_indices(6)
    worst = 0.0
    for _ in range(500):
        a, b = unit_rows(2, 6)
        worst = max(worst, np.linalg.norm((np.outer(a, a) - np.outer(b, b))[rows, cols]))
        assert np.linalg.norm(np.outer(a, a)[rows, cols]) <= covariance_l2_sensitivity("add_or_remove_one") + 1e-12
    e1, e2 = np.eye(6)[:2]
    attained = np.linalg.norm((np.outer(e1, e1) - np.outer(e2, e2))[rows, cols])
    assert attained == pytest.approx(covariance_l2_sensitivity("replace_one")) and worst <= attained + 1e-12


def test_analyze_gauss_noise_is_symmetric_with_the_calibrated_sigma():
    d, eps, delta = 30, 0.5, 1e-5
    base = second_moment(unit_rows(100, d))
    noisy = np.stack(
        [analyze_gauss(base, epsilon=eps, delta=delta, rng=np.random.default_rng(s)).value for s in range(40)]
    )
    np.testing.assert_allclose(noisy, np.transpose(noisy, (0, 2, 1)))
    rows, cols = np.triu_indices(d)
    res = (noisy - base)[:, rows, cols].ravel()
    sigma = gaussian_sigma(eps, delta, math.sqrt(2.0))
    assert st.kstest(res, "norm", args=(0, sigma)).pvalue > 1e-3
    for wrong in (0.9 * sigma, 1.1 * sigma):
        assert st.kstest(res, "norm", args=(0, wrong)).pvalue < 1e-6
    event = analyze_gauss(base, epsilon=eps, delta=delta, rng=1).event
    assert event == GaussianDpEvent(noise_multiplier=sigma / math.sqrt(2.0))


def test_paper_wishart_noise_is_not_dp_an_output_impossible_under_a_neighbour():
    """C + ZZᵀ only reaches C + (positive definite): outputs near C are impossible for a neighbour C'."""
    d = 4
    x = unit_rows(20, d)
    neighbour = x.copy()
    neighbour[0] = np.eye(d)[0] if abs(x[0, 0]) < 0.9 else np.eye(d)[1]
    c, c2 = second_moment(x), second_moment(neighbour)
    outputs = [paper_wishart_noise(c, epsilon=50.0, rng=np.random.default_rng(s)).value for s in range(2000)]
    below_c = [np.linalg.eigvalsh(o - c).min() for o in outputs]
    below_c2 = [np.linalg.eigvalsh(o - c2).min() for o in outputs]
    assert min(below_c) > 0  # always in C + PD: an output under C' can never be in this region ...
    impossible_under_c2 = np.mean(np.array(below_c2) < 0)
    assert impossible_under_c2 > 0.5  # ... yet most outputs under C are outside C' + PD: unbounded ratio
    assert paper_wishart_noise(c, epsilon=1.0, rng=1).event == NonPrivateDpEvent()
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    ledger.record(NonPrivateDpEvent(), server_round=0, client=1)
    assert ledger.epsilon(1) == math.inf


def test_top_eigenvectors_match_the_svd():
    x = unit_rows(300, 8)
    v = top_eigenvectors(second_moment(x), 3)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    for k in range(3):
        assert abs(v[:, k] @ vt[k]) == pytest.approx(1.0, abs=1e-8)
    with pytest.raises(ValueError, match="num_components"):
        top_eigenvectors(second_moment(x), 9)


def pca_client(features: np.ndarray, epsilon: float):
    """A node of LDP-FPCA: its covariance for ``train.pca``, then it stores the projection it is sent."""

    def client(msg: Message, context: Context) -> Message:
        if msg.metadata.message_type == "train.pca":
            return covariance_reply(msg, context, features, epsilon=epsilon, rng=msg.metadata.dst_node_id)
        return store_projection(msg, context)

    return client


@pytest.mark.usefixtures("task_identity")
def test_federated_pca_round_trip_books_one_gaussian_event_per_client():
    d, k = 12, 3
    features = {n: unit_rows(200, d, np.random.default_rng(n)) for n in (11, 12, 13, 14)}
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    pca = LdpFederatedPCA(d, k, ledger=ledger)
    grid = LoopbackGrid({n: pca_client(f, epsilon=5.0) for n, f in features.items()})
    projection = pca.run(grid)
    assert grid.errors == []
    assert projection.shape == (d, k)
    np.testing.assert_allclose(projection.T @ projection, np.eye(k), atol=1e-10)
    exact = top_eigenvectors(sum(second_moment(f) for f in features.values()), k)
    assert abs(projection[:, 0] @ exact[:, 0]) > 0.95  # the noise leaves the leading direction
    for node, node_features in features.items():
        np.testing.assert_allclose(projection_from_state(grid.contexts[node]), projection)
        # calibrated to (5, 1e-5); the ledger's RDP bound is a little looser (dp-accounting's PLD
        # reads replace-one Gaussian multipliers against the add/remove sensitivity, so RDP wins here)
        assert 5.0 <= ledger.epsilon(node) <= 5.0 * 1.08
        assert np.linalg.norm(project(node_features, projection), axis=1).max() <= 1 + 1e-9
    assert not any(key.startswith("pca/") for key in pca.metrics)  # no count of replies is published


def covariance_message(matrix: np.ndarray, node: int, declared: bool = True) -> Message:
    content = RecordDict(
        {"arrays": ArrayRecord({"covariance": Array(matrix)}), "metrics": MetricRecord({"num-examples": 10.0})}
    )
    if declared:
        declare_release(content, GaussianDpEvent(3.0), label="t", neighboring_relation="replace_one")
    request = Message(RecordDict(), dst_node_id=node, message_type="train.pca")
    reply = Message(content, reply_to=request)
    reply.metadata.__dict__["_src_node_id"] = node
    return reply


@pytest.mark.usefixtures("task_identity")
def test_malformed_covariances_are_rejected_and_counted():
    d = 5
    good = second_moment(unit_rows(50, d))
    asym = good.copy()
    asym[0, 1] += 1.0
    nan = good.copy()
    nan[2, 2] = np.nan
    replies = [
        covariance_message(good, 1),
        covariance_message(good * 1.1, 2),
        covariance_message(asym, 3),
        covariance_message(nan, 4),
        covariance_message(np.eye(d + 1), 5),
        covariance_message(good, 6, False),
    ]
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    pca = LdpFederatedPCA(d, 2, ledger=ledger)
    projection = pca.aggregate(0, replies)
    expected = top_eigenvectors((good + good * 1.1 + good) / 3, 2)
    np.testing.assert_allclose(np.abs(projection.T @ expected), np.eye(2), atol=1e-8)
    m = pca.metrics
    assert pca.rejections["train"] == {"values": 1, "non-finite": 1, "shape": 1}
    assert "pca/accepted" not in m
    # node 6 sent a raw covariance: its own epsilon is inf, the published figure is over the other clients
    assert ledger.epsilon() == math.inf and m["privacy/epsilon"] == pytest.approx(ledger.epsilon(3))
    assert ledger.epsilon(6) == math.inf  # an undeclared covariance is a non-private release
    assert math.isfinite(ledger.epsilon(3))  # rejected, but its declared release is still booked


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("relation", ["add_or_remove_one", "replace_one"])
def test_covariance_reply_declares_the_relation_it_calibrated_for(relation):
    """An add/remove calibration (Δ₂ = 1) read by a replace-one ledger is booked at its replace-one ε (Δ₂ = 2):
    1.465 at ε = 1, δ = 1e-5, not the 1.000 a replace-one declaration of the same event would give."""
    msg = Message(RecordDict(), dst_node_id=5, message_type="train.pca")
    reply = covariance_reply(
        msg, node_context(5), unit_rows(20, 3), epsilon=1.0, delta=1e-5, neighboring_relation=relation, rng=0
    )
    from flwr_dp_strategies import read_declarations

    (declaration,) = read_declarations(reply.content)
    assert declaration.neighboring_relation == relation
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one", accounting="pld")
    ledger.record(
        declaration.event,
        server_round=1,
        client=5,
        neighboring_relation=declaration.neighboring_relation,
        replace_one_event=declaration.replace_one_event,
    )
    expected = 1.465 if relation == "add_or_remove_one" else 1.0
    assert ledger.epsilon(5) == pytest.approx(expected, abs=0.01)
