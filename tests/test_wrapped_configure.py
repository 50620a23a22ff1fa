"""Every wrapper keeps what the wrapped strategy puts in its train instruction while it chooses the nodes.

The wrapped strategy is a FedAvg subclass like Flower's advanced-pytorch example: its ``configure_train``
sets the round's learning rate in the config (halved every round: 0.025 in round 2) and adds a record.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp.strategy import FedAvg

import flwr_dp_strategies
from loopback import LoopbackGrid
from flwr_dp_strategies import AccountedAdaptiveClipping, AccountedClientSideAdaptiveClipping
from strategy_registry import N, REGISTRY

pytestmark = pytest.mark.usefixtures("task_identity")

# N: the registry's nodes; every wrapper samples all of them (m = N: q = 1 under Poisson sampling)


class LrScheduleFedAvg(FedAvg):
    """The advanced-pytorch pattern: the round's lr in the train config, and a record of its own."""

    def configure_train(self, server_round, arrays, config, grid):
        config["lr"] = 0.05 * 0.5 ** (server_round - 1)
        messages = list(super().configure_train(server_round, arrays, config, grid))
        if messages:  # FedAvg's messages share one RecordDict
            messages[0].content["schedule"] = ConfigRecord({"local-epochs": server_round})
        return messages


class PerNodeFedAvg(FedAvg):
    """A strategy sending each node its own config (e.g. its partition)."""

    def configure_train(self, server_round, arrays, config, grid):
        messages = list(super().configure_train(server_round, arrays, config, grid))
        return [
            Message(
                RecordDict({"arrays": arrays, "config": ConfigRecord({"partition": m.metadata.dst_node_id})}),
                message_type=m.metadata.message_type,
                dst_node_id=m.metadata.dst_node_id,
            )
            for m in messages
        ]


def wrappers(make_inner) -> dict[str, object]:
    """One instance of every wrapper in the registry (``make(inner=...)``), around a fresh wrapped strategy each,
    and the adaptive strategies with fixed-size sampling too."""
    cases = {entry.covers.__name__: entry.make(inner=make_inner()) for entry in REGISTRY.values() if entry.wraps}
    cases["AccountedAdaptiveClipping/fixed"] = AccountedAdaptiveClipping(
        make_inner(), 0.5, N, sampling="fixed", clipped_count_stddev=1.0, rng=3
    )
    cases["AccountedClientSideAdaptiveClipping/fixed"] = AccountedClientSideAdaptiveClipping(
        make_inner(), 0.5, N, sampling="fixed", clipped_count_stddev=1.0, rng=5
    )
    return cases


def test_every_exported_wrapper_is_covered():
    exported = {
        name
        for name in flwr_dp_strategies.__all__
        if inspect.isclass(obj := getattr(flwr_dp_strategies, name))
        and "strategy" in list(inspect.signature(obj.__init__).parameters)[1:2]
    }
    assert exported == {name.split("/")[0] for name in wrappers(FedAvg)}


@pytest.mark.parametrize("name", list(wrappers(FedAvg)))
def test_the_wrapped_strategys_schedule_and_records_reach_the_sampled_nodes(name):
    strategy = wrappers(LrScheduleFedAvg)[name]
    arrays = ArrayRecord([np.arange(3.0)])
    for server_round, lr in ((1, 0.05), (2, 0.025)):
        messages = list(strategy.configure_train(server_round, arrays, ConfigRecord(), LoopbackGrid.of(N)))
        assert sorted(m.metadata.dst_node_id for m in messages) == LoopbackGrid.of(N).node_ids
        for message in messages:
            content = message.content
            assert content["config"]["lr"] == pytest.approx(lr)
            assert content["config"]["server-round"] == server_round
            assert content["schedule"]["local-epochs"] == server_round
            np.testing.assert_array_equal(content["arrays"].to_numpy_ndarrays()[0], np.arange(3.0))
            assert message.metadata.message_type == "train"


POISSON = ["AccountedPoissonFixedClipping", "AccountedAdaptiveClipping", "AccountedClientSideAdaptiveClipping"]
OWN_SAMPLING = POISSON + ["AccountedBandedMatrixFactorization"]  # wrappers that choose the nodes themselves


@pytest.mark.parametrize("name", OWN_SAMPLING)
def test_per_node_content_goes_to_its_own_node(name):
    strategy = wrappers(PerNodeFedAvg)[name]
    messages = list(strategy.configure_train(1, ArrayRecord([np.zeros(2)]), ConfigRecord(), LoopbackGrid.of(N)))
    assert len(messages) == N
    assert all(m.content["config"]["partition"] == m.metadata.dst_node_id for m in messages)


@pytest.mark.parametrize("name", OWN_SAMPLING)
def test_per_node_content_for_a_node_the_wrapped_strategy_did_not_address_is_refused(name):
    strategy = wrappers(lambda: PerNodeFedAvg(fraction_train=0.5))[name]
    with pytest.raises(ValueError, match="did not address node"):
        strategy.configure_train(1, ArrayRecord([np.zeros(2)]), ConfigRecord(), LoopbackGrid.of(N))


@pytest.mark.parametrize("name", POISSON + ["AccountedAdaptiveClipping/fixed"])
def test_a_round_the_wrapped_strategy_does_not_train_sends_releases_and_books_nothing(name):
    strategy = wrappers(lambda: FedAvg(fraction_train=0.0))[name]
    current = ArrayRecord([np.zeros(2)])
    assert list(strategy.configure_train(1, current, ConfigRecord(), LoopbackGrid.of(N))) == []
    assert strategy.aggregate_train(1, []) == (None, None)
    assert strategy.ledger.rounds() == []
