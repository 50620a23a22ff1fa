"""Drop-in friction (issue 20): what an unchanged Flower app notices when it swaps in our strategies."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


# ---------------------------------------------------------------------------- 1. root log handler
def test_dp_accounting_warning_adds_no_root_handler_and_flower_logs_once():
    """dp-accounting warns through absl, whose log() calls basicConfig(): every Flower line then printed twice."""
    result = _run("""
        import logging
        import flwr_dp_strategies
        from dp_accounting.dp_event import GaussianDpEvent, PoissonSampledDpEvent
        from flwr_dp_strategies.privacy import PrivacyLedger
        ledger = PrivacyLedger(1e-5, neighboring_relation="add_or_remove_one")
        ledger.record(PoissonSampledDpEvent(0.5, GaussianDpEvent(0.5)), server_round=1, client=1)
        ledger.epsilon()
        assert logging.getLogger().handlers == [], logging.getLogger().handlers
        from flwr.common.logger import log
        log(logging.INFO, "flower-line-marker")
    """)
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert "failed to converge" in output  # the warning itself still reaches the user
    assert output.count("flower-line-marker") == 1, output[-2000:]


# ---------------------------------------------------------------------------- 6. helpers where they belong
def test_shared_helpers_live_in_the_module_of_what_they_do():
    import numpy as np
    from flwr.app import Array, ArrayRecord

    from flwr_dp_strategies.rounds import reply_screening
    from flwr_dp_strategies.strategy import accounted_fedavg, accounted_fixed_clipping
    from flwr_dp_strategies.rounds.streaming_aggregation import ClippedSum

    assert reply_screening.reply_arrays.__module__ == reply_screening.__name__
    assert reply_screening.reply_weight.__module__ == reply_screening.__name__
    assert accounted_fedavg.reply_arrays is reply_screening.reply_arrays  # public name kept as a re-export
    assert not hasattr(accounted_fixed_clipping, "_add_clipped")
    summed = ClippedSum({"w": np.zeros(3)}, clipping_norm=1.0)
    records = [
        ArrayRecord({"w": Array(np.array([3.0, 4.0, 0.0]))}),
        ArrayRecord({"w": Array(np.array([np.nan, 0, 0]))}),
    ]
    assert summed.add_records(records) == [1]
    assert np.allclose(summed.result()["w"], [0.6, 0.8, 0.0])


# ---------------------------------------------------------------------------- 2. lean metrics
def test_no_round_publishes_a_count_of_rejected_or_failed_replies(task_identity):
    import numpy as np
    from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

    from loopback import LoopbackGrid, run_round
    from flwr_dp_strategies import AccountedFedAvg

    strategy = AccountedFedAvg(min_train_nodes=3, min_available_nodes=3)
    current = [np.zeros(3)]

    def grid(bad=None):  # the bad-th message gets a NaN update
        def answer(i, msg):
            values = np.full(3, np.nan) if i == bad else np.ones(3)
            return Message(
                RecordDict(
                    {"arrays": ArrayRecord([values]), "metrics": MetricRecord({"num-examples": 5, "loss": 0.1})}
                ),
                reply_to=msg,
            )

        return LoopbackGrid.of(3, by_index=answer)

    _, _, (_, clean) = run_round(strategy, grid(), ArrayRecord(current), 1)
    assert not [key for key in clean if key.startswith(("rejected/", "replies/"))]
    assert strategy.rejections["train"] == {}
    _, _, (_, dirty) = run_round(strategy, grid(bad=0), ArrayRecord(current), 2)
    # the count depends on the client's data (a NaN update): kept on the server, never published
    assert not [key for key in dirty if key.startswith(("rejected/", "replies/"))]
    assert strategy.rejections["train"] == {"non-finite": 1}


# ---------------------------------------------------------------------------- 4. constructors
def _flower_parent(cls: type) -> type:
    """The first Flower strategy class in ``cls``'s MRO: the class it is a drop-in for."""
    return next(c for c in cls.__mro__[1:] if c.__module__.startswith("flwr.serverapp.strategy"))


def _parents():
    """Every exported strategy (the registry's) with the Flower class whose arguments it takes first; the
    wrapper of any strategy (whose first Flower base is the abstract ``Strategy``) is checked on its own."""
    from flwr.serverapp.strategy import FedAvg, Strategy

    from strategy_registry import exported_strategies

    parents = {cls: _flower_parent(cls) for cls in exported_strategies()}
    # positive control: the derivation finds the parents by name, not Strategy for all
    assert parents[__import__("flwr_dp_strategies").AccountedFedAvg] is FedAvg
    return {cls: parent for cls, parent in parents.items() if parent is not Strategy}


