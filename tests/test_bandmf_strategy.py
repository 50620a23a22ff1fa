"""AccountedBandedMatrixFactorization (issue 30): the participation rule enforced on the grid, the correlated
noise in the released model, the booked ε and a restart that continues the same noise stream."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.dp_event import GaussianDpEvent
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from flwr_dp_strategies import AccountedBandedMatrixFactorization, PrivacyLedger
from flwr_dp_strategies.privacy.mechanisms import matrix_factorization as mf
from flwr_dp_strategies.privacy.accounting.ledger_file import LedgerFileError
from loopback import LoopbackGrid

pytestmark = pytest.mark.usefixtures("task_identity")

N, BANDS = 12, 3


def make(z=1.0, clip=1.0, m=4, **kwargs) -> AccountedBandedMatrixFactorization:
    kwargs.setdefault("num_bands", BANDS)
    kwargs.setdefault("num_rounds", 6)
    return AccountedBandedMatrixFactorization(FedAvg(fraction_train=1.0, min_available_nodes=1), z, clip, m, **kwargs)


def model(d=4) -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros(d, np.float32))})


def answer(msg: Message, update: float, d=4) -> Message:
    arrays = ArrayRecord({"w": Array(np.full(d, update, np.float32))})
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": 5})}), reply_to=msg)


def run_round(strategy, server_round, grid, update=0.01, d=4):
    msgs = list(strategy.configure_train(server_round, model(d), ConfigRecord(), grid))
    arrays, metrics = strategy.aggregate_train(server_round, [answer(m, update, d) for m in msgs])
    return msgs, arrays, metrics


def nodes(msgs):
    return sorted(int(m.metadata.dst_node_id) for m in msgs)


def test_nodes_train_in_their_group_every_b_rounds_at_most_k_times():
    strategy = make(rng=1, num_rounds=9, max_participations=2)
    grid = LoopbackGrid.of(N)
    trained = [nodes(run_round(strategy, r, grid)[0]) for r in range(1, 10)]
    assert [len(t) for t in trained[:6]] == [N // BANDS] * 6 and trained[6:] == [[], [], []]  # k = 2 reached
    for r, group in enumerate(trained[:6]):
        assert group == trained[r % BANDS]  # the same group every b rounds
    assert sorted(sum(trained[:BANDS], [])) == list(range(101, 101 + N))  # b disjoint groups cover the nodes


def test_a_node_breaking_min_separation_is_never_aggregated(monkeypatch):
    """Round 2 asks every node (a broken sampler): the nodes aggregated in round 1 are refused as
    ``participation`` and nothing of theirs is added; the round goes on with the others."""
    m, d = 4, 4
    strategy = make(z=1e-9, m=m, rng=2)  # z tiny: the release is the clipped mean
    grid = LoopbackGrid.of(N)
    first, _, _ = run_round(strategy, 1, grid)
    monkeypatch.setattr(strategy.participation, "select", lambda node_ids, release: sorted(node_ids))
    msgs = list(strategy.configure_train(2, model(d), ConfigRecord(), grid))
    assert len(msgs) == N
    early = set(nodes(first))
    replies = [answer(msg, 0.5 if int(msg.metadata.dst_node_id) in early else 0.01) for msg in msgs]
    arrays, metrics = strategy.aggregate_train(2, replies)
    assert strategy.rejections["train"] == {"participation": len(early)}
    allowed = N - len(early)
    np.testing.assert_allclose(arrays["w"].numpy(), np.full(d, allowed * 0.01 / m), atol=1e-6)
    assert all(strategy.participation.counts[node] == 1 for node in early)  # not counted twice
    assert "privacy/epsilon" in metrics


def test_a_node_past_its_cap_is_refused(monkeypatch):
    strategy = make(z=1e-9, rng=3, num_rounds=9, max_participations=1)
    grid = LoopbackGrid.of(N)
    first, _, _ = run_round(strategy, 1, grid)
    run_round(strategy, 2, grid)
    run_round(strategy, 3, grid)
    monkeypatch.setattr(strategy.participation, "select", lambda node_ids, release: sorted(node_ids))
    _, arrays, _ = run_round(strategy, 4, grid)  # release 4 is group 0's again, but k = 1
    assert strategy.rejections["train"] == {"participation": N}
    np.testing.assert_allclose(arrays["w"].numpy(), 0.0, atol=1e-6)


def test_the_released_noise_is_the_stream_scaled_by_z_clip_over_m():
    """No replies: release t is w + zC/m · (C⁻¹Z)_t, the stream of the core with the same draws."""
    z, clip, m, d = 1.5, 0.7, 4, 500
    strategy = make(z=z, clip=clip, m=m, rng=11, num_rounds=5)
    grid = LoopbackGrid.of(N)
    released = []
    for r in range(1, 6):
        strategy.configure_train(r, model(d), ConfigRecord(), grid)
        arrays, _ = strategy.aggregate_train(r, [])
        released.append(arrays["w"].numpy().astype(np.float64))
    noise = mf.BandedNoise(mf.banded_sqrt_coefficients(BANDS), d, mf.noise_key(11))
    expected = [z * clip / m * noise.next() for t in range(1, 6)]
    np.testing.assert_allclose(np.array(released), np.array(expected), rtol=1e-5, atol=1e-6)


def test_the_booked_epsilon_is_one_gaussian_of_multiplier_z_over_sens():
    z, rounds, k = 1.2, 6, 2
    strategy = make(z=z, rng=4, num_rounds=rounds)
    grid = LoopbackGrid.of(N)
    for r in range(1, rounds + 1):
        run_round(strategy, r, grid)
    sens = mf.prefix_sensitivities(strategy.coefficients, rounds, BANDS, k)[-1]
    assert sens == pytest.approx(math.sqrt(k))
    expected = PLDAccountant().compose(GaussianDpEvent(z / sens)).get_epsilon(1e-5)
    assert strategy.ledger.report().epsilon_pld == pytest.approx(expected, rel=1e-2)
    assert list(strategy.configure_train(rounds + 1, model(), ConfigRecord(), grid)) == []  # past num_rounds


def test_training_stops_before_the_budget_is_exceeded():
    strategy = make(z=1.0, rng=5, num_rounds=6, ledger=PrivacyLedger(1e-5, max_epsilon=5.0))
    grid = LoopbackGrid.of(N)
    released = sum(bool(run_round(strategy, r, grid)[0]) for r in range(1, 7))
    assert released == 3 and strategy.ledger.epsilon() <= 5.0  # ε after releases 1..6: 3.6, 4.1, 4.4, 6.0, ...


def _noise_run(path, rounds, resume=False, start=1):
    strategy = make(rng=9, ledger_path=path, resume=resume, num_rounds=6)
    grid = LoopbackGrid.of(N)
    out = []
    for r in range(start, start + rounds):
        strategy.configure_train(r, model(64), ConfigRecord(), grid)
        arrays, _ = strategy.aggregate_train(r, [])
        out.append(arrays["w"].numpy())
    strategy.ledger_store.close()
    return strategy, out


def test_a_restarted_run_continues_the_same_noise_stream(tmp_path):
    whole, straight = _noise_run(tmp_path / "a.json", 6)
    _, before = _noise_run(tmp_path / "b.json", 3)
    resumed, after = _noise_run(tmp_path / "b.json", 3, resume=True)  # Flower's rounds restart at 1
    np.testing.assert_array_equal(np.array(before + after), np.array(straight))
    assert resumed.releases == 6 and resumed.participation.to_state() == whole.participation.to_state()
    assert resumed.ledger.epsilon() == pytest.approx(whole.ledger.epsilon())
    key = tmp_path / "b.json.bandmf-key"
    assert (key.stat().st_mode & 0o777) == 0o600
    assert [p.name for p in tmp_path.glob("b.json.bandmf-*")] == [key.name]  # one key file, O(1), written once


def test_the_state_on_disk_does_not_grow_with_the_model(tmp_path):
    sizes = {}
    for d in (16, 4096):
        path = tmp_path / f"{d}.json"
        strategy = make(rng=9, ledger_path=path, num_rounds=6)
        grid = LoopbackGrid.of(N)
        for r in range(1, 4):
            strategy.configure_train(r, model(d), ConfigRecord(), grid)
            strategy.aggregate_train(r, [])
        strategy.ledger_store.close()
        sizes[d] = sum(p.stat().st_size for p in tmp_path.glob(f"{d}.json*"))
    assert abs(sizes[4096] - sizes[16]) < 64 and sizes[4096] < 1 << 20  # the key, the ledger: nothing of size d


def test_without_a_seed_the_key_is_fresh_os_entropy_and_a_restart_continues_it(tmp_path):
    path = tmp_path / "l.json"
    first = make(ledger_path=path, num_rounds=6)
    grid = LoopbackGrid.of(N)
    for r in range(1, 3):
        first.configure_train(r, model(8), ConfigRecord(), grid)
        first.aggregate_train(r, [])
    first.ledger_store.close()
    other = make(ledger_path=tmp_path / "o.json", num_rounds=6)
    other.configure_train(1, model(8), ConfigRecord(), grid)
    other.aggregate_train(1, [])
    assert other.noise.key != first.noise.key and first.noise.key not in (mf.noise_key(0), mf.noise_key(9))
    resumed = make(ledger_path=path, resume=True, num_rounds=6)
    resumed.configure_train(1, model(8), ConfigRecord(), grid)
    arrays, _ = resumed.aggregate_train(1, [])
    first.noise.next()
    assert resumed.noise.key == first.noise.key and resumed.noise.count == 3
    np.testing.assert_array_equal(resumed.noise.buffer, first.noise.buffer)


def test_a_replay_that_differs_from_the_released_stream_is_refused(tmp_path):
    path = tmp_path / "l.json"
    _noise_run(path, 2)
    state = make(rng=9, ledger_path=path, resume=True)
    state._check_value = "0" * 64  # what a replay on another numpy build would disagree with
    with pytest.raises(LedgerFileError, match="replayed"):
        state.configure_train(1, model(64), ConfigRecord(), LoopbackGrid.of(N))
        state.aggregate_train(1, [])


@pytest.mark.parametrize("fault", ["altered", "missing"])
def test_a_restart_without_its_noise_state_is_refused(tmp_path, fault):
    path = tmp_path / "l.json"
    strategy, _ = _noise_run(path, 2)
    noise = tmp_path / "l.json.bandmf-key"
    if fault == "missing":
        noise.unlink()
    else:
        noise.write_bytes(noise.read_bytes()[:-1] + b"\x01")
    with pytest.raises(LedgerFileError, match="noise key"):
        make(rng=9, ledger_path=path, resume=True)


def test_a_restart_with_other_bands_is_refused(tmp_path):
    path = tmp_path / "l.json"
    _noise_run(path, 2)
    with pytest.raises(LedgerFileError, match="num_bands"):
        make(rng=9, ledger_path=path, resume=True, num_bands=2)


@pytest.mark.parametrize("change", [{"z": 1.0}, {"clip": 2.0}, {"m": 3}], ids=["z", "C", "m"])
def test_a_restart_at_another_noise_scale_is_refused(tmp_path, change):
    """Issue 39 item 1: release 1 at z = 100, then a restart at z = 1 booked rows 2-6 at z = 1 over a noise stream
    drawn at z = 100 (booked ε 5.055 where the release had 6.373). z, C and m are in the signed state now."""
    path = tmp_path / "l.json"
    first = make(z=100.0, rng=9, ledger_path=path, num_rounds=6)
    grid = LoopbackGrid.of(N)
    first.configure_train(1, model(8), ConfigRecord(), grid)
    first.aggregate_train(1, [])
    first.ledger_store.close()
    args = {"z": 100.0, **change}
    name = {"z": "noise_multiplier", "clip": "clipping_norm", "m": "num_sampled_clients"}[next(iter(change))]
    with pytest.raises(LedgerFileError, match=name):
        make(rng=9, ledger_path=path, resume=True, num_rounds=6, **args)
    resumed = make(z=100.0, rng=9, ledger_path=path, resume=True, num_rounds=6)  # the same scale continues
    assert resumed.releases == 1


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"num_bands": 0}, "num_bands"),
        ({"factorization": "toeplitz"}, "factorization"),
        ({"num_rounds": None}, "max_participations"),
        ({"max_participations": 0}, "max_participations"),
        ({"num_rounds": 0}, "num_rounds"),
    ],
)
def test_bad_arguments_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        make(**kwargs)


def test_the_optimised_factorisation_runs():
    strategy = make(rng=6, factorization="banded-optimal", num_rounds=6)
    assert mf.toeplitz_prefix_error(strategy.coefficients, 6) <= mf.toeplitz_prefix_error(
        mf.banded_sqrt_coefficients(BANDS), 6
    )
    _, arrays, _ = run_round(strategy, 1, LoopbackGrid.of(N))
    assert np.isfinite(arrays["w"].numpy()).all()


def test_cyclic_poisson_asks_each_group_member_with_rate_q_and_books_one_event_per_epoch():
    """Amplified BandMF: q = m·b/N within the round's group; ⌈T/b⌉ Poisson-sampled Gaussians booked."""
    from dp_accounting.dp_event import PoissonSampledDpEvent, SelfComposedDpEvent
    from scipy import stats

    n, m, rounds = 60, 5, 12  # groups of 20, q = 5·3/60 = 0.25
    strategy = make(m=m, rng=8, num_rounds=rounds, sampling="cyclic-poisson")
    grid = LoopbackGrid.of(n)
    asked = []
    for r in range(1, rounds + 1):
        msgs, _, _ = run_round(strategy, r, grid)
        group = strategy.participation.group_of_release(r)
        assert all(strategy.participation.groups[node] == group for node in nodes(msgs))
        asked.append(len(msgs))
    q = strategy.group_sampling_rate
    assert q == pytest.approx(0.25)
    assert stats.binomtest(sum(asked), rounds * n // BANDS, q).pvalue > 1e-3
    expected = SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(1.0)), rounds // BANDS)
    pld = PLDAccountant().compose(expected).get_epsilon(1e-5)
    assert strategy.ledger.report().epsilon_pld == pytest.approx(pld, rel=2e-2)


