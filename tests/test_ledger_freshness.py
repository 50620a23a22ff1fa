"""Issue 25 D: a ledger file is authentic *and* fresh, and resuming is explicit.

Each attack is replayed by someone who can write the ledger's directory but does not hold
the HMAC key: copying back an authentic older snapshot, putting another run's authentic
file in place, deleting the file. Before the run/path/generation binding, the high-water
mark and ``resume=``, the restarted strategy reported the snapshot's (or the other run's,
or 0) epsilon; now each is refused. What stays undetectable is pinned down too: both files
rolled back in step when the high-water mark lies beside the ledger.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil

import pytest
from dp_accounting.dp_event import GaussianDpEvent

from flwr_dp_strategies import AccountedFedAvg
from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.privacy.accounting import ledger_file
from flwr_dp_strategies.privacy.accounting.ledger_file import (
    FILE_FORMAT,
    HIGH_WATER_SUFFIX,
    LedgerFileError,
    encode_file,
    read_envelope,
)
from test_restart import NODES, _train

pytestmark = pytest.mark.usefixtures("task_identity")
KEY = "a-secret-of-at-least-16-bytes"
ROUNDS = 4


@pytest.fixture(autouse=True)
def _keyed(monkeypatch):
    monkeypatch.setenv(ledger_file.KEY_ENV, KEY)


def strategy(path, **kwargs) -> AccountedFedAvg:
    return AccountedFedAvg(**NODES, ledger_path=str(path), **kwargs)


def run(
    path, rounds: int = ROUNDS, *, snapshot_after: int | None = None, sigma: float = 3.0, **kwargs
) -> tuple[float, bytes | None]:
    """ε after ``rounds`` rounds of a new run at ``path``, and the file's bytes after round ``snapshot_after``."""
    first = strategy(path, **kwargs)
    snapshot = None
    for rnd in range(1, rounds + 1):
        _train(first, rnd, [GaussianDpEvent(sigma)])
        if rnd == snapshot_after:
            snapshot = open(path, "rb").read()
    eps = first.ledger.epsilon()
    del first
    gc.collect()  # the lock goes with the strategy, as with a stopped ServerApp
    return eps, snapshot


def test_a_restart_resumes_explicitly_and_logs_it(tmp_path, caplog):
    path = tmp_path / "ledger.json"
    caplog.set_level(logging.INFO)
    eps, _ = run(path)
    assert "new run" in caplog.text and "resuming" not in caplog.text
    caplog.clear()
    restarted = strategy(path, resume=True)
    assert restarted.ledger.epsilon() == pytest.approx(eps)
    assert "resuming run" in caplog.text and "generation" in caplog.text
    envelope = read_envelope(path)
    assert envelope.format == FILE_FORMAT and envelope.path == str(path.resolve())
    assert envelope.generation == restarted.ledger_store.generation >= ROUNDS
    assert envelope.run == restarted.ledger_store.run_id


def test_rolling_back_to_an_authentic_snapshot_is_refused(tmp_path):
    """Measured on the old code: every round's snapshot reloaded, ε of round 1 reported as 'restored'."""
    path = tmp_path / "ledger.json"
    eps, snapshot = run(path, snapshot_after=1)
    with open(path, "wb") as handle:
        handle.write(snapshot)
    with pytest.raises(LedgerFileError, match="rollback") as info:
        strategy(path, resume=True)
    assert str(path.resolve()) in str(info.value)
    assert eps > 0


def test_another_runs_file_signed_with_the_same_key_is_refused(tmp_path):
    path, other = tmp_path / "ledger.json", tmp_path / "other.json"
    run(path)
    run(other, rounds=1, sigma=6.0)
    shutil.copyfile(other, path)  # copied from another path
    with pytest.raises(LedgerFileError, match="copied from elsewhere"):
        strategy(path, resume=True)

    # another run at the same path (an earlier experiment's file kept aside): its run id differs
    again = tmp_path / "again"
    again.mkdir()
    path2 = again / "ledger.json"
    run(path2, rounds=1, sigma=6.0)
    earlier = open(path2, "rb").read()
    os.remove(path2)
    os.remove(str(path2) + HIGH_WATER_SUFFIX)
    run(path2)
    with open(path2, "wb") as handle:
        handle.write(earlier)
    with pytest.raises(LedgerFileError, match="another run"):
        strategy(path2, resume=True)


def test_a_deleted_ledger_is_never_a_fresh_start(tmp_path):
    path = tmp_path / "ledger.json"
    run(path)
    os.remove(path)
    for resume in (True, False):  # a new run cannot hide the deletion either
        with pytest.raises(LedgerFileError, match="is missing, but its high-water mark .* records run"):
            strategy(path, resume=resume)
    os.remove(str(path) + HIGH_WATER_SUFFIX)  # both deleted: only resume=True can tell, and it does
    with pytest.raises(LedgerFileError, match="does not exist, but resume=True"):
        strategy(path, resume=True)


