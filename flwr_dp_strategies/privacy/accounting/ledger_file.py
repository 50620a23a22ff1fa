r"""The ledger file: durable, checksummed, single-writer persistence of named privacy ledgers.

A strategy may keep several ledgers (the clients' ``main`` one, MinDivergence's
``selection``, the shuffler's ``shuffle``); :class:`LedgerStore` keeps them
together in **one** file, written atomically, so a restarted server restores
all of them from one consistent snapshot. :meth:`PrivacyLedger.save` /
:meth:`PrivacyLedger.load` use the same format with the single name ``main``.

Format. One line of canonical JSON (no whitespace, ASCII, no NaN/Infinity,
ledger names sorted)::

    {"checksum":"hmac-sha256:<hex>","format":"flwr-dp-strategies/ledger-file/2","generation":7,
     "ledgers":{"main":{...},...},"path":"/abs/ledger.json","run":"<32 hex>","state":{...}}

where ``checksum`` = SHA-256 (or HMAC-SHA-256, below) of the canonical JSON of
everything else, each ledger is :meth:`PrivacyLedger.to_json`'s canonical body,
``run`` identifies the run (drawn at random when a new run creates the file),
``path`` is the resolved absolute path the file was written to, ``generation``
counts the saves of the run (1, 2, ...) and ``state`` holds strategies' public
state (a learnt clipping norm). Files of format 1 (``checksum``, ``format``,
``ledgers`` only) are still read, never resumed by a strategy. Loading checks, in order: the
path holds a regular, non-empty file (a dangling symbolic link, a directory, an
unreadable or empty file is an error, never a fresh start) of at most
``max_bytes``; strict JSON (a duplicate key, ``NaN`` or ``Infinity`` is refused;
nesting is bounded by the size cap); exactly the fields; the bytes are the
canonical serialisation of what they parse to (so no byte can change without
changing the parsed value); the checksum; then every ledger body is rebuilt
through :meth:`PrivacyLedger.from_json`, which validates every event
(:func:`~.event_validation.validate_event`), the configuration and the
client/round structure. Every failure is one :class:`LedgerFileError`
(a ``ValueError``) naming the file and what is wrong.

What the checksum detects, and what it does not. Any accidental change (a bit
flip, a truncated or interleaved write, a hand edit that forgets the checksum)
is detected: a change inside the hashed part changes the SHA-256 (a collision
is needed to miss it), a change of the checksum itself no longer matches, and a
change that parses to the same value (whitespace, ``1e-05`` → ``1E-05``) breaks
the canonical form. A plain SHA-256 does **not** authenticate: whoever can write
the file can recompute it, so a deliberate forgery (``"clients": {}``, a larger
noise multiplier) with a fresh checksum loads. Semantic validation still refuses
what no ledger could hold (NaN, negative or out-of-domain parameters, unknown
event types), but a well-formed lie is indistinguishable from the truth. To
authenticate the file against someone who can write it but does not hold a
secret, set a key (``key=`` or the environment variable ``FLWR_DP_LEDGER_KEY``):
the checksum becomes HMAC-SHA-256 under that key, and with a key configured a
file without a valid HMAC (including a plain-SHA-256 one) is refused.

Freshness: the high-water mark. An HMAC proves that the key's holder wrote the
bytes, not that they are the latest: an older authentic snapshot, or another
run's authentic file, carries a valid HMAC too. Every save therefore also writes
a high-water record (:class:`HighWaterMark`: run, path, generation and the
ledger file's checksum, checksummed the same way) to ``high_water_path``
(default ``<file>.hwm``, beside it), after the ledger file. When a
:class:`LedgerStore` opens a file it refuses: a file whose ``path`` is not the
one opened (copied from elsewhere); a file whose ``run`` differs from the
mark's (another run's file); a generation below the mark's, or equal with another
checksum (a rollback or substitution); a generation more than one save ahead;
a missing file while a mark exists (a deletion), whatever ``resume`` says. With
``resume=True`` it also refuses a missing file and a missing mark (freshness that
cannot be checked). A file exactly one generation ahead of its mark is a save
interrupted between the two writes, and is accepted with a warning.

What this does not detect: (1) without a key, anything (whoever can write the
files recomputes both checksums); (2) with the mark beside the file, the two rolled
back **together** (an older copy of both), or both deleted while the run is
restarted with ``resume=False`` (a new run: explicitly not a resume); (3) the mark
itself rolled back together with the file wherever both are writable. Put
``high_water_path`` on storage that whoever can write the ledger file cannot
write (another volume, another owner, a WORM store): a rollback of the file
alone is then always refused. The trust model is: the ledger is as trustworthy as
the key's secrecy, the server process itself and the high-water record's storage.

Durability. A save writes a temporary file next to the target
(``.<name>.<pid>.<random>.tmp``), ``fsync``\ s it, renames it over the target
(atomic on POSIX) and ``fsync``\ s the directory, so after a crash the file is
either the old or the new snapshot. A temporary file left by a killed save is
removed the next time the file is opened for writing (under the lock, no live
writer can own it); one left by an exception is removed at once.

Single writer. A :class:`LedgerStore` holds an exclusive ``fcntl.flock`` on the
sidecar ``<file>.lock`` for its lifetime: a second process opening the same
file for writing gets a :class:`LedgerFileError` naming the holder's pid,
before it releases anything. Within one process the lock is shared (a wrapper
strategy and the strategy it wraps use the same store), and every save first
compares the file's checksum with the one this store last read or wrote: a file
changed by any other writer in the meantime is not overwritten (its events
would be lost) but reported.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import stat
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Optional, Protocol, Union

FILE_FORMAT = "flwr-dp-strategies/ledger-file/2"
FILE_FORMAT_1 = "flwr-dp-strategies/ledger-file/1"
HIGH_WATER_FORMAT = "flwr-dp-strategies/ledger-high-water/1"
HIGH_WATER_SUFFIX = ".hwm"
MAIN = "main"
DEFAULT_MAX_BYTES = 256 * 2**20
KEY_ENV = "FLWR_DP_LEDGER_KEY"
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
_RUN = re.compile(r"^[0-9a-f]{32}$")
_CHECKSUM = re.compile(r"^(?:sha256|hmac-sha256):[0-9a-f]{64}$")
_MAX_PATH = 4096
_HIGH_WATER_MAX_BYTES = 8192
_HEADER = re.compile(rb'^\{"checksum":"((?:sha256|hmac-sha256):[0-9a-f]{64})",')
_LOG = logging.getLogger(__name__)
PathLike = Union[str, "os.PathLike[str]"]


class LedgerFileError(ValueError):
    """A ledger file that cannot be read, trusted or written; names the file and the problem."""

    def __init__(self, path: object, problem: str) -> None:
        self.path = os.fspath(path) if isinstance(path, (str, os.PathLike)) else str(path)
        self.problem = problem
        super().__init__(f"ledger file {self.path!r}: {problem}")


# ---------------------------------------------------------------------- canonical, strict JSON
def canonical_json(value: Any) -> str:
    """The one serialisation the file uses: keys in their (insertion) order, no whitespace, ASCII,
    no NaN/Infinity. Deterministic for a parsed value, so ``canonical_json(strict_loads(b)) == b``
    holds exactly for the canonical bytes ``b`` (duplicate keys are refused)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate JSON key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} is not allowed")


