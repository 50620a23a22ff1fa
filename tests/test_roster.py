"""Node identities and the operator-signed roster (:mod:`flwr_dp_strategies.secure_aggregation.identity`) and the
``flwr-dp roster`` commands that write and check them."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flwr_dp_strategies.cli import main, write_demo_roster
from flwr_dp_strategies.secure_aggregation.identity import (
    NODE_CONFIG_KEY,
    NODE_CONFIG_ROSTER,
    NODE_CONFIG_SIGNER,
    NodeIdentity,
    Roster,
    advertisement,
    decode_public,
    encode_public,
    generate_signing_key,
    load_private_key,
    load_public,
    public_bytes,
    save_private_key,
    verify,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPERATOR = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
OPERATOR_PUB = public_bytes(OPERATOR)


def keys(count: int) -> list[Ed25519PrivateKey]:
    return [generate_signing_key() for _ in range(count)]


def members_of(private: list[Ed25519PrivateKey]) -> list[tuple[str, bytes]]:
    return [(f"node-{i}", public_bytes(k)) for i, k in enumerate(private)]


@pytest.fixture
def roster() -> Roster:
    return Roster.sign("fed", members_of(keys(3)), OPERATOR)


def signed_over(federation, members, signer_key) -> Roster:
    """A roster whose signature is the signer's over exactly these fields (no member checks at signing)."""
    unsigned = Roster(federation, tuple(members), public_bytes(signer_key), b"")
    return Roster(federation, tuple(members), unsigned.signer, signer_key.sign(unsigned.body()))


# ------------------------------------------------------------------------------------------ the roster
def test_sign_verify_round_trip(roster):
    assert roster.verify(OPERATOR_PUB) is roster
    again = Roster.from_json(roster.to_json())
    assert again == roster and again.verify(OPERATOR_PUB) == roster
    assert again.keys() == frozenset(k for _, k in roster.members) and again.federation == "fed"
    data = json.loads(roster.to_json())
    assert data["format"] == "flwr-dp-roster/1" and [m["name"] for m in data["members"]] == [
        "node-0",
        "node-1",
        "node-2",
    ]
    assert decode_public(data["signer"]) == OPERATOR_PUB


def _edit(roster: Roster, change) -> Roster:
    data = json.loads(roster.to_json())
    change(data)
    return Roster.from_json(json.dumps(data))


@pytest.mark.parametrize(
    "tamper",
    ["member key changed", "member added", "member removed", "member renamed", "federation renamed", "reordered"],
)
def test_a_tampered_roster_is_refused(roster, tamper):
    other = encode_public(public_bytes(generate_signing_key()))

    def change(data):
        members = data["members"]
        if tamper == "member key changed":
            members[1]["public_key"] = other
        elif tamper == "member added":
            members.append({"name": "node-9", "public_key": other})
        elif tamper == "member removed":
            members.pop()
        elif tamper == "member renamed":
            members[0]["name"] = "node-7"
        elif tamper == "federation renamed":
            data["federation"] = "fed2"
        else:
            members.reverse()

    edited = _edit(roster, change)
    with pytest.raises(ValueError, match="signature does not verify"):
        edited.verify(OPERATOR_PUB)