def test_every_strategy_takes_its_flower_parents_arguments_first_and_only_keyword_only_extras():
    import inspect

    import flwr_dp_strategies as fds

    from strategy_registry import REGISTRY, exported_strategies

    parents = _parents()
    strategies = {
        getattr(fds, name)
        for name in fds.__all__
        if isinstance(getattr(fds, name), type) and hasattr(getattr(fds, name), "aggregate_train")
    }
    assert strategies == set(parents) | {fds.ClusterEvaluation}  # no strategy left unchecked
    assert {p.__name__ for p in parents.values()} == {
        "FedAvg",
        "DifferentialPrivacyServerSideFixedClipping",
        "DifferentialPrivacyServerSideAdaptiveClipping",
        "DifferentialPrivacyClientSideAdaptiveClipping",
    }
    assert exported_strategies() == {entry.covers for entry in REGISTRY.values() if entry.covers in strategies}
    for ours, parent in parents.items():
        mine = list(inspect.signature(ours).parameters.values())
        theirs = list(inspect.signature(parent).parameters.values())
        assert [(p.name, p.kind, p.default) for p in mine[: len(theirs)]] == [
            (p.name, p.kind, p.default) for p in theirs
        ], ours.__name__
        extra = [
            p.name
            for p in mine[len(theirs) :]
            if p.kind is not inspect.Parameter.KEYWORD_ONLY
            and (p.kind, p.name) != _ACCOUNTING[ours.__init__ is fds.AccountedFedAvg.__init__]
        ]
        assert not extra, (ours.__name__, extra)
        assert mine[-1].kind is inspect.Parameter.VAR_KEYWORD, ours.__name__  # the accounting options, last
    # a wrapper of any strategy, as Flower's DP wrappers: the wrapped strategy first, the rest keyword-only
    wrapper = list(inspect.signature(fds.ClusterEvaluation).parameters.values())
    assert (wrapper[0].name, wrapper[0].kind) == ("strategy", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in wrapper[1:-1])
    assert (wrapper[-1].kind, wrapper[-1].name) == _ACCOUNTING[False]


#: the accounting options, keyword-only by construction (``**accounting``; AccountedFedAvg's ``**kwargs`` also
#: carries a combined Flower class's own arguments, e.g. FedProx's ``proximal_mu``)
_ACCOUNTING = {
    False: (inspect.Parameter.VAR_KEYWORD, "accounting"),
    True: (inspect.Parameter.VAR_KEYWORD, "kwargs"),
}


def test_positional_fedavg_arguments_keep_fedavg_meaning():
    from flwr.serverapp.strategy import FedAvg

    import flwr_dp_strategies as fds

    signds = fds.SignDS(0.1, 1.0, 3, 4, 5)
    assert (signds.fraction_train, signds.fraction_evaluate, signds.min_train_nodes) == (0.1, 1.0, 3)
    assert signds.params.sign_k == 0.01 and signds.params.sign_eps == 100.0  # defaults, not 0.1 / 1.0
    selection = fds.MinDivergenceExpSampling(0.5, num_selected=2, epsilon=1.0)
    assert selection.fraction_train == 0.5 and selection.num_selected == 2
    assert fds.NoisyObjectiveSum(0.5, num_classes=3).fraction_train == 0.5
    with pytest.raises(TypeError, match="num_selected"):  # the old positional form cannot pass silently
        fds.MinDivergenceExpSampling(2, 1.0)
    poisson = fds.AccountedPoissonFixedClipping(FedAvg(), 1.0, 1.0, num_sampled_clients=3)
    assert poisson.num_sampled_clients == 3 and poisson.accountant is None