def strict_loads(text: Union[str, bytes]) -> Any:
    """``json.loads`` refusing duplicate keys and NaN/Infinity; any failure is a ``ValueError``."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except RecursionError as err:
        raise ValueError("JSON nested too deeply") from err
    except (TypeError, UnicodeDecodeError) as err:
        raise ValueError(f"not JSON text: {err}") from err


# ---------------------------------------------------------------------- ledger body schema
_BODY_FIELDS = (
    "accounting",
    "central",
    "clients",
    "events",
    "format",
    "labels",
    "max_epsilon",
    "neighboring_relation",
    "target_delta",
)
#: optional: the record-level part of ``clients`` (absent in bodies saved before units existed: all client-level)
#: and of ``central`` (absent in bodies without a central record-level event: every central event client-level)
_OPTIONAL_BODY_FIELDS = ("central_record_level", "record_level")


def _rounds(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where} must be a non-empty list of rounds")
    for r in value:
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise ValueError(f"{where} holds {r!r}, not a round number (int >= 0)")
    return value


def _bookings(value: Any, events: Mapping[str, Any], where: str) -> dict[str, list[int]]:
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be an object")
    for key, rounds in value.items():
        if key not in events:
            raise ValueError(f"{where} refers to an event that is not in 'events'")
        _rounds(rounds, f"{where}[{key}]")
    return value


def parse_body(text: Union[str, bytes]) -> dict[str, Any]:
    """A ledger body (:meth:`PrivacyLedger.to_json`) parsed strictly, with its structure checked.

    Field values' domains (δ, relation, budget, events) are checked by the ledger's
    constructor and event validation when it is rebuilt; here: exactly the fields,
    and the types and cross-references of the bookings. Raises ``ValueError``.
    """
    data = strict_loads(text)
    if not isinstance(data, dict):
        raise ValueError("a ledger must be a JSON object")
    if sorted(set(data) - set(_OPTIONAL_BODY_FIELDS)) != sorted(_BODY_FIELDS):
        raise ValueError(
            f"a ledger holds exactly the fields {list(_BODY_FIELDS)} (and optionally {list(_OPTIONAL_BODY_FIELDS)}),"
            f" got {sorted(data)}"
        )
    events = data["events"]
    if not isinstance(events, dict) or not all(isinstance(e, dict) for e in events.values()):
        raise ValueError("'events' must map keys to event descriptions")
    labels = data["labels"]
    if not isinstance(labels, dict) or not all(k in events and isinstance(v, str) for k, v in labels.items()):
        raise ValueError("'labels' must map known event keys to strings")
    _bookings(data["central"], events, "central")
    clients = data["clients"]
    if not isinstance(clients, dict):
        raise ValueError("'clients' must be an object")
    for client, bookings in clients.items():
        if not client:
            raise ValueError("'clients' holds an empty client id")
        _bookings(bookings, events, f"clients[{client}]")
    if "record_level" in data:
        _record_level(data["record_level"], clients, events)
    if "central_record_level" in data:
        _central_record_level(data["central_record_level"], data["central"], events)
    return data


def _record_level(value: Any, clients: Mapping[str, Any], events: Mapping[str, Any]) -> None:
    """``record_level``: a non-empty part of ``clients`` (every round of it booked there for the same event)."""
    if not isinstance(value, dict) or not value:
        raise ValueError("'record_level' must be a non-empty object (absent when there is no record-level booking)")
    for client, bookings in value.items():
        if client not in clients:
            raise ValueError("'record_level' names a client that is not in 'clients'")
        _bookings(bookings, events, f"record_level[{client}]")
        if not bookings:
            raise ValueError(f"record_level[{client}] is empty")
        for key, rounds in bookings.items():
            if Counter(rounds) - Counter(clients[client].get(key, [])):
                raise ValueError(f"record_level[{client}][{key}] holds rounds not booked in clients[{client}]")


def _central_record_level(value: Any, central: Mapping[str, Any], events: Mapping[str, Any]) -> None:
    """``central_record_level``: a non-empty part of ``central`` (every round of it booked there for the same
    event)."""
    if not isinstance(value, dict) or not value:
        raise ValueError(
            "'central_record_level' must be a non-empty object (absent when there is no central record-level booking)"
        )
    _bookings(value, events, "central_record_level")
    for key, rounds in value.items():
        if Counter(rounds) - Counter(central.get(key, [])):
            raise ValueError(f"central_record_level[{key}] holds rounds not booked in central")


# ---------------------------------------------------------------------- file encoding
def _key_bytes(key: Union[None, str, bytes]) -> Optional[bytes]:
    if key is None:
        env = os.environ.get(KEY_ENV)
        key = env if env else None
    if key is None:
        return None
    raw = key.encode() if isinstance(key, str) else bytes(key)
    if len(raw) < 16:
        raise ValueError(f"the ledger HMAC key must be at least 16 bytes, got {len(raw)}")
    return raw


def _checksum(signed: str, key: Optional[bytes]) -> str:
    if key is None:
        return "sha256:" + hashlib.sha256(signed.encode("ascii")).hexdigest()
    return "hmac-sha256:" + hmac.new(key, signed.encode("ascii"), hashlib.sha256).hexdigest()


class Envelope(NamedTuple):
    """A decoded, verified ledger file: its ledger bodies and what binds them to one run, path and save.

    ``run``, ``path`` and ``generation`` are None / 0 for a file of format 1 (written before
    the binding existed); ``state`` is the strategies' public state by name (e.g. a learnt
    clipping norm), in the same signed envelope.
    """

    bodies: dict[str, str]
    checksum: str
    format: str
    run: Optional[str]
    path: Optional[str]
    generation: int
    state: dict[str, dict[str, Any]]


def _signed_text(fields: list[tuple[str, str]]) -> str:
    """The canonical JSON object of ``(name, canonical value text)`` pairs, in that order."""
    return "{" + ",".join(f"{canonical_json(name)}:{value}" for name, value in fields) + "}"


def _with_checksum(fields: list[tuple[str, str]], key: Optional[bytes]) -> bytes:
    checksum = _checksum(_signed_text(fields), key)
    return (_signed_text([("checksum", canonical_json(checksum)), *fields]) + "\n").encode("ascii")


def encode_file(
    bodies: Mapping[str, str],
    key: Optional[bytes],
    *,
    run: Optional[str] = None,
    path: Optional[str] = None,
    generation: int = 0,
    state: Optional[Mapping[str, Any]] = None,
) -> bytes:
    """The file's bytes for canonical ledger bodies by name (built without re-parsing them).

    With ``run`` (and then ``path`` and ``generation`` >= 1): format 2, binding the ledgers
    to that run, absolute path and save number, with the strategies' ``state``. Without:
    format 1 (no binding; kept so that files of that format can be read and tested).
    """
    ledgers = "{" + ",".join(f"{canonical_json(n)}:{bodies[n]}" for n in sorted(bodies)) + "}"
    if run is None:
        return _with_checksum([("format", canonical_json(FILE_FORMAT_1)), ("ledgers", ledgers)], key)
    return _with_checksum(
        [
            ("format", canonical_json(FILE_FORMAT)),
            ("generation", canonical_json(generation)),
            ("ledgers", ledgers),
            ("path", canonical_json(path)),
            ("run", canonical_json(run)),
            ("state", canonical_json(dict(state or {}))),
        ],
        key,
    )


_V1_FIELDS = ["checksum", "format", "ledgers"]
_V2_FIELDS = ["checksum", "format", "generation", "ledgers", "path", "run", "state"]


def _generation(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and 1 <= value < 2**63


def _check_binding(envelope: Mapping[str, Any], path: str) -> None:
    """The format-2 fields' types and domains."""
    if not _generation(envelope["generation"]):
        raise LedgerFileError(path, "'generation' must be an int in [1, 2**63)")
    if not isinstance(envelope["run"], str) or not _RUN.match(envelope["run"]):
        raise LedgerFileError(path, "'run' must be a run identifier (32 lowercase hex digits)")
    where = envelope["path"]
    if not isinstance(where, str) or not os.path.isabs(where) or len(where) > _MAX_PATH or "\x00" in where:
        raise LedgerFileError(path, "'path' must be the absolute path the file was written to")
    state = envelope["state"]
    if not isinstance(state, dict) or not all(
        isinstance(n, str) and _NAME.match(n) and isinstance(v, dict) for n, v in state.items()
    ):
        raise LedgerFileError(path, "'state' must map names to objects")


