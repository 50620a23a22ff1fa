"""The one accounted round: the template cannot be bypassed, and it books what a release returns.

Also the worked example of docs/architecture.md ("Add a strategy"), which lives in
``examples/add-a-strategy/noisy_clipped_mean.py`` and is run here as a user would run it.
"""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from dp_accounting.dp_event import GaussianDpEvent
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

import flwr_dp_strategies
from loopback import LoopbackGrid
from flwr_dp_strategies import AccountedFedAvg
from flwr_dp_strategies.declarations import declare_release
from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.rounds.template import TEMPLATE_METHODS, AccountedRound, Booking

pytestmark = pytest.mark.usefixtures("task_identity")
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "add-a-strategy"


def _reply(message: Message, values: np.ndarray, weight: float = 1.0) -> Message:
    content = RecordDict({"arrays": ArrayRecord([values]), "metrics": MetricRecord({"num-examples": weight})})
    return Message(content, reply_to=message)


def _round(strategy, server_round: int, model: np.ndarray, updates: list[np.ndarray]):
    messages = list(
        strategy.configure_train(server_round, ArrayRecord([model]), ConfigRecord(), LoopbackGrid.of(len(updates)))
    )
    return strategy.aggregate_train(server_round, [_reply(m, u) for m, u in zip(messages, updates)])


@pytest.mark.parametrize("method", TEMPLATE_METHODS)
def test_a_strategy_cannot_replace_the_template(method):
    with pytest.raises(TypeError, match=method):
        type("Bypass", (AccountedFedAvg,), {method: lambda self, server_round, replies: None})


def test_every_exported_strategy_runs_the_template():
    """Every exported Flower strategy of the package is an AccountedRound, and no class in its MRO
    above the template defines the template's methods (the class statement would have raised)."""
    strategies = [getattr(flwr_dp_strategies, name) for name in flwr_dp_strategies.__all__]
    strategies = [cls for cls in strategies if isinstance(cls, type) and hasattr(cls, "configure_train")]
    assert len(strategies) >= 12
    for cls in strategies:
        assert issubclass(cls, AccountedRound), cls.__name__
        below = cls.__mro__[: cls.__mro__.index(AccountedRound)]
        assert not any(method in klass.__dict__ for klass in below for method in TEMPLATE_METHODS), cls.__name__


class _NoChain(AccountedFedAvg):
    """A strategy whose node choice does not chain to any parent of this package (it calls Flower's FedAvg
    directly): before the template owned configure, this switched off the identity check."""

    def instruct_train(self, server_round, arrays, config, grid):
        self._spec = None
        return list(FedAvg.configure_train(self, server_round, arrays, config, grid))


def test_a_hook_that_does_not_chain_keeps_the_identity_check():
    strategy = _NoChain(min_train_nodes=3, min_available_nodes=3)
    messages = list(strategy.configure_train(1, ArrayRecord([np.zeros(3)]), ConfigRecord(), LoopbackGrid.of(3)))
    assert len(messages) == 3
    forged = Message(
        RecordDict({"arrays": ArrayRecord([np.full(3, 100.0)]), "metrics": MetricRecord({"num-examples": 1.0})}),
        reply_to=messages[0],
    )
    forged.metadata.__dict__["_src_node_id"] = 999  # a node that was sent no instruction
    assert forged.metadata.src_node_id == 999
    arrays, _ = strategy.aggregate_train(1, [_reply(m, np.ones(3)) for m in messages] + [forged])
    assert strategy.rejections["train"] == {"identity": 1}
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], 1.0)  # the forged update is not in the mean
    assert "999" not in strategy.ledger.clients


def _declared_reply(message: Message, values: np.ndarray) -> Message:
    reply = _reply(message, values)
    declare_release(reply.content, GaussianDpEvent(2.0), label="local", neighboring_relation="replace_one")
    return reply


class _Watching(AccountedFedAvg):
    """Records how many events the ledger held when the release ran; fails the release when asked to."""

    fail = False

    def release_train(self, server_round, screened):
        self.seen = len(self.ledger.events(101))
        if self.fail:
            raise RuntimeError("the mechanism failed")
        return super().release_train(server_round, screened)


def test_screening_books_nothing_the_book_step_books_each_declaration_once():
    strategy = _Watching(min_train_nodes=2, min_available_nodes=2)
    model = ArrayRecord([np.zeros(3)])
    messages = list(strategy.configure_train(1, model, ConfigRecord(), LoopbackGrid.of(2)))
    strategy.aggregate_train(1, [_declared_reply(m, np.ones(3)) for m in messages])
    assert strategy.seen == 0  # screening read the declarations, the release ran before any booking
    assert [label for _, _, label in strategy.ledger.events(101)] == ["local"]  # booked once, after