def test_poisson_fixed_clipping_composes_into_a_flower_poisson_accountant(task_identity):
    import numpy as np
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.serverapp.strategy import FedAvg
    from flwr.supercore.privacy_accounting import NeighboringRelation, PrivacyConfig, SamplingMethod
    from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

    from loopback import LoopbackGrid
    from flwr_dp_strategies import AccountedPoissonFixedClipping

    def accountant(method, relation=NeighboringRelation.ADD_OR_REMOVE_ONE, max_epsilon=None):
        return RdpAccountant(
            PrivacyConfig(
                target_delta=1e-5,
                population_size=4,
                neighboring_relation=relation,
                sampling_method=method,
                max_epsilon=max_epsilon,
            )
        )

    with pytest.raises(ValueError, match="POISSON"):
        AccountedPoissonFixedClipping(FedAvg(), 1.0, 1.0, 2, accountant=accountant(SamplingMethod.NO_AMPLIFICATION))
    with pytest.raises(ValueError, match="population_size"):
        AccountedPoissonFixedClipping(
            FedAvg(), 1.0, 1.0, 2, accountant=accountant(SamplingMethod.POISSON), num_clients=5
        )
    flower = accountant(SamplingMethod.POISSON)
    strategy = AccountedPoissonFixedClipping(FedAvg(), 1.0, 1.0, 2, accountant=flower, rng=0)
    assert strategy.num_clients == 4
    current = ArrayRecord({"w": Array(np.zeros(3))})
    messages = list(strategy.configure_train(1, current, ConfigRecord(), LoopbackGrid.of(4)))
    replies = [
        Message(
            RecordDict({"arrays": ArrayRecord({"w": Array(np.ones(3))}), "metrics": MetricRecord({"num-examples": 1})}),
            reply_to=m,
        )
        for m in messages
    ]
    _, metrics = strategy.aggregate_train(1, replies)
    assert flower.num_releases == 1  # the same Poisson(q = 2/4)-sampled Gaussian, by Flower's RDP accountant
    assert strategy.privacy_spent().epsilon == pytest.approx(metrics["privacy/epsilon-rdp"], rel=0.05)
    tight = AccountedPoissonFixedClipping(
        FedAvg(), 1.0, 1.0, 2, accountant=accountant(SamplingMethod.POISSON, max_epsilon=0.5)
    )
    assert list(tight.configure_train(1, current, ConfigRecord(), LoopbackGrid.of(4))) == [] and tight.budget_exhausted


def test_fixed_clipping_drives_a_flower_accountant_through_its_public_protocol_only(task_identity, monkeypatch):
    """Issue 36 item 5: no call into Flower's private ``_prepare_accounting`` / ``_pop_pending_event`` /
    ``_compose_release``; the accountant gets one Gaussian(z) per release, also around FedAdam (which Flower's own
    wrapper refuses with an accountant: it adds the noise after the optimizer's step)."""
    import numpy as np
    from dp_accounting.dp_event import GaussianDpEvent
    from dp_accounting.rdp import RdpAccountant as DpAccountingRdp
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping as Flower
    from flwr.serverapp.strategy import FedAdam, FedAvg
    from flwr.supercore.privacy_accounting import NeighboringRelation, PrivacyConfig, SamplingMethod
    from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

    from loopback import LoopbackGrid
    from flwr_dp_strategies import AccountedServerSideFixedClipping

    for private in ("_prepare_accounting", "_pop_pending_event", "_compose_release"):
        monkeypatch.setattr(Flower, private, lambda *a, **k: pytest.fail(f"{private} called"))

    def accountant(method=SamplingMethod.NO_AMPLIFICATION, max_epsilon=None):
        config = PrivacyConfig(1e-5, 4, NeighboringRelation.ADD_OR_REMOVE_ONE, method, max_epsilon)
        return RdpAccountant(config)

    with pytest.raises(ValueError, match="NO_AMPLIFICATION"):
        AccountedServerSideFixedClipping(FedAvg(), 1.0, 1.0, 2, accountant=accountant(SamplingMethod.POISSON))
    with pytest.raises(ValueError, match="population_size"):
        AccountedServerSideFixedClipping(FedAvg(), 1.0, 1.0, 5, accountant=accountant())
    with pytest.raises(ValueError, match="noise_sampler"):
        AccountedServerSideFixedClipping(FedAvg(), 1.0, 1.0, 2, accountant=accountant(), noise_sampler="secure")
    current = ArrayRecord({"w": Array(np.zeros(3))})
    for wrapped in (FedAvg(fraction_train=0.5), FedAdam(fraction_train=0.5)):
        flower = accountant()
        strategy = AccountedServerSideFixedClipping(wrapped, 2.0, 1.0, 2, accountant=flower, rng=0)
        for server_round in (1, 2):
            messages = list(strategy.configure_train(server_round, current, ConfigRecord(), LoopbackGrid.of(4)))
            replies = [
                Message(
                    RecordDict(
                        {"arrays": ArrayRecord({"w": Array(np.ones(3))}), "metrics": MetricRecord({"num-examples": 1})}
                    ),
                    reply_to=m,
                )
                for m in messages[:1]  # fewer replies than m: the fixed denominator makes it the same mechanism
            ]
            arrays, _ = strategy.aggregate_train(server_round, replies)
            assert arrays is not None
        reference = DpAccountingRdp()
        reference.compose(GaussianDpEvent(2.0), 2)
        assert flower.num_releases == 2
        assert flower.get_epsilon(1e-5) == pytest.approx(reference.get_epsilon(1e-5), rel=1e-6)
    tight = AccountedServerSideFixedClipping(FedAvg(), 1.0, 1.0, 2, accountant=accountant(max_epsilon=0.5))
    assert list(tight.configure_train(1, current, ConfigRecord(), LoopbackGrid.of(4))) == [] and tight.budget_exhausted