def test_cyclic_poisson_needs_q_at_most_one():
    with pytest.raises(ValueError, match="num_sampled_clients"):
        make(m=10, num_clients=12, sampling="cyclic-poisson")  # q = 10·3/12 > 1


def _poisson_run(path, rounds, resume=False, start=1):
    strategy = make(m=2, rng=5, ledger_path=path, resume=resume, num_rounds=6, sampling="cyclic-poisson")
    grid = LoopbackGrid.of(N)  # groups of 4, q = 2·3/12 = 0.5
    sampled = []
    for r in range(start, start + rounds):
        msgs, _, _ = run_round(strategy, r, grid)
        sampled.append(nodes(msgs))
    strategy.ledger_store.close()
    return strategy, sampled


def test_the_secret_sample_of_cyclic_poisson_is_not_in_the_ledger_file(tmp_path):
    """Issue 39 item 2. Before: the signed ledger state held one [node, group, count, last] row per node, so the
    ledger file (and ``flwr-dp ledger show``) said who was sampled in which release. Now the rows are in
    ``<ledger_path>.bandmf-participation.<t>`` (0600); the ledger names it by release and SHA-256."""
    import json
    import os
    import stat
    import subprocess
    import sys

    path = tmp_path / "l.json"
    strategy, sampled = _poisson_run(path, 3)
    ledger_text = path.read_text()
    state = json.loads(ledger_text)
    assert any(sampled) and strategy.participation.to_state()["nodes"]  # the positive control: there is a sample
    assert '"nodes"' not in ledger_text
    entry = json.dumps(state)
    assert "secret" in entry and "sha256" in entry
    secret = tmp_path / "l.json.bandmf-participation.3"
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    assert json.loads(secret.read_text()) == strategy.participation.to_state()
    shown = subprocess.run(
        [sys.executable, "-m", "flwr_dp_strategies.cli", "ledger", "show", str(path)], capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    last_sampled = sampled[-1][0]
    assert f"[{last_sampled}, " not in shown.stdout


def test_a_cyclic_poisson_restart_continues_the_secret_history_and_refuses_an_altered_one(tmp_path):
    whole, straight = _poisson_run(tmp_path / "a.json", 6)
    _, before = _poisson_run(tmp_path / "b.json", 3)
    resumed, after = _poisson_run(tmp_path / "b.json", 3, resume=True)
    assert before + after == straight  # the same samples: the history (and the seeded draws) continue
    assert resumed.participation.to_state() == whole.participation.to_state()
    secret = tmp_path / "b.json.bandmf-participation.6"
    secret.write_text(secret.read_text().replace("[", "[ ", 1))
    with pytest.raises(LedgerFileError, match="participation history"):
        make(m=2, rng=5, ledger_path=tmp_path / "b.json", resume=True, num_rounds=6, sampling="cyclic-poisson")


def test_a_run_saved_with_the_per_release_noise_file_is_refused(tmp_path):
    """The state of a run saved before the keyed stream names a .bandmf-noise.<t> file: it cannot continue."""
    path = tmp_path / "l.json"
    strategy, _ = _noise_run(path, 2)
    state = dict(strategy.ledger_store.get_state("banded-matrix-factorization"))
    state["noise"] = {"release": 2, "sha256": "0" * 64}
    again = make(rng=9, ledger_path=path, resume=True)
    again.ledger_store.set_state("banded-matrix-factorization", state)
    again.ledger_store.save()
    again.ledger_store.close()
    with pytest.raises(LedgerFileError, match="before the keyed noise stream"):
        make(rng=9, ledger_path=path, resume=True)


def _epsilon(*events) -> float:
    ledger = PrivacyLedger(1e-5)
    for event in events:
        ledger.record(event, server_round=1)
    return ledger.epsilon()


def test_cyclic_poisson_books_the_un_amplified_analysis_where_the_cap_makes_it_smaller(tmp_path):
    """Issue 39 item 4: the amplified analysis ignores k. k = 1, q = 2·3/12 = 0.5, z = 0.8, T = 9, b = 3: before,
    3 Poisson-sampled epochs were booked (ε 8.10); the un-amplified bound, valid under any sampling with k and
    b-min-separation enforced, is one Gaussian of z / sens_T = 0.8 (ε 5.68). The run books the smaller, chosen
    once, and a restart keeps it."""
    from dp_accounting.dp_event import PoissonSampledDpEvent, SelfComposedDpEvent

    amplified = _epsilon(SelfComposedDpEvent(PoissonSampledDpEvent(0.5, GaussianDpEvent(0.8)), 3))
    unamplified = _epsilon(GaussianDpEvent(0.8))
    assert unamplified < 0.75 * amplified  # 5.68 against 8.10
    path = tmp_path / "ledger.json"
    kw = dict(z=0.8, m=2, rng=3, num_rounds=9, max_participations=1, sampling="cyclic-poisson")
    strategy = make(ledger_path=path, **kw)
    grid = LoopbackGrid.of(N)
    for r in range(1, 5):
        run_round(strategy, r, grid)
    assert strategy.analysis() == "unamplified"
    strategy.ledger_store.close()
    resumed = make(ledger_path=path, resume=True, **kw)
    assert resumed.analysis() == "unamplified"
    for r in range(5, 10):
        run_round(resumed, r, grid)
    assert resumed.ledger.epsilon() == pytest.approx(unamplified, rel=1e-6)
    assert resumed.ledger.epsilon() < amplified


def test_cyclic_poisson_keeps_the_amplified_analysis_where_it_is_smaller():
    """The other way round (k = ⌈T/b⌉ = 4, q = 0.25, z = 1, T = 12): 4 amplified epochs beat G(z / 2)."""
    strategy = make(m=5, rng=8, num_rounds=12, sampling="cyclic-poisson")
    grid = LoopbackGrid.of(60)
    run_round(strategy, 1, grid)
    assert strategy.analysis() == "amplified"


def test_a_restart_keeps_the_analysis_of_its_first_release(tmp_path):
    """The two analyses each bound the whole prefix, so a run never switches: a restart with another T (whose
    planned totals would choose the other analysis) continues with the saved one."""
    path = tmp_path / "ledger.json"
    kw = dict(z=0.8, m=2, rng=3, max_participations=1, sampling="cyclic-poisson")
    strategy = make(ledger_path=path, num_rounds=9, **kw)
    grid = LoopbackGrid.of(N)
    run_round(strategy, 1, grid)
    assert strategy.analysis() == "unamplified"
    strategy.ledger_store.close()
    fresh_choice = make(num_rounds=3, **kw)  # one epoch: amplified 4.79 < 5.68
    fresh_choice.population = N
    assert fresh_choice.analysis() == "amplified"
    resumed = make(ledger_path=path, resume=True, num_rounds=3, **kw)
    assert resumed.analysis() == "unamplified"
