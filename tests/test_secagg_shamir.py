"""The prime-field Shamir sharing of SecAgg+ (``secure_aggregation.shamir``), the streamed masks, the
one-node ring lookup and the logarithmic neighbourhood size (Bell et al. 2020)."""

from __future__ import annotations

import logging
import os
import random
import warnings

import numpy as np
import pytest
from flwr.app import ConfigRecord
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_dp_strategies.secure_aggregation import shamir
from flwr_dp_strategies.secure_aggregation.client_protocol import ClientRound
from flwr_dp_strategies.secure_aggregation.masks import add_prg_mask, apply_mask, prg_mask, reduce_mod
from flwr_dp_strategies.secure_aggregation.protocol import (
    ProtocolError,
    choose_num_shares,
    neighbourhood_size,
    ring_neighbours,
    ring_neighbours_of,
)

P = shamir.PRIME


def interpolate_at(points: list[tuple[int, int]], x: int) -> int:
    """The polynomial of degree < len(points) through ``points``, evaluated at ``x`` (independent of the module)."""
    total = 0
    for i, (x_i, y_i) in enumerate(points):
        num, den = 1, 1
        for j, (x_j, _) in enumerate(points):
            if j != i:
                num = num * (x - x_j) % P
                den = den * (x_i - x_j) % P
        total = (total + y_i * num * pow(den, -1, P)) % P
    return total


@settings(max_examples=40, deadline=None)
@given(
    holders=st.integers(1, 30),
    data=st.data(),
    secrets_=st.lists(st.binary(min_size=1, max_size=48), min_size=1, max_size=3),
)
def test_any_t_of_n_shares_rebuild_every_secret(holders, data, secrets_):
    t = data.draw(st.integers(1, holders), label="threshold")
    subset = sorted(data.draw(st.permutations(range(holders)), label="order")[:t])
    shares = shamir.split(secrets_, t, holders)
    assert len(shares) == holders and all(len(row) == len(secrets_) for row in shares)
    assert all(shamir.share_x(row[0]) == i + 1 for i, row in enumerate(shares))
    for j, secret in enumerate(secrets_):
        assert shamir.reconstruct([shares[i][j] for i in subset], len(secret)) == secret
    # all secrets at once, one set of Lagrange coefficients (the server's path)
    rebuilt = shamir.SCHEME.reconstruct(
        [i + 1 for i in subset], [[shares[i][j] for i in subset] for j in range(len(secrets_))], 48
    )
    assert [r.lstrip(b"\0") for r in rebuilt] == [s.lstrip(b"\0") for s in secrets_]


def test_t_minus_1_shares_are_consistent_with_every_secret():
    """Perfect secrecy, constructively: for any t − 1 shares and ANY candidate secret s' there is exactly one
    polynomial of degree < t through (0, s') and those shares, i.e. one coefficient vector, so with uniform
    coefficients the t − 1 shares are equally likely whatever the secret. Here: complete the shares with
    the t-th point that polynomial gives, and the sharing's own reconstruction returns s'."""
    rng = random.Random(0)
    for t in (2, 5, 13):
        secret = os.urandom(32)
        shares = shamir.split([secret], t, t + 3)
        seen = [shamir.parse_share(row[0]) for row in shares[: t - 1]]
        for candidate in (bytes(32), os.urandom(32), secret, b"\xff" * 48):
            x_t = t + rng.randrange(1, 4)
            y_t = interpolate_at([(0, int.from_bytes(candidate, "big")), *seen], x_t)
            forged = x_t.to_bytes(2, "big") + y_t.to_bytes(shamir.SHARE_BYTES - 2, "big")
            given = [row[0] for row in shares[: t - 1]]
            assert shamir.reconstruct([*given, forged], len(candidate)) == candidate