# ---------------------------------------------------------------------------- 3. Flower's log lines
def _messages(strategy, phase, rnd, n=3):
    import numpy as np
    from flwr.app import ArrayRecord, ConfigRecord

    from loopback import LoopbackGrid

    configure = strategy.configure_train if phase == "train" else strategy.configure_evaluate
    return list(configure(rnd, ArrayRecord([np.zeros(3)]), ConfigRecord(), LoopbackGrid.of(n)))


def _replies(messages, train=True):
    import numpy as np
    from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

    content = (lambda: {"arrays": ArrayRecord([np.ones(3)])}) if train else dict
    return [
        Message(RecordDict({**content(), "metrics": MetricRecord({"num-examples": 5, "accuracy": 0.5})}), reply_to=m)
        for m in messages
    ]


def test_flowers_received_line_is_logged_once_per_round_and_phase(task_identity, caplog):
    import logging

    from flwr.serverapp.strategy import FedAvg

    import flwr_dp_strategies as fds

    kw = {"min_train_nodes": 3, "min_evaluate_nodes": 3, "min_available_nodes": 3}
    for strategy in (
        fds.AccountedFedAvg(**kw),
        fds.ClusterEvaluation(fds.AccountedFedAvg(**kw)),
        fds.ClusterEvaluation(FedAvg(**kw)),
        fds.AccountedServerSideFixedClipping(FedAvg(**kw), 1.0, 1.0, 3),
    ):
        for phase in ("train", "evaluate"):
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="flwr"):
                replies = _replies(_messages(strategy, phase, 1), train=phase == "train")
                getattr(strategy, f"aggregate_{phase}")(1, replies)
            lines = [r.getMessage() for r in caplog.records if "results and" in r.getMessage()]
            assert lines == [f"aggregate_{phase}: Received 3 results and 0 failures"], (strategy, phase, lines)


def test_summary_lines_stay_inside_flowers_tree(caplog):
    import logging

    from flwr.serverapp.strategy import FedAvg

    import flwr_dp_strategies as fds

    for strategy in (
        fds.AccountedServerSideFixedClipping(FedAvg(), 1.0, 1.0, 3),
        fds.AccountedPoissonFixedClipping(FedAvg(), 1.0, 1.0, 3),
        fds.AccountedAdaptiveClipping(FedAvg(), 0.1, 3),
        fds.AccountedClientSideAdaptiveClipping(FedAvg(), 0.1, 3),
    ):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="flwr"):
            strategy.summary()
        top = [r.getMessage() for r in caplog.records if r.getMessage().startswith(("\t├──>", "\t└──>"))]
        assert any("epsilon=" in line for line in top), strategy  # the ledger is in the summary
        assert top[-1].startswith("\t└──>") and all(line.startswith("\t├──>") for line in top[:-1]), (strategy, top)


# ---------------------------------------------------------------------------- 5. wrappers and counterparts
def test_cluster_evaluation_reads_the_wrapped_strategys_attributes():
    from flwr.serverapp.strategy import FedAvg

    import flwr_dp_strategies as fds

    inner = FedAvg(fraction_train=0.3, weighted_by_key="n")
    wrapped = fds.ClusterEvaluation(inner)
    assert wrapped.fraction_train == 0.3 and wrapped.weighted_by_key == "n"
    assert wrapped.train_metrics_aggr_fn is inner.train_metrics_aggr_fn
    assert wrapped.min_available_nodes == inner.min_available_nodes
    assert wrapped.ledger is not None and wrapped.max_weight == fds.ClusterEvaluation(FedAvg()).max_weight  # its own
    with pytest.raises(AttributeError, match="no_such_setting"):
        wrapped.no_such_setting  # noqa: B018


