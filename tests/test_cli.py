"""``flwr-dp ledger show``: a ledger file verified and read without Python (issue 27 item 8)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from dp_accounting.dp_event import GaussianDpEvent, LaplaceDpEvent

from flwr_dp_strategies.cli import main
from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.privacy.accounting import ledger_file
from flwr_dp_strategies.privacy.accounting.ledger_file import LedgerStore

KEY = "a-secret-of-at-least-16-bytes"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _no_key_from_the_environment(monkeypatch):
    monkeypatch.delenv(ledger_file.KEY_ENV, raising=False)


def write_ledger(path, rounds=(1, 2), key: str | None = KEY) -> PrivacyLedger:
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one", max_epsilon=30.0)
    store = LedgerStore(path, key=key, resume=False)
    store.claim("main", ledger, lambda: ledger)
    for rnd in rounds:
        ledger.record(GaussianDpEvent(2.0), server_round=rnd, client=101, label="local-noise")
        ledger.record(GaussianDpEvent(4.0), server_round=rnd, client=102, label="local-noise")
        store.save()
    ledger.record(LaplaceDpEvent(1.0), server_round=rounds[-1], client=101, label="inference")
    store.set_state("adaptive-clipping", {"clipping_norm": 0.5})
    store.save()
    store.close()
    return ledger


def run_json(capsys, *argv: str) -> dict:
    assert main(["ledger", "show", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_show_prints_every_figure_of_a_verified_ledger(tmp_path, capsys, monkeypatch):
    path = str(tmp_path / "ledger.json")
    ledger = write_ledger(path)
    monkeypatch.setenv(ledger_file.KEY_ENV, KEY)
    report = run_json(capsys, path)
    (main_ledger,) = report["ledgers"]
    assert main_ledger["name"] == "main" and main_ledger["neighboring_relation"] == "replace_one"
    assert main_ledger["delta"] == 1e-5 and main_ledger["max_epsilon"] == 30.0 and main_ledger["rounds"] == [1, 2]
    assert main_ledger["clients"] == pytest.approx({"101": ledger.epsilon(101), "102": ledger.epsilon(102)})
    assert main_ledger["worst_case"] == {"epsilon": pytest.approx(ledger.epsilon()), "client": "101"}
    mechanisms = {
        (m["event"]["type"], m["event"]["noise_multiplier"], m["label"]): m["bookings"]
        for m in main_ledger["mechanisms"]
    }
    assert mechanisms == {
        ("GaussianDpEvent", 2.0, "local-noise"): 2,
        ("GaussianDpEvent", 4.0, "local-noise"): 2,
        ("LaplaceDpEvent", 1.0, "inference"): 1,
    }
    assert report["verified"].startswith("hmac-sha256") and report["generation"] == 3
    assert report["freshness"].startswith("latest save") and report["state"] == {
        "adaptive-clipping": {"clipping_norm": 0.5}
    }

    assert main(["ledger", "show", path]) == 0  # the table
    table = capsys.readouterr().out
    assert "relation replace_one" in table and "delta 1e-05" in table and "rounds       2 (1..2)" in table
    assert f"worst case   epsilon {ledger.epsilon():.4f} (client 101)" in table
    assert f"102     {ledger.epsilon(102):.4f}" in table


def test_the_key_comes_from_a_named_variable_or_a_file(tmp_path, capsys, monkeypatch):
    path = str(tmp_path / "ledger.json")
    ledger = write_ledger(path)
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    assert run_json(capsys, path, "--key-file", str(key_file))["ledgers"][0]["worst_case"]["epsilon"] == pytest.approx(
        ledger.epsilon()
    )
    monkeypatch.setenv("MY_LEDGER_KEY", KEY)
    assert run_json(capsys, path, "--key-env", "MY_LEDGER_KEY")["run"] is not None
    assert main(["ledger", "show", path, "--key-env", "UNSET_VARIABLE_X"]) == 1
    assert "UNSET_VARIABLE_X is not set" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:  # both at once: a usage error
        main(["ledger", "show", path, "--key-env", "X", "--key-file", str(key_file)])
    assert info.value.code == 2


@pytest.mark.parametrize(
    "fault, problem",
    [
        ("tampered", "checksum mismatch"),
        ("no key", "set the key"),
        ("wrong key", "not authenticated with the configured key|checksum mismatch"),
        ("rolled back", "rollback"),
        ("missing", "does not exist"),
        ("not a ledger", "not valid ledger JSON"),
    ],
)
def test_a_file_that_does_not_verify_exits_non_zero_with_the_reason(tmp_path, capsys, monkeypatch, fault, problem):
    path = str(tmp_path / "ledger.json")
    monkeypatch.setenv(ledger_file.KEY_ENV, KEY)
    if fault == "rolled back":
        write_ledger(path, rounds=(1,))
        older = open(path, "rb").read()
        store = LedgerStore(path, key=KEY, resume=True)
        store.claim("main", None, lambda: PrivacyLedger(1e-5)).record(GaussianDpEvent(1.0), server_round=2, client=7)
        store.save()
        store.close()
        open(path, "wb").write(older)
    elif fault != "missing":
        write_ledger(path)
    if fault == "tampered":
        data = bytearray(open(path, "rb").read())
        data[data.index(b'"noise_multiplier":4.0') + len('"noise_multiplier":')] = ord("9")
        open(path, "wb").write(bytes(data))
    elif fault == "no key":
        monkeypatch.delenv(ledger_file.KEY_ENV)
    elif fault == "wrong key":
        monkeypatch.setenv(ledger_file.KEY_ENV, "another-secret-of-16-bytes")
    elif fault == "not a ledger":
        open(path, "wb").write(b"\xff\xfe garbage")
    assert main(["ledger", "show", path]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("flwr-dp: error: ledger file")
    assert __import__("re").search(problem, captured.err), captured.err


def test_the_module_runs_as_a_command(tmp_path):
    path = str(tmp_path / "ledger.json")
    ledger = write_ledger(path, key=None)
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop(ledger_file.KEY_ENV, None)
    proc = subprocess.run(
        [sys.executable, "-m", "flwr_dp_strategies.cli", "ledger", "show", path, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["verified"].startswith("sha256 (integrity only")
    assert report["ledgers"][0]["worst_case"]["epsilon"] == pytest.approx(ledger.epsilon())


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(tmp_path):
    """Issue 38 item 5: ``flwr-dp ledger show FILE | head -1`` ended with a BrokenPipeError traceback."""
    path = str(tmp_path / "ledger.json")
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    store = LedgerStore(path, key=None, resume=False)
    store.claim("main", ledger, lambda: ledger)
    for client in range(5000):  # a report far larger than a pipe's buffer (64 KiB)
        ledger.record(GaussianDpEvent(2.0), server_round=1, client=client, label="local-noise")
    store.save()
    store.close()
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop(ledger_file.KEY_ENV, None)
    writer = subprocess.Popen(
        [sys.executable, "-m", "flwr_dp_strategies.cli", "ledger", "show", path, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    first = writer.stdout.readline()  # the reader takes one line, then closes its end (as head does)
    writer.stdout.close()
    _, stderr = writer.communicate(timeout=120)
    assert first.startswith(b"{")
    assert b"Traceback" not in stderr and b"BrokenPipe" not in stderr, stderr.decode()
    assert writer.returncode in (0, 141)  # 141 = 128 + SIGPIPE when the write met the closed pipe