@pytest.mark.parametrize("cut", [1, 32, 63, 64])
def test_a_truncated_signature_is_refused(roster, cut):
    data = json.loads(roster.to_json())
    data["signature"] = base64.urlsafe_b64encode(roster.signature[:-cut]).decode()
    with pytest.raises(ValueError, match="signature does not verify"):
        Roster.from_json(json.dumps(data)).verify(OPERATOR_PUB)
    text = roster.to_json()
    with pytest.raises(ValueError):  # the file itself cut short
        Roster.from_json(text[: len(text) // 2]).verify(OPERATOR_PUB)


def test_a_roster_signed_by_another_key_is_refused(roster):
    intruder = generate_signing_key()
    theirs = Roster.sign("fed", roster.members, intruder)
    assert theirs.verify(public_bytes(intruder)) == theirs
    with pytest.raises(ValueError, match="signed by another key than the trusted roster signer"):
        theirs.verify(OPERATOR_PUB)
    # claiming the trusted signer while signing with another key
    forged = Roster(roster.federation, roster.members, OPERATOR_PUB, theirs.signature)
    with pytest.raises(ValueError, match="does not verify"):
        forged.verify(OPERATOR_PUB)
    with pytest.raises(ValueError, match="roster signer"):
        roster.verify(b"short")


def test_duplicate_names_or_keys_are_refused():
    a, b = keys(2)
    with pytest.raises(ValueError, match="names must be distinct"):
        Roster.sign("fed", [("x", public_bytes(a)), ("x", public_bytes(b))], OPERATOR)
    with pytest.raises(ValueError, match="keys must be distinct"):
        Roster.sign("fed", [("x", public_bytes(a)), ("y", public_bytes(a))], OPERATOR)
    with pytest.raises(ValueError, match="at least one member"):
        Roster.sign("fed", [], OPERATOR)
    with pytest.raises(ValueError, match="member 'x'"):
        Roster.sign("fed", [("x", b"\x00" * 31)], OPERATOR)
    # even a signature over repeats does not make them acceptable
    repeated = signed_over("fed", [("x", public_bytes(a)), ("y", public_bytes(a))], OPERATOR)
    with pytest.raises(ValueError, match="keys must be distinct"):
        Roster.from_json(repeated.to_json()).verify(OPERATOR_PUB)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[]",
        "3",
        "{}",
        '{"format": "flwr-dp-roster/2"}',
        '{"format": "flwr-dp-roster/1", "federation": "f", "members": 3, "signer": "", "signature": ""}',
        '{"format": "flwr-dp-roster/1", "federation": "f", "members": ["x"], "signer": "", "signature": ""}',
        '{"format": "flwr-dp-roster/1", "federation": "f", "members": [{"name": "x", "public_key": 5}], '
        '"signer": "", "signature": ""}',
    ],
)
def test_a_malformed_roster_file_is_a_value_error(text):
    with pytest.raises(ValueError):
        Roster.from_json(text).verify(OPERATOR_PUB)


def test_every_single_byte_change_of_a_roster_file_is_refused_or_harmless():
    roster = Roster.sign("f", members_of(keys(2)), OPERATOR)
    data = roster.to_json().encode()
    for index in range(len(data)):
        for mask in (0x01, 0x02, 0x20, 0x80):
            _assert_refused_or_same(data, index, mask, roster)


def _assert_refused_or_same(data: bytes, index: int, mask: int, roster: Roster) -> None:
    flipped = bytearray(data)
    flipped[index] ^= mask
    try:
        parsed = Roster.from_json(bytes(flipped).decode("utf-8"))
        parsed.verify(OPERATOR_PUB)
    except ValueError:  # UnicodeDecodeError and json's errors included; nothing else may escape
        return
    assert parsed == roster, (index, mask)


