"""The ledger file: every fault of issue 17 is refused with one error type naming the file."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap

import pytest
from dp_accounting.dp_event import GaussianDpEvent, LaplaceDpEvent, NoOpDpEvent

from flwr_dp_strategies import AccountedFedAvg
from flwr_dp_strategies.privacy import PrivacyLedger
from flwr_dp_strategies.privacy.accounting import ledger_file
from flwr_dp_strategies.privacy.accounting.ledger_file import (
    FILE_FORMAT,
    LedgerFileError,
    LedgerStore,
    encode_file,
    read_envelope,
    read_file,
)

KEY = "a-secret-of-at-least-16-bytes"


@pytest.fixture(autouse=True)
def _no_key_from_the_environment(monkeypatch):
    monkeypatch.delenv(ledger_file.KEY_ENV, raising=False)


def small_ledger() -> PrivacyLedger:
    ledger = PrivacyLedger(1e-5, max_epsilon=20.0)
    ledger.record(GaussianDpEvent(3.0), server_round=1, label="noise")
    ledger.record(LaplaceDpEvent(2.0), server_round=1, client=7)
    ledger.record(LaplaceDpEvent(2.0), server_round=2, client=8)
    return ledger


def saved(tmp_path, ledger: PrivacyLedger | None = None, name: str = "ledger.json") -> str:
    path = str(tmp_path / name)
    (ledger or small_ledger()).save(path)
    return path


def forge(path: str, edit, key: str | None = None) -> None:
    """Rewrite the file with ``edit`` applied to its main ledger body and a freshly computed SHA-256."""
    envelope = read_envelope(path, key=key)
    body = json.loads(envelope.bodies["main"])
    edit(body)
    with open(path, "wb") as handle:
        handle.write(
            encode_file(
                {"main": json.dumps(body, separators=(",", ":"))},
                None,
                run=envelope.run,
                path=envelope.path,
                generation=envelope.generation,
                state=envelope.state,
            )
        )


def test_save_load_round_trip_keeps_everything(tmp_path):
    ledger = small_ledger()
    path = saved(tmp_path, ledger)
    restored = PrivacyLedger.load(path)
    assert restored.to_json() == ledger.to_json()
    assert restored.epsilon() == ledger.epsilon() and restored.epsilon(7) == ledger.epsilon(7)
    raw = open(path, "rb").read()
    assert raw.startswith(b'{"checksum":"sha256:') and raw.count(b"\n") == 1
    assert json.loads(raw)["format"] == FILE_FORMAT


def test_every_single_byte_change_of_a_saved_ledger_is_refused(tmp_path):
    path = saved(tmp_path)
    good = open(path, "rb").read()
    assert 300 < len(good) < 2000
    flipped = str(tmp_path / "flipped.json")
    changes = 0
    for i in range(len(good)):
        for mask in (0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80):
            data = bytearray(good)
            data[i] ^= mask
            with open(flipped, "wb") as handle:
                handle.write(bytes(data))
            with pytest.raises(LedgerFileError) as info:  # never another exception type, never a load
                PrivacyLedger.load(flipped)
            assert flipped in str(info.value)
            changes += 1
    assert changes == 8 * len(good)
    for cut in range(0, len(good), 7):  # truncated writes too
        with open(flipped, "wb") as handle:
            handle.write(good[:cut])
        with pytest.raises(LedgerFileError):
            PrivacyLedger.load(flipped)


@pytest.mark.parametrize(
    "edit, problem",
    [
        (lambda b: b["events"][next(iter(b["events"]))].update(noise_multiplier=6.0), "checksum"),
        (lambda b: b.update(clients={}), "checksum"),
        (lambda b: b.update(max_epsilon=1e9), "checksum"),
        (lambda b: b.update(target_delta=1e-3), "checksum"),
    ],
)
def test_an_edit_without_the_checksum_is_refused(tmp_path, edit, problem):
    path = saved(tmp_path)
    body = json.loads(read_file(path)[0]["main"])
    edit(body)
    raw = open(path, "rb").read().decode()
    old = read_file(path)[0]["main"]
    with open(path, "w") as handle:
        handle.write(raw.replace(old, json.dumps(body, separators=(",", ":"))))
    with pytest.raises(LedgerFileError, match=problem):
        PrivacyLedger.load(path)


@pytest.mark.parametrize(
    "text, problem",
    [
        ('{"checksum":"x","checksum":"y","format":"f","ledgers":{}}\n', "duplicate JSON key"),
        (
            '{"checksum":"sha256:' + "0" * 64 + '","format":"' + FILE_FORMAT + '","ledgers":{"main":{"a":NaN}}}\n',
            "non-finite",
        ),
        ("[" * 100_000 + "]" * 100_000 + "\n", "nested too deeply"),
        ("\xff\n", "not valid ledger JSON"),
    ],
)
def test_malformed_json_is_refused(tmp_path, text, problem):
    path = tmp_path / "ledger.json"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(LedgerFileError, match=problem):
        PrivacyLedger.load(path)


@pytest.mark.parametrize(
    "edit, problem",
    [
        (lambda b: b["events"][next(iter(b["events"]))].update(noise_multiplier=float("nan")), "non-finite|NaN"),
        (lambda b: b["events"][next(iter(b["events"]))].update(noise_multiplier=-1.0), "noise_multiplier"),
        (lambda b: b["events"].update(x={"type": "os.system"}), "not a known DpEvent"),
        (lambda b: b["central"].update(missing=[1]), "not in 'events'"),
        (lambda b: b["clients"].update({"9": {next(iter(b["events"])): [1.5]}}), "round"),
        (lambda b: b.update(extra=1), "exactly the fields"),
    ],
)
def test_a_forger_recomputing_the_checksum_is_still_refused_for_invalid_content(tmp_path, edit, problem):
    path = saved(tmp_path)
    if "nan" in problem.lower():  # json.dumps writes NaN: the strict parser refuses it before any checksum
        bodies, _ = read_file(path)
        body = json.loads(bodies["main"])
        edit(body)
        raw = open(path).read().replace(bodies["main"], json.dumps(body, separators=(",", ":")))
        open(path, "w").write(raw)
    else:
        forge(path, edit)
    with pytest.raises(LedgerFileError, match=problem):
        PrivacyLedger.load(path)


def test_duplicate_keys_in_a_ledger_body_are_refused():
    text = small_ledger().to_json()
    doubled = text[:-1] + ',"clients":{}}'
    with pytest.raises(ValueError, match="duplicate JSON key 'clients'"):
        PrivacyLedger.from_json(doubled)


def test_a_well_formed_forgery_needs_the_key_when_one_is_configured(tmp_path, monkeypatch):
    """Plain SHA-256 detects accidents, not a forger (documented); an HMAC key detects the forger too."""
    path = saved(tmp_path)
    forge(path, lambda b: b.update(clients={}))
    assert PrivacyLedger.load(path).clients == []  # the documented limit of an unkeyed checksum

    signed = str(tmp_path / "signed.json")
    small_ledger().save(signed, key=KEY)
    assert PrivacyLedger.load(signed, key=KEY).epsilon() == pytest.approx(small_ledger().epsilon())
    with pytest.raises(LedgerFileError, match="authenticated with a key"):
        PrivacyLedger.load(signed)
    with pytest.raises(LedgerFileError, match="checksum mismatch"):
        PrivacyLedger.load(signed, key=KEY + "x")
    forge(signed, lambda b: b.update(clients={}), key=KEY)  # a forger without the key can only write SHA-256
    with pytest.raises(LedgerFileError, match="not authenticated"):
        PrivacyLedger.load(signed, key=KEY)
    monkeypatch.setenv(ledger_file.KEY_ENV, KEY)  # the environment variable configures the strategies
    with pytest.raises(LedgerFileError, match="not authenticated"):
        AccountedFedAvg(ledger_path=signed)
    with pytest.raises(ValueError, match="16 bytes"):
        PrivacyLedger.load(signed, key="short")


def test_noop_replacing_an_event_is_caught_by_the_checksum(tmp_path):
    path = saved(tmp_path)
    raw = open(path).read()
    gaussian = json.dumps({"type": "GaussianDpEvent", "noise_multiplier": 3.0}, separators=(",", ":"))
    noop = json.dumps({"type": "NoOpDpEvent"}, separators=(",", ":"))
    assert gaussian in raw
    open(path, "w").write(raw.replace(gaussian, noop))
    with pytest.raises(LedgerFileError, match="checksum"):
        PrivacyLedger.load(path)
    assert NoOpDpEvent  # the forged event type exists and would validate: only the checksum catches it


def test_a_file_of_an_older_version_is_refused_clearly(tmp_path):
    path = tmp_path / "ledger.json"
    path.write_text(small_ledger().to_json())
    with pytest.raises(LedgerFileError, match="without a checksum"):
        PrivacyLedger.load(path)


def _unreadable(tmp_path, monkeypatch):
    path = saved(tmp_path)
    real_open = os.open

    def refusing(p, *args, **kwargs):
        if os.fspath(p) == path:
            raise PermissionError(13, "Permission denied")
        return real_open(p, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)
    return path


@pytest.mark.parametrize(
    "fault, problem",
    [
        ("dangling symlink", "dangling symbolic link"),
        ("empty", "is empty"),
        ("directory", "directory"),
        ("unreadable", "cannot be read"),
        ("oversized", "size cap"),
    ],
)
def test_something_at_the_path_is_never_a_silent_fresh_start(tmp_path, monkeypatch, fault, problem):
    path = str(tmp_path / "ledger.json")
    if fault == "dangling symlink":
        os.symlink(str(tmp_path / "gone.json"), path)
    elif fault == "empty":
        open(path, "w").close()
    elif fault == "directory":
        os.mkdir(path)
    elif fault == "unreadable":
        path = _unreadable(tmp_path, monkeypatch)
    else:
        saved(tmp_path)
        monkeypatch.setattr(ledger_file, "DEFAULT_MAX_BYTES", 100)
    with pytest.raises(LedgerFileError, match=problem) as info:
        AccountedFedAvg(ledger_path=path)
    assert path in str(info.value) and isinstance(info.value, ValueError)
    if fault != "unreadable":
        with pytest.raises(LedgerFileError, match=problem):
            PrivacyLedger.load(path)


def test_a_symlink_to_a_ledger_is_followed_and_kept(tmp_path):
    target = saved(tmp_path, name="real.json")
    link = str(tmp_path / "link.json")
    os.symlink(target, link)
    strategy = AccountedFedAvg(ledger_path=link, resume=True)
    assert strategy.ledger.epsilon() == pytest.approx(small_ledger().epsilon())
    strategy.ledger.record(LaplaceDpEvent(1.0), server_round=3, client=9)
    strategy.save_ledger()
    assert os.path.islink(link) and PrivacyLedger.load(target).epsilon(9) > 0


def test_size_cap_refuses_to_write_and_to_read(tmp_path):
    path = str(tmp_path / "ledger.json")
    with pytest.raises(LedgerFileError, match="size cap"):
        small_ledger().save(path, max_bytes=100)
    assert not os.path.exists(path) and os.listdir(tmp_path) == ["ledger.json.lock"]
    small_ledger().save(path)
    with pytest.raises(LedgerFileError, match="size cap"):
        PrivacyLedger.load(path, max_bytes=100)


def test_save_fsyncs_the_file_and_its_directory(tmp_path, monkeypatch):
    kinds = []
    real_fsync = os.fsync

    def recording(fd):
        kinds.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording)
    saved(tmp_path)
    assert kinds == ["file", "dir", "file", "dir"]  # the ledger, then its high-water mark (after it)


def test_a_failed_save_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch):
    path = saved(tmp_path)
    before = open(path, "rb").read()
    ledger = PrivacyLedger.load(path)
    ledger.record(LaplaceDpEvent(1.0), server_round=3, client=9)

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(LedgerFileError, match="could not be written"):
        ledger.save(path)
    assert open(path, "rb").read() == before
    assert sorted(os.listdir(tmp_path)) == ["ledger.json", "ledger.json.hwm", "ledger.json.lock"]


def _module_path() -> str:
    return ledger_file.__file__


def test_a_save_killed_mid_write_leaves_the_old_file_and_its_temp_file_is_removed(tmp_path):
    """SIGKILL after the temp file is written and before the rename: the next opening cleans up."""
    path = saved(tmp_path)
    before = open(path, "rb").read()
    child = textwrap.dedent(f"""
        import importlib.util, os, signal
        spec = importlib.util.spec_from_file_location("lf", {_module_path()!r})
        lf = importlib.util.module_from_spec(spec); spec.loader.exec_module(lf)
        os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
        lf.write_atomic({path!r}, b"x" * 5_000_000)
    """)
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    temps = [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    assert len(temps) == 1 and os.path.getsize(tmp_path / temps[0]) == 5_000_000
    assert open(path, "rb").read() == before  # the old snapshot is intact
    strategy = AccountedFedAvg(ledger_path=path, resume=True)  # opening for writing removes the stale temp file
    assert strategy.ledger.epsilon() == pytest.approx(small_ledger().epsilon())
    assert sorted(os.listdir(tmp_path)) == ["ledger.json", "ledger.json.hwm", "ledger.json.lock"]


def test_a_second_process_cannot_open_the_same_ledger_for_writing(tmp_path):
    path = str(tmp_path / "ledger.json")
    holder = textwrap.dedent(f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("lf", {_module_path()!r})
        lf = importlib.util.module_from_spec(spec); spec.loader.exec_module(lf)
        store = lf.LedgerStore({path!r})  # the first writer: holds the lock while it lives
        print("locked", flush=True)
        sys.stdin.read()
    """)
    proc = subprocess.Popen([sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"locked"
        with pytest.raises(LedgerFileError, match=f"in use by another process \\(pid {proc.pid}"):
            AccountedFedAvg(ledger_path=path)
        with pytest.raises(LedgerFileError, match="in use by another process"):
            small_ledger().save(path)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert not os.path.exists(path)
    AccountedFedAvg(ledger_path=path)  # free again once the holder exited


def test_the_strategy_holds_the_lock_for_its_lifetime(tmp_path):
    path = str(tmp_path / "ledger.json")
    strategy = AccountedFedAvg(ledger_path=path)
    fd = os.open(path + ".lock", os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):  # what another process would see
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        del strategy
        import gc

        gc.collect()
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released with the strategy
    finally:
        os.close(fd)


def test_two_writers_in_one_process_do_not_silently_lose_events(tmp_path):
    path = str(tmp_path / "ledger.json")
    first, second = PrivacyLedger(1e-5), PrivacyLedger(1e-5)
    first.record(LaplaceDpEvent(1.0), server_round=1, client=1)
    second.record(LaplaceDpEvent(1.0), server_round=1, client=2)
    first.save(path)
    with pytest.raises(LedgerFileError, match="refusing to choose or merge"):
        second.save(path)
    assert PrivacyLedger.load(path).clients == ["1"]
    first.record(LaplaceDpEvent(1.0), server_round=2, client=1)
    first.save(path)  # the same ledger continues its own file

    a = LedgerStore(path)
    b = LedgerStore(path)
    a.claim("main", None, lambda: PrivacyLedger(1e-5)).record(LaplaceDpEvent(1.0), server_round=3, client=3)
    b.claim("main", None, lambda: PrivacyLedger(1e-5)).record(LaplaceDpEvent(1.0), server_round=3, client=4)
    a.save()
    with pytest.raises(LedgerFileError, match="changed by another writer"):
        b.save()
    assert PrivacyLedger.load(path).clients == ["1", "3"]


def test_unclaimed_named_ledgers_are_kept_when_saving(tmp_path):
    path = str(tmp_path / "ledger.json")
    store = LedgerStore(path)
    store.claim("main", small_ledger(), lambda: PrivacyLedger(1e-5))
    selection = store.claim("selection", None, lambda: PrivacyLedger(1e-5, neighboring_relation="replace_one"))
    selection.record(LaplaceDpEvent(1.0), server_round=1)
    store.save()
    del store
    main = PrivacyLedger.load(path)
    main.record(LaplaceDpEvent(1.0), server_round=3, client=9)
    main.save(path)
    assert PrivacyLedger.load(path, name="selection").epsilon() == pytest.approx(selection.epsilon())
    with pytest.raises(LedgerFileError, match="holds no ledger 'shuffle'"):
        PrivacyLedger.load(path, name="shuffle")