def test_fewer_than_t_shares_look_uniform_for_two_different_secrets():
    """Statistically: the first t − 1 shares of secret 0 and of secret 2^256 − 1 fall into 8 equal bins of
    GF(p) with the same (uniform) frequencies (chi-square, 8 bins, 2 000 splits each; 45.7 is the 1e-7
    critical value at 7 degrees of freedom: the shares come from OS entropy, which no test may seed, so the
    false-alarm rate is set by the threshold; a share that leaked the secret, all 4 000 in one bin, gives 28 000)."""
    t, draws, bins = 3, 2000, 8
    for secret in (b"\x00", b"\xff" * 32):
        counts = np.zeros(bins)
        for _ in range(draws):
            for row in shamir.split([secret], t, t)[: t - 1]:
                counts[shamir.parse_share(row[0])[1] * bins // P] += 1
        expected = draws * (t - 1) / bins
        assert ((counts - expected) ** 2 / expected).sum() < 45.7


def test_the_lagrange_coefficients_are_computed_once_per_holder_set():
    shamir.lagrange_at_zero.cache_clear()
    t, holders = 7, 12
    rows = [shamir.split([os.urandom(32)], t, holders) for _ in range(20)]
    xs = [2, 3, 5, 7, 8, 11, 12]
    rebuilt = shamir.SCHEME.reconstruct(xs, [[r[x - 1][0] for x in xs] for r in rows], 32)
    assert len(rebuilt) == 20
    shamir.SCHEME.reconstruct(xs, [[rows[0][x - 1][0] for x in xs]], 32)
    info = shamir.lagrange_at_zero.cache_info()
    assert info.misses == 1 and info.hits == 1
    lam = shamir.lagrange_at_zero(tuple(xs))
    assert sum(lam) % P == 1  # interpolating the constant 1


def test_malformed_shares_and_secrets_are_refused():
    row = shamir.split([b"secret"], 2, 3)
    good = row[0][0]
    with pytest.raises(ValueError):
        shamir.parse_share(good[:-1])
    with pytest.raises(ValueError):
        shamir.parse_share(b"\0\0" + good[2:])  # x = 0 would hand out the secret
    with pytest.raises(ValueError):
        shamir.parse_share(good[:2] + P.to_bytes(shamir.SHARE_BYTES - 2, "big"))
    with pytest.raises(ValueError):
        shamir.reconstruct([good, good], 6)  # repeated x
    with pytest.raises(ValueError):
        shamir.SCHEME.reconstruct([1, 3], [[row[0][0], row[1][0]]], 6)  # x not the holder's
    with pytest.raises(ValueError):
        shamir.split([b""], 2, 3)
    with pytest.raises(ValueError):
        shamir.split([b"x" * (shamir.MAX_SECRET_BYTES + 1)], 2, 3)
    with pytest.raises(ValueError):
        shamir.split([b"x"], 4, 3)
    # a corrupt y rebuilds garbage, which does not fit the secret's length (or fails its commitment later)
    bad = good[:2] + bytes(shamir.SHARE_BYTES - 3) + b"\x01"
    with pytest.raises(ValueError):
        shamir.reconstruct([bad, row[1][0]], 6)


@pytest.mark.parametrize("length", [1, 8191, 8192, 8193, 20000])
def test_streamed_masks_equal_the_allocated_masks_mod_2_to_the_b(length):
    rng = np.random.default_rng(length)
    base = rng.integers(0, 1 << 20, size=length, dtype=np.uint64)
    keys = [os.urandom(32) for _ in range(3)]
    expected = base.copy()
    for key, sign in zip(keys, (1, -1, 1)):
        apply_mask(expected, prg_mask(key, length, 20), sign)
    got = base.copy()
    for key, sign in zip(keys, (1, -1, 1)):
        add_prg_mask(got, key, sign)
    np.testing.assert_array_equal(reduce_mod(got, 20), reduce_mod(expected, 20))
    with pytest.raises(ValueError):
        add_prg_mask(got, keys[0], 0)
    with pytest.raises(ValueError):
        add_prg_mask(got.astype(np.int64), keys[0], 1)


def test_one_nodes_ring_lookup_equals_the_whole_graph():
    nodes = random.Random(1).sample(range(1, 10**6), 200)
    for k in (4, 21, 400):
        graph = ring_neighbours(nodes, k, 7)
        assert ring_neighbours_of(nodes, k, 7, nodes[:5]) == {u: graph[u] for u in nodes[:5]}


def test_the_neighbourhood_grows_logarithmically_with_the_cohort():
    """Bell et al. 2020: for a fixed dropout rate and failure probability the degree is O(log n)."""
    ks = {n: choose_num_shares(n, colluders=0, dropout_rate=0.05, failure_probability=1e-6) for n in (10**3, 10**5)}
    assert neighbourhood_size(1000, ks[1000]) <= 30
    assert ks[10**5] - ks[10**3] <= 8  # 100x the clients, a few more neighbours


def test_a_share_at_another_holders_point_is_refused_at_collect():
    """A client checks that each share it receives sits at its own point of the sender's polynomial
    (else the server, seeing a share at the wrong x, would drop the honest holder at unmask)."""
    from test_secure_aggregation import shared_keys  # noqa: PLC0415 - the same 5-node fixture

    nodes, t = [1, 2, 3, 4, 5], 3
    original = shamir.SCHEME

    class Shifted(type(original)):
        @staticmethod
        def split(secrets_, threshold, holders):
            rows = original.split(secrets_, threshold, holders + 1)
            return rows[1:]  # every holder gets the next holder's point

    shamir.SCHEME = Shifted()
    try:
        states, outgoing = shared_keys(nodes, t)
    finally:
        shamir.SCHEME = original
    srcs = [s for s in nodes if s != 1]
    ctxts = [outgoing[s]["ctxts"][outgoing[s]["dsts"].index(1)] for s in srcs]
    with pytest.raises(ProtocolError, match="not this node's point"):
        ClientRound(states[1], 1).collect(
            ConfigRecord({"round": 1, "srcs": srcs, "ctxts": ctxts}), lambda: np.zeros(8, dtype=np.uint64)
        )


@pytest.mark.usefixtures("task_identity")
def test_an_unmask_reply_with_a_share_at_another_point_is_rejected_and_the_round_still_unmasks():
    from test_secure_aggregation import integer_app, modular, run_round, vectors_for  # noqa: PLC0415

    from flwr_dp_strategies.secure_aggregation.protocol import RECORD, STAGE_KEY  # noqa: PLC0415
    from secagg_harness import LoopbackGrid  # noqa: PLC0415

    nodes, bits, length = list(range(101, 109)), 16, 50
    vectors = vectors_for(nodes, bits, length, seed=5)

    def tamper(msg, reply):
        if reply.has_error() or reply.content[RECORD].get(STAGE_KEY) != "unmask":
            return reply
        if int(msg.metadata.dst_node_id) == 103:  # claims other points: a share must sit at its holder's x
            record = reply.content[RECORD]
            record["shares"] = [(shamir.share_x(s) % 8 + 1).to_bytes(2, "big") + s[2:] for s in record["shares"]]
        return reply

    grid = LoopbackGrid(integer_app(vectors, bits), nodes, die={101: "collect"}, tamper=tamper)
    secure, total = run_round(grid, nodes, bits=bits, length=length, num_shares=8, threshold=5)
    assert secure.rejected["secure-aggregation"] == 1
    survivors = sorted(secure.survivors)
    assert 101 not in survivors
    np.testing.assert_array_equal(total, modular([vectors[n] for n in survivors], bits))


@pytest.mark.parametrize("bits", [2, 7, 20, 57, 58, 62])
def test_packing_round_trips_on_both_unpack_paths(bits):
    from flwr_dp_strategies.secure_aggregation.masks import pack_bits, unpack_bits  # noqa: PLC0415

    rng = np.random.default_rng(bits)
    for length in (0, 1, 9, 4097):
        v = rng.integers(0, 1 << bits, size=length, dtype=np.uint64)
        np.testing.assert_array_equal(unpack_bits(pack_bits(v, bits), bits, length), v)


@pytest.mark.slow
def test_the_scale_benchmark_runs_both_primitives_and_writes_its_table(tmp_path):
    """``bench_distributed_dp --secagg-scale`` at toy sizes: both primitives reveal a round with dropouts,
    ours unmask faster, and the table and json are written (the 1 000-client run is a benchmark)."""
    import json  # noqa: PLC0415

    from flwr_dp_benchmarks import bench_distributed_dp as bench  # noqa: PLC0415

    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    try:
        with warnings.catch_warnings():  # the benchmark quiets flwr's logger and warnings: not for later tests
            assert bench.main(["--tiny", "--secagg-scale", "--secagg-clients", "20", "--out", str(tmp_path)]) == 0
    finally:
        flwr_logger.setLevel(level)
    result = json.loads((tmp_path / "secagg_scale.json").read_text())
    rows = {r["primitives"]: r for r in result["scale"]["rows"]}
    assert set(rows) == {"ours", "Flower"} and all(r["dropped"] == 1 for r in rows.values())
    assert rows["ours"]["server_unmask_s"] < rows["Flower"]["server_unmask_s"]
    assert rows["ours"]["upload_ratio"] < 1.0
    assert "| 20 | ours |" in (tmp_path / "secagg_scale.md").read_text()