member_lists = st.lists(
    st.tuples(st.text(min_size=1, max_size=12), st.binary(min_size=32, max_size=32)),
    min_size=1,
    max_size=6,
    unique_by=(lambda m: m[0], lambda m: m[1]),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(federation=st.text(max_size=12), seeds=member_lists, data=st.data())
def test_property_round_trip_and_single_byte_flips(federation, seeds, data):
    members = [(name, public_bytes(Ed25519PrivateKey.from_private_bytes(seed))) for name, seed in seeds]
    roster = Roster.sign(federation, members, OPERATOR)
    again = Roster.from_json(roster.to_json()).verify(OPERATOR_PUB)
    assert again == roster and list(again.members) == members and again.federation == federation
    text = roster.to_json().encode()
    index = data.draw(st.integers(0, len(text) - 1), label="index")
    mask = data.draw(st.integers(1, 255), label="mask")
    _assert_refused_or_same(text, index, mask, roster)


# ------------------------------------------------------------------------------- signatures and keys
AD = dict(run_id=7, server_round=3, node_id=12, pk1=b"\x01" * 33, pk2=b"\x02" * 33)


@pytest.mark.parametrize(
    "field, value",
    [
        ("run_id", 8),
        ("server_round", 4),
        ("node_id", 13),
        ("pk1", b"\x03" * 33),
        ("pk2", b"\x03" * 33),
        ("pk1", b"\x01" * 32),  # a shorter key: the lengths are bound too
        ("pk2", b"\x02" * 34),
    ],
)
def test_an_advertisement_binds_run_round_node_and_both_keys(field, value):
    node = generate_signing_key()
    base = advertisement(**AD)
    changed = advertisement(**{**AD, field: value})
    assert changed != base
    signature = node.sign(base)
    assert verify(public_bytes(node), signature, base)
    assert not verify(public_bytes(node), signature, changed)


def test_the_two_keys_cannot_trade_bytes():
    assert advertisement(**{**AD, "pk1": b"ab", "pk2": b"c"}) != advertisement(**{**AD, "pk1": b"a", "pk2": b"bc"})
    assert advertisement(**{**AD, "pk1": b"x", "pk2": b"y"}) != advertisement(**{**AD, "pk1": b"y", "pk2": b"x"})


@pytest.mark.parametrize(
    "public, signature",
    [
        (None, None),
        ("a" * 32, "s" * 64),
        (b"\x00" * 31, b"\x00" * 64),
        (b"\x00" * 33, b"\x00" * 64),
        (b"\xff" * 32, b"\x00" * 64),  # 32 bytes that are no curve point
        ("good", b"\x00" * 64),
        ("good", b"\x00" * 63),
        ("good", b"\x00" * 65),
        ("good", b""),
        ("good", "a" * 64),
        ("good", 12345),
        ("good", "truncated"),
        ("good", "flipped"),
        ("other", "valid"),
    ],
)
def test_verify_is_false_and_never_raises_for_malformed_input(public, signature):
    key = generate_signing_key()
    message = b"message"
    good = key.sign(message)
    public = {"good": public_bytes(key), "other": public_bytes(generate_signing_key())}.get(public, public)
    signature = {
        "valid": good,
        "truncated": good[:-1],
        "flipped": good[:10] + bytes([good[10] ^ 1]) + good[11:],
    }.get(signature, signature)
    assert verify(public, signature, message) is False
    assert verify(public_bytes(key), bytearray(good), message) is True


def test_public_key_text_round_trip_and_refusals(tmp_path):
    raw = public_bytes(generate_signing_key())
    text = encode_public(raw)
    assert decode_public(text) == raw and decode_public(f"  {text}\n") == raw
    (tmp_path / "signer.pub").write_text(text + "\n")
    assert load_public(tmp_path / "signer.pub") == raw and load_public(text) == raw
    for bad in ["", "not base64!", encode_public(raw)[:-4], base64.urlsafe_b64encode(b"\x00" * 31).decode()]:
        with pytest.raises(ValueError):
            decode_public(bad)
    with pytest.raises(TypeError):
        decode_public(raw)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        encode_public(raw[:-1])


def test_private_key_files_are_0600_and_never_overwritten(tmp_path):
    path = tmp_path / "node.pem"
    key = generate_signing_key()
    save_private_key(key, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    before = path.read_bytes()
    with pytest.raises(FileExistsError):
        save_private_key(generate_signing_key(), path)
    assert path.read_bytes() == before
    assert public_bytes(load_private_key(path)) == public_bytes(key)
    (tmp_path / "junk.pem").write_text("junk")
    with pytest.raises(ValueError, match="junk.pem"):
        load_private_key(tmp_path / "junk.pem")
    with pytest.raises(ValueError, match="missing.pem"):
        load_private_key(tmp_path / "missing.pem")


# ----------------------------------------------------------------------------------- node identities
@pytest.fixture
def demo(tmp_path) -> Path:
    return write_demo_roster(tmp_path / "demo", 4, federation="test-fed").parent


def config(directory: Path, node: int = 0) -> dict[str, str]:
    return {
        NODE_CONFIG_KEY: str(directory / f"node-{node}.pem"),
        NODE_CONFIG_ROSTER: str(directory / "roster.json"),
        NODE_CONFIG_SIGNER: str(directory / "operator.pub"),
    }


def test_a_node_identity_refuses_a_key_outside_its_roster(roster):
    member = generate_signing_key()
    with_member = Roster.sign("fed", [*roster.members, ("me", public_bytes(member))], OPERATOR)
    identity = NodeIdentity(member, with_member)
    assert identity.public == public_bytes(member) and verify(identity.public, identity.sign(b"m"), b"m")
    with pytest.raises(ValueError, match="not a member of its roster"):
        NodeIdentity(generate_signing_key(), roster)
    with pytest.raises(TypeError):
        NodeIdentity(public_bytes(member), with_member)  # type: ignore[arg-type]
    assert NodeIdentity.ephemeral().roster is None


def test_from_node_config_with_all_keys(demo):
    identity = NodeIdentity.from_node_config(config(demo, 2))
    assert identity is not None and identity.roster is not None and identity.roster.federation == "test-fed"
    assert dict(identity.roster.members)["node-2"] == identity.public
    signer = (demo / "operator.pub").read_text().strip()  # the signer given inline as base64 too
    assert (
        NodeIdentity.from_node_config({**config(demo, 1), NODE_CONFIG_SIGNER: signer}).public
        == dict(identity.roster.members)["node-1"]
    )


def test_from_node_config_with_no_keys_is_none():
    assert NodeIdentity.from_node_config({}) is None
    assert NodeIdentity.from_node_config({NODE_CONFIG_KEY: "", "other": "x"}) is None


@pytest.mark.parametrize(
    "given",
    [
        (NODE_CONFIG_KEY,),
        (NODE_CONFIG_ROSTER,),
        (NODE_CONFIG_SIGNER,),
        (NODE_CONFIG_KEY, NODE_CONFIG_ROSTER),
        (NODE_CONFIG_KEY, NODE_CONFIG_SIGNER),
        (NODE_CONFIG_ROSTER, NODE_CONFIG_SIGNER),
    ],
)
def test_from_node_config_with_some_keys_names_the_missing_ones(demo, given):
    full = config(demo)
    with pytest.raises(ValueError) as info:
        NodeIdentity.from_node_config({k: full[k] for k in given})
    missing = [k for k in full if k not in given]
    assert "needs all three" in str(info.value)
    assert all(repr(k) in str(info.value).split("but not")[1] for k in missing), str(info.value)


def test_from_node_config_refuses_another_signer_or_a_foreign_key(demo, tmp_path):
    other = public_bytes(generate_signing_key())
    with pytest.raises(ValueError, match="signed by another key"):
        NodeIdentity.from_node_config({**config(demo), NODE_CONFIG_SIGNER: encode_public(other)})
    save_private_key(generate_signing_key(), tmp_path / "stranger.pem")
    with pytest.raises(ValueError, match="not a member"):
        NodeIdentity.from_node_config({**config(demo), NODE_CONFIG_KEY: str(tmp_path / "stranger.pem")})


# ------------------------------------------------------------------------------------------------ CLI
def test_cli_keygen_writes_a_0600_key_prints_its_public_key_and_never_overwrites(tmp_path, capsys):
    out, pub = tmp_path / "node.pem", tmp_path / "node.pub"
    assert main(["roster", "keygen", "--out", str(out), "--public-out", str(pub)]) == 0
    printed = capsys.readouterr().out.strip()
    assert decode_public(printed) == public_bytes(load_private_key(out))
    assert pub.read_text() == printed + "\n" and stat.S_IMODE(out.stat().st_mode) == 0o600
    before = out.read_bytes()
    assert main(["roster", "keygen", "--out", str(out)]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "exists: refusing to overwrite" in captured.err and out.read_bytes() == before
    assert main(["roster", "keygen", "--out", str(tmp_path / "new.pem"), "--public-out", str(pub)]) == 1
    assert "exists" in capsys.readouterr().err and not (tmp_path / "new.pem").exists()
    with pytest.raises(SystemExit) as info:
        main(["roster", "keygen"])
    assert info.value.code == 2


def _keygen(tmp_path: Path, name: str, capsys) -> str:
    assert main(["roster", "keygen", "--out", str(tmp_path / f"{name}.pem"), "--public-out", str(tmp_path / name)]) == 0
    return capsys.readouterr().out.strip()


def test_cli_sign_then_verify(tmp_path, capsys):
    operator = _keygen(tmp_path, "operator", capsys)
    alice, bob, carol = (_keygen(tmp_path, name, capsys) for name in ("alice", "bob", "carol"))
    (tmp_path / "members.txt").write_text(f"# admitted\n\ncarol = {carol}\n")
    out = tmp_path / "roster.json"
    argv = ["roster", "sign", "--signer", str(tmp_path / "operator.pem"), "--federation", "hospitals"]
    argv += ["--members-file", str(tmp_path / "members.txt"), "--member", f"alice={alice}"]
    assert main([*argv, "--member", f"bob={tmp_path / 'bob'}", "--out", str(out)]) == 0
    assert "3 member(s)" in capsys.readouterr().out

    # a URL-safe base64 key may start with "-": "--signer=KEY" always parses
    assert main(["roster", "verify", str(out), f"--signer={operator}", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["federation"] == "hospitals" and report["member_count"] == 3 and report["verified"] is True
    assert report["members"] == [
        {"name": "carol", "public_key": carol},
        {"name": "alice", "public_key": alice},
        {"name": "bob", "public_key": bob},
    ]
    assert report["signer"] == operator
    assert main(["roster", "verify", str(out), "--signer", str(tmp_path / "operator")]) == 0  # key in a file
    table = capsys.readouterr().out
    assert "federation  hospitals" in table and "members     3" in table and f"alice  {alice}" in table

    # the output file is not replaced without --force, and never by an input
    assert main([*argv, "--out", str(out)]) == 1
    assert "exists" in capsys.readouterr().err
    assert main([*argv, "--out", str(out), "--force"]) == 0
    assert main([*argv, "--out", str(tmp_path / "operator.pem"), "--force"]) == 1
    assert "input file" in capsys.readouterr().err and load_private_key(tmp_path / "operator.pem")


def test_cli_sign_refuses_repeats_and_bad_members(tmp_path, capsys):
    _keygen(tmp_path, "operator", capsys)
    alice, bob = (_keygen(tmp_path, name, capsys) for name in ("alice", "bob"))
    base = ["roster", "sign", "--signer", str(tmp_path / "operator.pem"), "--federation", "f"]
    out = ["--out", str(tmp_path / "roster.json")]
    cases = {
        "given twice": ["--member", f"alice={alice}", "--member", f"alice={bob}"],
        "same public key": ["--member", f"alice={alice}", "--member", f"bob={tmp_path / 'alice'}"],
        "is a PEM file": ["--member", f"alice={tmp_path / 'alice.pem'}"],
        "neither a readable file nor a base64": ["--member", "alice=missing.pub"],
    }
    for message, members in cases.items():
        assert main([*base, *members, *out]) == 1, message
        captured = capsys.readouterr()
        assert message in captured.err and captured.out == ""
        assert not (tmp_path / "roster.json").exists()
    (tmp_path / "members.txt").write_text(f"alice={alice}\nbob {bob}\n")
    assert main([*base, "--members-file", str(tmp_path / "members.txt"), *out]) == 1
    assert "members.txt:2: expected NAME=PUBKEY" in capsys.readouterr().err
    for usage in ([*base, *out], [*base, "--member", "alice", *out], [*base, "--member", f"={alice}", *out]):
        with pytest.raises(SystemExit) as info:
            main(usage)
        assert info.value.code == 2
    capsys.readouterr()


def test_cli_verify_refuses_a_tampered_roster_another_signer_or_a_bad_file(tmp_path, capsys):
    directory = write_demo_roster(tmp_path / "demo", 3).parent
    path, signer = directory / "roster.json", str(directory / "operator.pub")
    assert main(["roster", "verify", str(path), "--signer", signer]) == 0
    capsys.readouterr()
    original = path.read_text()
    data = json.loads(original)
    data["members"][0]["public_key"] = encode_public(public_bytes(generate_signing_key()))
    path.write_text(json.dumps(data))
    assert main(["roster", "verify", str(path), "--signer", signer]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "refused: the roster's signature does not verify" in captured.err
    path.write_text(original)
    other = encode_public(public_bytes(generate_signing_key()))
    assert main(["roster", "verify", str(path), f"--signer={other}", "--json"]) == 1
    assert "signed by another key" in capsys.readouterr().err
    for content in (b"\xff\xfe", b"{}", b"not json"):
        path.write_bytes(content)
        assert main(["roster", "verify", str(path), "--signer", signer]) == 1
        assert "refused" in capsys.readouterr().err
    assert main(["roster", "verify", str(tmp_path / "missing.json"), "--signer", signer]) == 1
    assert main(["roster", "verify", str(path), "--signer", "garbage"]) == 1
    with pytest.raises(SystemExit) as info:
        main(["roster", "verify", str(path)])
    assert info.value.code == 2


def test_cli_demo_writes_a_roster_that_verifies_with_every_node_key_a_member(tmp_path, capsys):
    directory = tmp_path / "demo"
    assert main(["roster", "demo", "--nodes", "5", "--out", str(directory), "--federation", "sim"]) == 0
    assert "node-4.pem" in capsys.readouterr().out
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        ["operator.pem", "operator.pub", "roster.json", *(f"node-{i}.pem" for i in range(5))]
    )
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in directory.glob("*.pem"))
    assert main(["roster", "verify", str(directory / "roster.json"), "--signer", str(directory / "operator.pub")]) == 0
    capsys.readouterr()
    roster = Roster.load(directory / "roster.json", load_public(directory / "operator.pub"))
    assert roster.federation == "sim" and roster.signer == public_bytes(load_private_key(directory / "operator.pem"))
    assert dict(roster.members) == {
        f"node-{i}": public_bytes(load_private_key(directory / f"node-{i}.pem")) for i in range(5)
    }
    assert main(["roster", "demo", "--nodes", "2", "--out", str(directory)]) == 1  # not empty
    assert "not empty" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["roster", "demo", "--nodes", "0", "--out", str(tmp_path / "none")])
    assert info.value.code == 2 and not (tmp_path / "none").exists()
    (tmp_path / "empty").mkdir()
    assert write_demo_roster(tmp_path / "empty", 1) == tmp_path / "empty" / "roster.json"


def test_write_demo_roster_for_a_thousand_nodes(tmp_path):
    path = write_demo_roster(tmp_path / "big", 1000)
    roster = Roster.load(path, load_public(path.parent / "operator.pub"))
    assert len(roster.members) == 1000 and len(roster.keys()) == 1000
    for node in (0, 499, 999):
        identity = NodeIdentity.from_node_config(config(path.parent, node))
        assert identity is not None and dict(roster.members)[f"node-{node}"] == identity.public


def test_the_module_runs_roster_verify_as_a_command(demo):
    env = {**os.environ, "PYTHONPATH": ROOT}
    argv = ["roster", "verify", str(demo / "roster.json"), "--signer", str(demo / "operator.pub"), "--json"]
    proc = subprocess.run(
        [sys.executable, "-m", "flwr_dp_strategies.cli", *argv], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["federation"] == "test-fed" and report["member_count"] == 4
    assert [m["name"] for m in report["members"]] == [f"node-{i}" for i in range(4)]


def test_simulation_nodes_find_their_identity_in_the_directory_their_environment_names(tmp_path, monkeypatch):
    """``identity_from_environment``: member ``node-<partition-id>`` of the roster directory named by
    ``FLWR_DP_ROSTER_DIR``; None when the variable is unset (the client then has no roster)."""
    from flwr.app import Context, RecordDict

    from flwr_dp_strategies.cli import write_demo_roster
    from flwr_dp_strategies.secure_aggregation.identity import (
        ROSTER_DIR_ENV,
        identity_from_environment,
        load_private_key,
    )

    write_demo_roster(tmp_path / "roster", 3)
    ctxt = Context(run_id=1, node_id=77, node_config={"partition-id": 2}, state=RecordDict(), run_config={})
    monkeypatch.delenv(ROSTER_DIR_ENV, raising=False)
    assert identity_from_environment(ctxt) is None
    monkeypatch.setenv(ROSTER_DIR_ENV, str(tmp_path / "roster"))
    identity = identity_from_environment(ctxt)
    assert identity.public == public_bytes(load_private_key(tmp_path / "roster" / "node-2.pem"))
    assert identity.roster is not None and len(identity.roster.members) == 3