def decode_envelope(data: bytes, path: str, key: Optional[bytes]) -> Envelope:
    """The verified :class:`Envelope` of a file's bytes; :class:`LedgerFileError` if anything is off.

    Checks the structure, the checksum (HMAC with ``key``) and the canonical form; it does
    not check that the file is the latest of its run at this path (:class:`LedgerStore` does).
    """
    try:
        envelope = strict_loads(data.decode("ascii"))
    except (UnicodeDecodeError, ValueError) as err:
        raise LedgerFileError(path, f"is not valid ledger JSON ({err})") from err
    if not isinstance(envelope, dict) or "checksum" not in envelope or "ledgers" not in envelope:
        if isinstance(envelope, dict) and "format" in envelope and "events" in envelope:
            raise LedgerFileError(
                path,
                "was written without a checksum (an older version of this package); it "
                "cannot be trusted as is: re-save it deliberately with PrivacyLedger.save after "
                "checking its content",
            )
        raise LedgerFileError(path, "is not a ledger file (expected the fields checksum, format, ledgers, ...)")
    fmt = envelope.get("format")
    if fmt not in (FILE_FORMAT, FILE_FORMAT_1):
        raise LedgerFileError(path, f"has format {fmt!r}, expected {FILE_FORMAT!r}")
    fields = _V2_FIELDS if fmt == FILE_FORMAT else _V1_FIELDS
    if sorted(envelope) != fields:
        raise LedgerFileError(path, f"is not a ledger file of format {fmt!r} (expected exactly the fields {fields})")
    ledgers, checksum = envelope["ledgers"], envelope["checksum"]
    if not isinstance(ledgers, dict) or not all(isinstance(n, str) and _NAME.match(n) for n in ledgers):
        raise LedgerFileError(path, "'ledgers' must map ledger names to ledgers")
    if not isinstance(checksum, str):
        raise LedgerFileError(path, "'checksum' must be a string")
    binding: dict[str, Any] = {}
    if fmt == FILE_FORMAT:
        _check_binding(envelope, path)
        binding = {name: envelope[name] for name in ("run", "path", "generation", "state")}
    try:
        bodies = {name: canonical_json(body) for name, body in ledgers.items()}
        canonical = encode_file(bodies, key, **binding)
    except (TypeError, ValueError) as err:
        raise LedgerFileError(path, f"cannot be re-serialised ({err})") from err
    _verify(checksum, canonical, data, path, key)
    return Envelope(
        bodies,
        checksum,
        fmt,
        run=binding.get("run"),
        path=binding.get("path"),
        generation=binding.get("generation", 0),
        state=binding.get("state", {}),
    )