def test_a_failing_release_still_books_what_screening_found(tmp_path):
    path = tmp_path / "ledger.json"
    strategy = _Watching(min_train_nodes=2, min_available_nodes=2, ledger_path=str(path))
    strategy.fail = True
    messages = list(strategy.configure_train(1, ArrayRecord([np.zeros(3)]), ConfigRecord(), LoopbackGrid.of(2)))
    with pytest.raises(RuntimeError, match="mechanism failed"):
        strategy.aggregate_train(1, [_declared_reply(m, np.ones(3)) for m in messages])
    reopened = _Watching(min_train_nodes=2, min_available_nodes=2, ledger_path=str(path), resume=True)
    assert strategy.ledger.epsilon(101) > 0  # booked
    assert reopened.ledger.epsilon(101) == pytest.approx(strategy.ledger.epsilon(101))  # and saved


class _Counting(AccountedFedAvg):
    """A release that books one central event in the main ledger and one in a second ledger."""

    def release_train(self, server_round, screened):
        release = super().release_train(server_round, screened)
        other = self.ledger_store.claim("other", None, lambda: PrivacyLedger(1e-5))
        release.bookings += [
            Booking(GaussianDpEvent(3.0), "central"),
            Booking(GaussianDpEvent(1.0), "other", ledger=other),
        ]
        release.ledger_figures = lambda: {"other/epsilon": other.epsilon()}
        return release


def test_the_template_books_each_booking_in_its_ledger_saves_and_publishes_figures_read_after(tmp_path):
    path = tmp_path / "ledger.json"
    strategy = _Counting(min_train_nodes=3, min_available_nodes=3, ledger_path=str(path))
    updates = [np.ones(3), np.full(3, np.nan), 2 * np.ones(3)]  # undeclared; one found non-finite
    arrays, metrics = _round(strategy, 1, np.zeros(3), updates)
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], 1.5)
    assert strategy.rejections["train"] == {"non-finite": 1}
    other = strategy.ledger_store.claim("other", None, lambda: PrivacyLedger(1e-5))
    assert metrics["other/epsilon"] == pytest.approx(other.epsilon()) and other.epsilon() > 0
    # the three undeclared replies (the non-finite one too: its raw update reached the server) read inf
    for node in (101, 102, 103):
        assert strategy.ledger.epsilon(node) == math.inf
    assert len(strategy.ledger.rounds()) == 1 and path.exists()
    reopened = _Counting(min_train_nodes=3, min_available_nodes=3, ledger_path=str(path), resume=True)
    assert reopened.ledger.epsilon(101) == math.inf
    assert reopened.ledger_store.claim("other", None, lambda: PrivacyLedger(1e-5)).epsilon() == pytest.approx(
        other.epsilon()
    )


# --------------------------------------------------------------------------- the worked example
@pytest.fixture(scope="module")
def example():
    sys.path.insert(0, str(EXAMPLE))
    try:
        import noisy_clipped_mean
    finally:
        sys.path.remove(str(EXAMPLE))
    return noisy_clipped_mean


def test_the_worked_example_in_the_docs_is_the_tested_module(example):
    doc = (Path(__file__).resolve().parent.parent / "docs" / "architecture.md").read_text()
    source = Path(example.__file__).read_text()
    klass = source[source.index("class NoisyClippedMean") :]
    assert klass.strip() in doc


def test_the_worked_example_releases_the_noisy_clipped_mean_and_books_one_gaussian(example):
    d, m, z, c = 20_000, 4, 2.0, 1.0
    strategy = example.NoisyClippedMean(
        min_train_nodes=m, min_available_nodes=m, clipping_norm=c, noise_multiplier=z, num_sampled_clients=m, rng=11
    )
    updates = [np.full(d, 10.0 / math.sqrt(d)) for _ in range(m)]  # norm 10: clipped to 1
    arrays, metrics = _round(strategy, 1, np.zeros(d), updates)
    released = arrays.to_numpy_ndarrays()[0]
    noise = released - 1.0 / math.sqrt(d)  # m clipped updates over m
    sigma = z * c / m
    # the sample std of d normals is within 4 * sigma / sqrt(2d) of sigma; 10 % off is 14 such widths away
    assert abs(noise.std() - sigma) < 4 * sigma / math.sqrt(2 * d)
    fresh = PrivacyLedger(1e-5)
    fresh.record(GaussianDpEvent(z), server_round=1)
    assert metrics["privacy/epsilon"] == pytest.approx(fresh.epsilon())
    assert strategy.ledger.rounds() == [1]