def _warnings(caplog, needle):
    import logging

    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and needle in r.getMessage()]


def test_cluster_evaluation_says_once_what_an_unchanged_client_must_add(task_identity, caplog):
    import logging

    from flwr.serverapp.strategy import FedAvg

    import flwr_dp_strategies as fds

    strategy = fds.ClusterEvaluation(FedAvg(min_evaluate_nodes=3, min_available_nodes=3))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        for rnd in (1, 2):
            strategy.aggregate_evaluate(rnd, _replies(_messages(strategy, "evaluate", rnd), train=False))
    hints = _warnings(caplog, "LaplaceInferenceMod")
    assert len(hints) == 1 and "'inference'" in hints[0] and "@app.evaluate(mods=" in hints[0]


def test_signds_says_once_that_its_clients_lack_signds_mod(task_identity, caplog):
    import logging

    import flwr_dp_strategies as fds

    strategy = fds.SignDS(min_train_nodes=3, min_available_nodes=3)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        for rnd in (1, 2):
            arrays, _ = strategy.aggregate_train(rnd, _replies(_messages(strategy, "train", rnd)))
            assert arrays is None
    hints = _warnings(caplog, "signds_mod")
    assert len(hints) == 1 and "@app.train(mods=[signds_mod])" in hints[0]
    assert fds.SignDS.__doc__.splitlines()[0].count("signds_mod")  # said in the docstring's first line


def test_client_mods_name_their_server_counterpart_in_one_error(task_identity):
    import numpy as np
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict

    import importlib

    from client_mods import LaplaceInferenceMod, signds_mod

    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    plain_config = ConfigRecord({"lr": 0.1})  # what FedAvg's app sends

    def plain_reply(msg, ctx):
        return Message(
            RecordDict(
                {"arrays": ArrayRecord([np.ones(2)]), "metrics": MetricRecord({"num-examples": 3, "accuracy": 0.5})}
            ),
            reply_to=msg,
        )

    def message(kind):
        return Message(
            RecordDict({"arrays": ArrayRecord([np.zeros(2)]), "config": plain_config}), dst_node_id=7, message_type=kind
        )

    with pytest.raises(KeyError) as err:
        signds_mod(message(MessageType.TRAIN), context, plain_reply)
    assert "flwr_dp_strategies.SignDS" in str(err.value) and not str(err.value).startswith(("'", '"'))
    with pytest.raises(ValueError, match="ClusterEvaluation") as err:
        LaplaceInferenceMod()(message(MessageType.EVALUATE), context, plain_reply)
    assert "LaplaceInferenceMod(epsilon=" in str(err.value)
    with pytest.raises(ValueError, match="'inference'") as err:
        LaplaceInferenceMod(epsilon=1.0)(message(MessageType.EVALUATE), context, plain_reply)
    assert "Return it in the reply" in str(err.value)
    for name, counterpart in (("laplace_inference", "ClusterEvaluation"), ("signds_mod", "flwr_dp_strategies.SignDS")):
        module = importlib.import_module(f"client_mods.{name}")  # the counterpart in the docstring's first lines
        assert counterpart in "\n".join(module.__doc__.splitlines()[:8]), name
    assert "flwr_dp_strategies.SignDS" in signds_mod.__doc__.splitlines()[0]
    assert "inference" in "\n".join(LaplaceInferenceMod.__doc__.splitlines()[:5])


def test_accounted_fedavg_combines_with_another_fedavg_variant():
    from flwr.serverapp.strategy import FedProx

    from flwr_dp_strategies import AccountedFedAvg

    class AccountedFedProx(AccountedFedAvg, FedProx):
        pass

    strategy = AccountedFedProx(0.5, proximal_mu=0.1, min_train_nodes=3)
    assert (strategy.fraction_train, strategy.proximal_mu, strategy.min_train_nodes) == (0.5, 0.1, 3)
    with pytest.raises(TypeError):
        AccountedFedAvg(proximal_mu=0.1)  # FedAvg takes no such argument