def _verify(checksum: str, canonical: bytes, data: bytes, path: str, key: Optional[bytes]) -> None:
    """``checksum`` is the one of ``canonical`` under ``key``, and ``data`` is ``canonical``."""
    if checksum.startswith("hmac-") != (key is not None):
        problem = (
            "is authenticated with a key (HMAC); set the key (FLWR_DP_LEDGER_KEY) to load it"
            if key is None
            else "is not authenticated with the configured key (FLWR_DP_LEDGER_KEY): refused, it may have been forged"
        )
        raise LedgerFileError(path, problem)
    expected = _HEADER.match(canonical)
    assert expected is not None
    if not hmac.compare_digest(checksum.encode("ascii", "replace"), expected.group(1)):
        raise LedgerFileError(
            path,
            "checksum mismatch: the file was changed after it was written (corruption or an edit); refusing to load it",
        )
    if canonical != data:
        raise LedgerFileError(path, "is not in canonical form: it was edited after it was written")


def decode_file(data: bytes, path: str, key: Optional[bytes]) -> tuple[dict[str, str], str]:
    """(canonical body text by name, checksum) of a file's bytes (:func:`decode_envelope`)."""
    envelope = decode_envelope(data, path, key)
    return envelope.bodies, envelope.checksum


# ---------------------------------------------------------------------- the high-water mark
class HighWaterMark(NamedTuple):
    """The last save of a ledger file as recorded beside (or away from) it: run, path, generation, checksum."""

    run: str
    path: str
    generation: int
    ledger_checksum: str


def encode_high_water(mark: HighWaterMark, key: Optional[bytes]) -> bytes:
    """The high-water record's bytes (one line of canonical JSON, checksummed like the ledger file)."""
    return _with_checksum(
        [
            ("format", canonical_json(HIGH_WATER_FORMAT)),
            ("generation", canonical_json(mark.generation)),
            ("ledger", canonical_json(mark.ledger_checksum)),
            ("path", canonical_json(mark.path)),
            ("run", canonical_json(mark.run)),
        ],
        key,
    )


def decode_high_water(data: bytes, path: str, key: Optional[bytes]) -> HighWaterMark:
    """The verified :class:`HighWaterMark` of a record's bytes; :class:`LedgerFileError` if anything is off."""
    try:
        record = strict_loads(data.decode("ascii"))
    except (UnicodeDecodeError, ValueError) as err:
        raise LedgerFileError(path, f"is not a valid high-water record ({err})") from err
    if not isinstance(record, dict) or sorted(record) != ["checksum", "format", "generation", "ledger", "path", "run"]:
        raise LedgerFileError(
            path, "is not a high-water record (expected checksum, format, generation, ledger, path, run)"
        )
    if record["format"] != HIGH_WATER_FORMAT:
        raise LedgerFileError(path, f"has format {record['format']!r}, expected {HIGH_WATER_FORMAT!r}")
    if (
        not isinstance(record["checksum"], str)
        or not isinstance(record["ledger"], str)
        or not _CHECKSUM.match(record["ledger"])
    ):
        raise LedgerFileError(path, "'checksum' and 'ledger' must be checksums")
    _check_binding({**record, "state": {}}, path)
    mark = HighWaterMark(record["run"], record["path"], record["generation"], record["ledger"])
    _verify(record["checksum"], encode_high_water(mark, key), data, path, key)
    return mark


def check_high_water(path: str, envelope: Envelope, mark_path: str, mark: HighWaterMark) -> None:
    """``envelope`` (the file at ``path``) is the latest save ``mark`` records, or the one save after it
    (logged: a save interrupted before its mark was written); anything else raises :class:`LedgerFileError`.

    Compares run, written-to path, generation and checksum; whether ``path`` is the path the file
    was written to is the caller's check (:class:`LedgerStore` requires it, a reader need not)."""
    if mark.path != envelope.path:
        raise LedgerFileError(mark_path, f"is the high-water mark of {mark.path!r}, not of {envelope.path!r}")
    if mark.run != envelope.run:
        raise LedgerFileError(
            path,
            f"belongs to run {envelope.run}, but the high-water mark {mark_path!r} "
            f"records run {mark.run}: the ledger of another run is refused",
        )
    if envelope.generation < mark.generation or (
        envelope.generation == mark.generation and envelope.checksum != mark.ledger_checksum
    ):
        raise LedgerFileError(
            path,
            f"is generation {envelope.generation} of run {envelope.run}, but generation "
            f"{mark.generation} was saved (high-water mark {mark_path!r}): an older or "
            "substituted snapshot (a rollback); refusing it",
        )
    if envelope.generation > mark.generation + 1:
        raise LedgerFileError(
            path,
            f"is generation {envelope.generation}, more than one save ahead of its "
            f"high-water mark ({mark.generation}, {mark_path!r}); refusing it",
        )
    if envelope.generation == mark.generation + 1:
        _LOG.warning(
            "Privacy ledger file %s: generation %d, its high-water mark %s still at %d (the last save "
            "was interrupted before the mark was written); continuing from the file",
            path,
            envelope.generation,
            mark_path,
            mark.generation,
        )