def test_the_registry_snippet_in_the_docs_runs_as_written(example, tmp_path):
    """The page's registry entry, executed as printed, builds the strategy with the keyword arguments the
    cross-cutting suites pass (the restart suite passes ``ledger_path`` and ``resume``)."""
    import strategy_registry

    doc = (Path(__file__).resolve().parent.parent / "docs" / "architecture.md").read_text()
    after = doc[doc.index("Then register it in `tests/strategy_registry.py`") :]
    code = after[after.index("```python") + len("```python") : after.index("```", after.index("```python") + 9)]
    namespace = {
        "Entry": strategy_registry.Entry,
        "NoisyClippedMean": example.NoisyClippedMean,
        "N": strategy_registry.N,
        "kwargs": strategy_registry.kwargs,
    }
    (entry,) = eval(code.strip(), namespace)  # noqa: S307  (the docs' own snippet)
    strategy = entry.make(ledger_path=str(tmp_path / "ledger.json"), resume=False)
    assert isinstance(strategy, example.NoisyClippedMean) and strategy.ledger_path == str(tmp_path / "ledger.json")
    arrays, metrics = _round(strategy, 1, np.zeros(3), [np.ones(3)] * strategy_registry.N)
    assert arrays is not None and metrics["privacy/epsilon"] > 0


class _RejectsAStranger(AccountedFedAvg):
    """A release that tries to reject a reply that is not one of the accepted ones (an index into another list
    used to reject whichever accepted reply sat at that position)."""

    def release_train(self, server_round, screened):
        stranger = screened.replies[0]  # rejected by screening: not in accepted
        screened.reject([stranger], "values")
        return super().release_train(server_round, screened)


def test_reject_takes_the_accepted_replies_themselves():
    strategy = _RejectsAStranger(min_train_nodes=2, min_available_nodes=2)
    messages = list(strategy.configure_train(1, ArrayRecord([np.zeros(3)]), ConfigRecord(), LoopbackGrid.of(2)))
    replies = [_reply(messages[0], np.full(3, np.nan)), _reply(messages[1], np.ones(3))]
    replies[0].content["metrics"] = MetricRecord({"num-examples": -1.0})  # screening rejects it (weight)
    with pytest.raises(ValueError, match="not one of the accepted replies"):
        strategy.aggregate_train(1, replies)


def test_one_undeclared_client_leaves_the_published_epsilon_finite_and_is_counted_in_the_log(caplog):
    strategy = AccountedFedAvg(min_train_nodes=3, min_available_nodes=3)
    messages = list(strategy.configure_train(1, ArrayRecord([np.zeros(3)]), ConfigRecord(), LoopbackGrid.of(3)))
    replies = [_declared_reply(messages[0], np.ones(3)), _declared_reply(messages[1], np.ones(3))]
    replies.append(_reply(messages[2], np.ones(3)))  # declares nothing: its raw update reached the server
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _, metrics = strategy.aggregate_train(1, replies)
    plain, declared = (int(m.metadata.dst_node_id) for m in (messages[2], messages[0]))
    assert strategy.ledger.epsilon(plain) == math.inf and strategy.ledger.epsilon() == math.inf
    assert metrics["privacy/epsilon"] == pytest.approx(strategy.ledger.epsilon(declared))  # before: inf from now on
    assert "1 client(s) sent a non-private release" in caplog.text and str(plain) in caplog.text


class _Collecting(AccountedFedAvg):
    """A two-message protocol: its collect stage gathers a value (and books what its messages released) that the
    release then reads."""

    def collect_train(self, server_round, screened):
        from flwr_dp_strategies.rounds.template import Collected

        self.ledger_before_release = len(self.ledger.events())
        return Collected(value=len(screened.accepted), bookings=[Booking(GaussianDpEvent(3.0), "collect stage")])

    def release_train(self, server_round, screened):
        self.collected = screened.collected
        assert len(self.ledger.events()) == self.ledger_before_release  # nothing booked before the book step
        return super().release_train(server_round, screened)


def test_the_collect_stage_runs_between_screening_and_the_release_and_is_booked_with_it():
    strategy = _Collecting(min_train_nodes=2, min_available_nodes=2)
    arrays, metrics = _round(strategy, 1, np.zeros(3), [np.ones(3), np.ones(3)])
    assert strategy.collected == 2 and arrays is not None
    assert [label for _, _, label in strategy.ledger.events()] == ["collect stage"]


def test_secure_aggregation_unmasks_in_the_collect_stage():
    """DistributedDpFedAvg's unmask stage is the template's collect stage: its release only decodes."""
    from flwr_dp_strategies.rounds.secure_aggregation import Revealed
    from strategy_registry import REGISTRY

    entry = REGISTRY["DistributedDpFedAvg"]
    strategy, grid = entry.make(), entry.grid()
    seen = {}
    release = strategy.release_train
    strategy.release_train = lambda rnd, screened: (
        seen.setdefault("collected", screened.collected) and release(rnd, screened)
    )
    msgs = list(strategy.configure_train(1, entry.model(), ConfigRecord(), grid))
    arrays, _ = strategy.aggregate_train(1, entry.train_replies(grid, msgs))
    assert isinstance(seen["collected"], Revealed) and seen["collected"].total is not None and arrays is not None