def test_a_new_run_refuses_an_existing_file_and_leaves_it_untouched(tmp_path):
    path = tmp_path / "ledger.json"
    run(path)
    before = open(path, "rb").read()
    with pytest.raises(LedgerFileError, match="pass resume=True to continue it"):
        strategy(path)
    assert open(path, "rb").read() == before


def test_resume_needs_a_path_and_a_bool():
    with pytest.raises(ValueError, match="resume=True needs a ledger_path"):
        AccountedFedAvg(**NODES, resume=True)
    with pytest.raises(ValueError, match="resume"):
        AccountedFedAvg(**NODES, resume="yes")


def test_both_files_rolled_back_together_go_unnoticed_beside_but_not_with_a_separate_mark(tmp_path):
    """The documented limit: a high-water mark beside the file is rolled back with it; one kept elsewhere is not."""
    path = tmp_path / "ledger.json"
    mark = str(path) + HIGH_WATER_SUFFIX
    first = strategy(path)
    _train(first, 1, [GaussianDpEvent(3.0)])
    old = open(path, "rb").read(), open(mark, "rb").read()
    _train(first, 2, [GaussianDpEvent(3.0)])
    eps = first.ledger.epsilon()
    del first
    gc.collect()
    for name, data in zip((path, mark), old):
        with open(name, "wb") as handle:
            handle.write(data)
    assert strategy(path, resume=True).ledger.epsilon() < eps  # not detected: documented
    gc.collect()

    protected = tmp_path / "protected"
    protected.mkdir()
    path = tmp_path / "guarded.json"
    hwm = protected / "guarded.hwm"
    first = strategy(path, high_water_path=str(hwm))
    _train(first, 1, [GaussianDpEvent(3.0)])
    old = open(path, "rb").read()
    _train(first, 2, [GaussianDpEvent(3.0)])
    del first
    gc.collect()
    assert not os.path.exists(str(path) + HIGH_WATER_SUFFIX) and hwm.exists()
    with open(path, "wb") as handle:
        handle.write(old)
    with pytest.raises(LedgerFileError, match="rollback"):
        strategy(path, resume=True, high_water_path=str(hwm))
    with pytest.raises(LedgerFileError, match="no high-water mark"):  # the mark must be found to resume
        strategy(path, resume=True)


def test_a_save_interrupted_before_the_mark_is_written_resumes_with_a_warning(tmp_path, monkeypatch, caplog):
    path = tmp_path / "ledger.json"
    first = strategy(path)
    _train(first, 1, [GaussianDpEvent(3.0)])
    real_write = ledger_file.write_atomic

    def crash_on_mark(target, data):
        if target.endswith(HIGH_WATER_SUFFIX):
            raise OSError(28, "No space left on device")
        real_write(target, data)

    monkeypatch.setattr(ledger_file, "write_atomic", crash_on_mark)
    with pytest.raises(LedgerFileError, match="high-water mark"):
        _train(first, 2, [GaussianDpEvent(3.0)])
    eps = first.ledger.epsilon()
    monkeypatch.setattr(ledger_file, "write_atomic", real_write)
    del first
    gc.collect()
    caplog.set_level(logging.WARNING)
    assert strategy(path, resume=True).ledger.epsilon() == pytest.approx(eps)
    assert "interrupted before the mark was written" in caplog.text


def test_a_forged_or_foreign_high_water_mark_is_refused(tmp_path):
    path = tmp_path / "ledger.json"
    run(path, rounds=1)
    mark = str(path) + HIGH_WATER_SUFFIX
    record = json.loads(open(mark).read())
    record["generation"] = 1_000
    with open(mark, "w") as handle:
        handle.write(json.dumps(record, separators=(",", ":")) + "\n")
    with pytest.raises(LedgerFileError, match="checksum mismatch"):
        strategy(path, resume=True)


def test_a_file_without_the_binding_is_readable_but_not_resumed(tmp_path):
    path = tmp_path / "ledger.json"
    ledger = PrivacyLedger(1e-5, neighboring_relation="replace_one")
    ledger.record(GaussianDpEvent(3.0), server_round=1, client=101)
    path.write_bytes(encode_file({"main": ledger.to_json()}, KEY.encode()))  # format 1: no run, path, generation
    assert PrivacyLedger.load(path).epsilon() == pytest.approx(ledger.epsilon())
    with pytest.raises(LedgerFileError, match="freshness cannot be checked"):
        strategy(path, resume=True)