# ---------------------------------------------------------------------- reading
def _reject_dangling(path: str) -> bool:
    """True if something is at ``path``; a dangling symbolic link raises."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as err:
        raise LedgerFileError(path, f"cannot be inspected ({err.strerror or err})") from err
    if stat.S_ISLNK(st.st_mode) and not os.path.exists(path):
        raise LedgerFileError(
            path,
            f"is a dangling symbolic link (to {os.readlink(path)!r}): the ledger it "
            "pointed to is missing; refusing to start from epsilon = 0",
        )
    return True


def _cap(max_bytes: Optional[int]) -> int:
    """``max_bytes``, or the module's :data:`DEFAULT_MAX_BYTES` (read at call time) if None."""
    cap = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"max_bytes must be an int >= 1, got {cap!r}")
    return cap


def read_bytes(path: str, max_bytes: Optional[int] = None) -> Optional[bytes]:
    """The file's bytes, or None if nothing is at ``path``; anything else there that is not a
    readable, regular, non-empty file of at most ``max_bytes`` raises :class:`LedgerFileError`."""
    max_bytes = _cap(max_bytes)
    if not _reject_dangling(path):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise LedgerFileError(path, f"cannot be read ({err.strerror or err})") from err
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LedgerFileError(path, "is a directory" if stat.S_ISDIR(st.st_mode) else "is not a regular file")
        if st.st_size == 0:
            raise LedgerFileError(path, "is empty (a failed write?); refusing to start from epsilon = 0")
        if st.st_size > max_bytes:
            raise LedgerFileError(path, f"is {st.st_size} bytes, above the size cap of {max_bytes} (max_bytes)")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise LedgerFileError(path, f"grew above the size cap of {max_bytes} bytes while being read")
        return b"".join(chunks)
    except OSError as err:
        raise LedgerFileError(path, f"cannot be read ({err.strerror or err})") from err
    finally:
        os.close(fd)


def read_file(
    path: PathLike, *, key: Union[None, str, bytes] = None, max_bytes: Optional[int] = None
) -> Optional[tuple[dict[str, str], str]]:
    """(canonical body text by name, checksum), or None if nothing is at ``path``."""
    path = os.fspath(path)
    data = read_bytes(path, max_bytes)
    return None if data is None else decode_file(data, path, _key_bytes(key))


def read_envelope(
    path: PathLike, *, key: Union[None, str, bytes] = None, max_bytes: Optional[int] = None
) -> Optional[Envelope]:
    """The verified :class:`Envelope` of the file at ``path``, or None if nothing is there."""
    path = os.fspath(path)
    data = read_bytes(path, max_bytes)
    return None if data is None else decode_envelope(data, path, _key_bytes(key))


def _current_checksum(path: str) -> Optional[str]:
    """The checksum the file at ``path`` claims (its first bytes), None if nothing is there."""
    if not _reject_dangling(path):
        return None
    try:
        with open(path, "rb") as handle:
            head = handle.read(160)
    except OSError as err:
        raise LedgerFileError(path, f"cannot be read ({err.strerror or err})") from err
    match = _HEADER.match(head)
    if match is None:
        raise LedgerFileError(path, "no longer holds a ledger file written by this store; refusing to overwrite it")
    return match.group(1).decode("ascii")


# ---------------------------------------------------------------------- writing
def _temp_pattern(path: str) -> str:
    folder, name = os.path.split(path)
    return os.path.join(glob.escape(folder), "." + glob.escape(name) + ".*.tmp")


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as err:  # some file systems cannot fsync a directory
        if err.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path``: temp file, fsync, rename, fsync of the directory; no temp file is left."""
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(folder or ".")


def remove_stale_temps(path: str) -> list[str]:
    """Remove temporary files a killed save of ``path`` left behind (call with the lock held)."""
    removed = []
    for tmp in glob.glob(_temp_pattern(path)):
        try:
            os.unlink(tmp)
            removed.append(tmp)
        except FileNotFoundError:
            continue
    if removed:
        _LOG.warning("Removed %d temporary file(s) left by an interrupted save of %s", len(removed), path)
    return removed


# ---------------------------------------------------------------------- locking
class _FileLock:
    """An exclusive ``flock`` on ``<path>.lock``, shared by every store of this process for that path."""

    _held: "weakref.WeakValueDictionary[str, _FileLock]" = weakref.WeakValueDictionary()
    _registry_guard = threading.Lock()

    def __init__(self, path: str) -> None:
        self.path = path
        self.mutex = threading.RLock()
        lock_path = path + ".lock"
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError as err:
            raise LedgerFileError(
                path, f"its lock file {lock_path!r} cannot be opened ({err.strerror or err})"
            ) from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise LedgerFileError(
                    path,
                    f"is in use by another process (pid {holder}, lock {lock_path!r}): "
                    "two writers would lose each other's events",
                ) from err
            raise LedgerFileError(path, f"cannot be locked ({err.strerror or err})") from err
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._finalizer = weakref.finalize(self, os.close, fd)

    @classmethod
    def acquire(cls, path: str) -> "_FileLock":
        with cls._registry_guard:
            lock = cls._held.get(path)
            if lock is None:
                lock = cls._held[path] = cls(path)
            return lock


def _forget_locks_in_child() -> None:  # a forked child is another process: it must lock for itself
    _FileLock._held = weakref.WeakValueDictionary()
    _FileLock._registry_guard = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_locks_in_child)


def _target(path: PathLike) -> str:
    """The absolute path writes go to (a symbolic link is followed; a dangling one raises)."""
    path = os.path.abspath(os.fspath(path))
    _reject_dangling(path)
    real = os.path.realpath(path)
    folder = os.path.dirname(real)
    if not os.path.isdir(folder):
        raise LedgerFileError(path, f"its directory {folder!r} does not exist")
    if os.path.isdir(real):
        raise LedgerFileError(path, "is a directory")
    return real


def _high_water_target(real: str, high_water_path: Optional[PathLike]) -> str:
    """The absolute path of the high-water record of the ledger file ``real``."""
    if high_water_path is None:
        return real + HIGH_WATER_SUFFIX
    if not isinstance(high_water_path, (str, os.PathLike)):
        raise ValueError(f"high_water_path must be None, a str or an os.PathLike, got {type(high_water_path).__name__}")
    mark = _target(high_water_path)
    if mark in (real, real + ".lock"):
        raise ValueError(f"high_water_path must be another file than the ledger {real!r} and its lock")
    return mark


# ---------------------------------------------------------------------- the store
_ORIGIN: "weakref.WeakKeyDictionary[Any, tuple[str, str]]" = weakref.WeakKeyDictionary()


class StoredLedger(Protocol):
    """What the store needs of a ledger (:class:`~.ledger.PrivacyLedger` is one): its canonical body
    (``to_json``, and ``from_json`` on its class to rebuild one), the configuration it checks on a
    restore, and whether it holds any event. The store rebuilds a stored body into the class of the
    ledger that claims its name, so this module needs no import of the ledger's."""

    target_delta: float
    neighboring_relation: str
    max_epsilon: Optional[float]
    accounting: str

    @property
    def clients(self) -> Any: ...

    def rounds(self) -> Any: ...

    def epsilon(self) -> float: ...

    def to_json(self) -> str: ...

    @classmethod
    def from_json(cls, text: Union[str, bytes]) -> "StoredLedger": ...


def _is_empty(ledger: "StoredLedger") -> bool:
    return not ledger.clients and not ledger.rounds()


def _transplant(target: "StoredLedger", source: "StoredLedger") -> None:
    """Make ``target`` (an object others hold) the restored ledger ``source``."""
    state = vars(source).copy()
    vars(target).clear()
    vars(target).update(state)


class LedgerStore:
    """The named ledgers one strategy keeps, restored from and saved to one file together.

    Args:
        path: the file (None: nothing is persisted, :meth:`save` does nothing). Opening
            a path locks it for this process (see the module docstring), checks it and
            its high-water mark (below) and restores what is there; anything there that is
            unreadable raises.
        key: HMAC key (default: ``$FLWR_DP_LEDGER_KEY``, else plain SHA-256).
        max_bytes: size cap of the file, read and written (default :data:`DEFAULT_MAX_BYTES`,
            256 MiB, a module attribute an operator may raise).
        resume: ``True``: continue the run whose ledger is at ``path``; no file there, a file of
            another run or path, one without a high-water mark or older than it is an error.
            ``False``: start a new run; a file already there is an error (unless a ledger in
            memory is the continuation of exactly that file, read or written by this process),
            and so is a high-water mark whose ledger is missing. ``None`` (the
            :meth:`PrivacyLedger.save` path): continue what is there, checking it against the
            high-water mark if there is one.
        high_water_path: where the high-water record goes (default ``<path>.hwm``, beside the
            file). Point it at storage that whoever can write the ledger file cannot write:
            only then does a rollback of both files together fail.

    :meth:`claim` gives the ledger of a name, :meth:`save` writes all of them; :meth:`get_state` /
    :meth:`set_state` keep strategies' public state (a learnt clipping norm) in the same file.
    """

    def __init__(
        self,
        path: Optional[PathLike] = None,
        *,
        key: Union[None, str, bytes] = None,
        max_bytes: Optional[int] = None,
        resume: Optional[bool] = None,
        high_water_path: Optional[PathLike] = None,
    ) -> None:
        self.max_bytes = _cap(max_bytes)
        self._key = _key_bytes(key)
        self.path: Optional[str] = None
        self.high_water_path: Optional[str] = None
        self.run_id: Optional[str] = None
        self.generation = 0
        self.restored = False  # True once bound to a path that held a ledger file
        self._lock: Optional[_FileLock] = None
        self._checksum: Optional[str] = None
        self._stored: dict[str, str] = {}  # bodies in the file that no one has claimed yet
        self._ledgers: dict[str, "StoredLedger"] = {}
        self._explicit: set[str] = set()
        self._state: dict[str, dict[str, Any]] = {}
        if path is not None:
            self.bind(path, resume=resume, high_water_path=high_water_path)
        elif resume is not None or high_water_path is not None:
            raise ValueError("resume and high_water_path need a path (the ledger file)")

    @property
    def names(self) -> list[str]:
        """Names of the ledgers this store holds (claimed or only restored)."""
        return sorted(set(self._ledgers) | set(self._stored))

    def bind(
        self, path: PathLike, *, resume: Optional[bool] = None, high_water_path: Optional[PathLike] = None
    ) -> None:
        """Persist to ``path`` from now on: lock it, check it (``resume``, the high-water mark, see
        the class docstring), restore what it holds into the claimed ledgers."""
        if resume not in (None, True, False):
            raise ValueError(f"resume must be True, False or None, got {resume!r}")
        real = _target(path)
        if self.path is not None:
            if self.path != real:
                raise LedgerFileError(path, f"these ledgers are already persisted to {self.path!r}")
            return
        mark_path = _high_water_target(real, high_water_path)
        lock = _FileLock.acquire(real)
        with lock.mutex:
            remove_stale_temps(real)
            remove_stale_temps(mark_path)
            data = read_bytes(real, self.max_bytes)
            envelope = None if data is None else decode_envelope(data, real, self._key)
            mark_data = read_bytes(mark_path, _HIGH_WATER_MAX_BYTES)
            mark = None if mark_data is None else decode_high_water(mark_data, mark_path, self._key)
        self._check_fresh(real, mark_path, envelope, mark, resume, beside=high_water_path is None)
        bodies, checksum = (envelope.bodies, envelope.checksum) if envelope is not None else ({}, None)
        restored = {
            name: self._rebuild(real, name, body, type(self._ledgers[name]))
            for name, body in bodies.items()
            if name in self._ledgers
        }
        for name, ledger in restored.items():  # check all before changing any
            self._check_compatible(real, name, self._ledgers[name], ledger, checksum)
        for name, ledger in restored.items():
            self._adopt(real, name, self._ledgers[name], ledger, checksum)
        self.path, self._lock, self._checksum, self.high_water_path = real, lock, checksum, mark_path
        self.restored = envelope is not None
        if envelope is not None and envelope.run is not None:
            self.run_id, self.generation = envelope.run, envelope.generation
            self._state = {**envelope.state, **self._state}
        else:
            self.run_id, self.generation = secrets.token_hex(16), 0
        self._stored = {n: b for n, b in bodies.items() if n not in self._ledgers}
        for ledger in self._ledgers.values():
            _ORIGIN[ledger] = (real, checksum or "")
        if envelope is None:
            _LOG.info("Privacy ledger file %s: new run %s (high-water mark %s)", real, self.run_id, mark_path)

    def _check_fresh(
        self,
        real: str,
        mark_path: str,
        envelope: Optional[Envelope],
        mark: Optional[HighWaterMark],
        resume: Optional[bool],
        *,
        beside: bool,
    ) -> None:
        """Refuse what ``resume`` does not allow, a file bound to another run or path, and a rollback."""
        if envelope is None:
            if mark is not None:
                raise LedgerFileError(
                    real,
                    f"is missing, but its high-water mark {mark_path!r} records run "
                    f"{mark.run} at generation {mark.generation}: the ledger was deleted or moved; "
                    "refusing to start from epsilon = 0 (remove the high-water mark deliberately "
                    "to start a new run there)",
                )
            if resume:
                raise LedgerFileError(
                    real,
                    "does not exist, but resume=True: the ledger of the run to resume is "
                    "missing; refusing to start from epsilon = 0 (resume=False starts a new run)",
                )
            return
        continuing = any(_ORIGIN.get(held) == (real, envelope.checksum) for held in self._ledgers.values())
        if resume is False and not continuing:
            raise LedgerFileError(
                real,
                f"already holds a ledger (run {envelope.run}, generation "
                f"{envelope.generation}): pass resume=True to continue it, or another path for a "
                "new run; refusing to overwrite it",
            )
        if envelope.run is None:
            if resume:
                raise LedgerFileError(
                    real,
                    f"has format {envelope.format!r}, without the run, path and generation "
                    "binding: its freshness cannot be checked; refusing to resume from it (load "
                    "it with PrivacyLedger.load and start a new run with ledger=)",
                )
            return
        if envelope.path != real:
            raise LedgerFileError(
                real,
                f"was written to {envelope.path!r}, not to this path: a ledger file copied from elsewhere is refused",
            )
        if mark is None:
            if resume:
                raise LedgerFileError(
                    real,
                    f"has no high-water mark at {mark_path!r}: whether it is the latest "
                    "save of its run cannot be checked (a rolled-back or substituted file would "
                    "load); refusing to resume",
                )
            return
        check_high_water(real, envelope, mark_path, mark)
        _LOG.info(
            "Privacy ledger file %s: resuming run %s at generation %d (high-water mark %s checked%s)",
            real,
            envelope.run,
            envelope.generation,
            mark_path,
            "; it lies beside the file: a rollback of both files together is not detected" if beside else "",
        )

    def get_state(self, name: str) -> Optional[dict[str, Any]]:
        """A copy of the public state saved under ``name`` (None if none); validate it before use."""
        value = self._state.get(name)
        return None if value is None else strict_loads(canonical_json(value))

    def set_state(self, name: str, value: Mapping[str, Any]) -> None:
        """Keep ``value`` (a JSON object of public values, finite numbers) under ``name``: saved with
        the ledgers, in the same signed envelope, at the next :meth:`save`."""
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"state name must match {_NAME.pattern}, got {name!r}")
        if not isinstance(value, Mapping):
            raise ValueError(f"state must be a mapping, got {type(value).__name__}")
        try:
            self._state[name] = strict_loads(canonical_json(dict(value)))
        except (TypeError, ValueError) as err:
            raise ValueError(f"state {name!r} must be JSON with finite numbers: {err}") from err

    def _read_keyed(self, real: str) -> Optional[tuple[dict[str, str], str]]:
        data = read_bytes(real, self.max_bytes)
        return None if data is None else decode_file(data, real, self._key)

    @staticmethod
    def _rebuild(path: str, name: str, body: str, kind: type[StoredLedger]) -> StoredLedger:
        """Ledger ``name``'s stored ``body`` rebuilt as a ``kind`` (the class of the ledger claiming it)."""
        try:
            ledger = kind.from_json(body)
        except Exception as err:  # noqa: BLE001 - any failure to rebuild means the content is invalid
            raise LedgerFileError(path, f"ledger {name!r} is not a valid ledger: {err}") from err
        return ledger

    def _check_compatible(
        self, path: str, name: str, held: "StoredLedger", restored: "StoredLedger", checksum: Optional[str]
    ) -> None:
        if _ORIGIN.get(held) == (path, checksum or ""):
            return  # ``held`` is the continuation of exactly this file
        if name not in self._explicit:
            if not _is_empty(held):
                raise LedgerFileError(
                    path,
                    f"holds ledger {name!r}, and the one in memory already holds other "
                    "events: refusing to choose or merge",
                )
            return
        for field in ("target_delta", "neighboring_relation"):
            mine, theirs = getattr(held, field), getattr(restored, field)
            if mine != theirs:
                raise LedgerFileError(
                    path,
                    f"holds ledger {name!r} with {field}={theirs!r}, but the ledger passed "
                    f"has {field}={mine!r}: pass a matching ledger, or none to continue the file's",
                )
        if not _is_empty(held):
            raise LedgerFileError(
                path,
                f"holds ledger {name!r} with events, and the ledger passed holds events "
                "of its own: refusing to choose or merge (pass an empty ledger or none)",
            )

    def _adopt(
        self, path: str, name: str, held: "StoredLedger", restored: "StoredLedger", checksum: Optional[str]
    ) -> None:
        if _ORIGIN.get(held) == (path, checksum or ""):
            return
        budget, accounting = held.max_epsilon, held.accounting
        _transplant(held, restored)
        if name in self._explicit:  # the caller's budget and accounting method apply from now on
            if (budget, accounting) != (restored.max_epsilon, restored.accounting):
                _LOG.warning(
                    "Ledger %r restored from %s: max_epsilon %s -> %s and accounting %r -> %r as passed",
                    name,
                    path,
                    restored.max_epsilon,
                    budget,
                    restored.accounting,
                    accounting,
                )
            held.max_epsilon, held.accounting = budget, accounting
        _LOG.info(
            "Privacy ledger %r restored from %s: epsilon=%.4f at delta=%g, %d clients",
            name,
            path,
            held.epsilon(),
            held.target_delta,
            len(held.clients),
        )

    def claim(
        self, name: str, ledger: Optional["StoredLedger"], default: Callable[[], "StoredLedger"]
    ) -> "StoredLedger":
        """The live ledger called ``name``: restored from the file (into ``ledger`` if one is passed,
        which must then be empty with the same δ and relation), else ``ledger``, else ``default()``.

        A name already claimed returns the same object (a wrapper and the strategy it wraps
        share it); passing a different ledger for it raises ``ValueError``.
        """
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"ledger name must match {_NAME.pattern}, got {name!r}")
        if name in self._ledgers:
            held = self._ledgers[name]
            if ledger is not None and ledger is not held:
                raise ValueError(
                    f"two different ledgers were given for {name!r} of the same strategy (a wrapper "
                    "shares the wrapped strategy's ledger: pass it to one of them only)"
                )
            return held
        held = ledger if ledger is not None else default()
        if ledger is not None:
            self._explicit.add(name)
        if self.path is not None and name in self._stored:
            restored = self._rebuild(self.path, name, self._stored[name], type(held))
            self._ledgers[name] = held
            try:
                self._check_compatible(self.path, name, held, restored, self._checksum)
            except LedgerFileError:
                del self._ledgers[name]
                self._explicit.discard(name)
                raise
            if ledger is None:
                held = self._ledgers[name] = restored
                _LOG.info(
                    "Privacy ledger %r restored from %s: epsilon=%.4f at delta=%g, %d clients",
                    name,
                    self.path,
                    held.epsilon(),
                    held.target_delta,
                    len(held.clients),
                )
            else:
                self._adopt(self.path, name, held, restored, self._checksum)
            del self._stored[name]
        self._ledgers[name] = held
        if self.path is not None:
            _ORIGIN[held] = (self.path, self._checksum or "")
        return held

    def get(self, name: str) -> Optional["StoredLedger"]:
        """The claimed ledger ``name``, or None."""
        return self._ledgers.get(name)

    def save(self) -> None:
        """Write every ledger (claimed, and restored but unclaimed) to the file, atomically, if bound.

        Refuses (:class:`LedgerFileError`) if the file changed since this store last read or
        wrote it, or if it would exceed ``max_bytes``.
        """
        if self.path is None or self._lock is None:
            return
        with self._lock.mutex:
            current = _current_checksum(self.path)
            if current != self._checksum:
                raise LedgerFileError(
                    self.path,
                    f"was changed by another writer since this process last read or "
                    f"wrote it (expected {self._checksum}, found {current}); refusing to "
                    "overwrite its events",
                )
            bodies = dict(self._stored)
            bodies.update({name: ledger.to_json() for name, ledger in self._ledgers.items()})
            generation = self.generation + 1
            data = encode_file(
                bodies, self._key, run=self.run_id, path=self.path, generation=generation, state=self._state
            )
            if len(data) > self.max_bytes:
                raise LedgerFileError(
                    self.path,
                    f"would be {len(data)} bytes, above the size cap of "
                    f"{self.max_bytes} (max_bytes); nothing was written",
                )
            try:
                write_atomic(self.path, data)
            except OSError as err:
                raise LedgerFileError(self.path, f"could not be written ({err.strerror or err})") from err
            header = _HEADER.match(data)
            assert header is not None  # written by this class: it starts with the header
            self._checksum = header.group(1).decode("ascii")
            self.generation = generation
            for ledger in self._ledgers.values():
                _ORIGIN[ledger] = (self.path, self._checksum)
            assert self.run_id is not None and self.high_water_path is not None
            mark = HighWaterMark(self.run_id, self.path, generation, self._checksum)
            try:
                write_atomic(self.high_water_path, encode_high_water(mark, self._key))
            except OSError as err:
                raise LedgerFileError(
                    self.high_water_path,
                    f"(the high-water mark) could not be written ({err.strerror or err}); the ledger itself was saved",
                ) from err

    def close(self) -> None:
        """Stop persisting (the lock is released once no store of this process holds the path)."""
        self.path, self._lock = None, None


__all__ = [
    "DEFAULT_MAX_BYTES",
    "Envelope",
    "FILE_FORMAT",
    "FILE_FORMAT_1",
    "HIGH_WATER_FORMAT",
    "HighWaterMark",
    "KEY_ENV",
    "LedgerFileError",
    "LedgerStore",
    "MAIN",
    "canonical_json",
    "check_high_water",
    "decode_envelope",
    "decode_file",
    "decode_high_water",
    "encode_file",
    "encode_high_water",
    "parse_body",
    "read_envelope",
    "read_file",
    "strict_loads",
]
