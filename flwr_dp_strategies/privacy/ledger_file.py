r"""The ledger file: durable, checksummed, single-writer persistence of named privacy ledgers.

A strategy may keep several ledgers (the clients' ``main`` one, MinDivergence's
``selection``, the shuffler's ``shuffle``); :class:`LedgerStore` keeps them
together in **one** file, written atomically, so a restarted server restores
all of them from one consistent snapshot. :meth:`PrivacyLedger.save` /
:meth:`PrivacyLedger.load` use the same format with the single name ``main``.

Format. One line of canonical JSON (no whitespace, ASCII, no NaN/Infinity,
ledger names sorted)::

    {"checksum":"sha256:<hex>","format":"flwr-dp-strategies/ledger-file/1","ledgers":{"main":{...},...}}

where ``checksum`` = SHA-256 (or HMAC-SHA-256, below) of the canonical JSON of
``{"format": ..., "ledgers": ...}`` and each ledger is
:meth:`PrivacyLedger.to_json`'s canonical body. Loading checks, in order: the
path holds a regular, non-empty file (a dangling symbolic link, a directory, an
unreadable or empty file is an error, never a fresh start) of at most
``max_bytes``; strict JSON (a duplicate key, ``NaN`` or ``Infinity`` is refused;
nesting is bounded by the size cap); exactly the three fields; the bytes are the
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
file without a valid HMAC (including a plain-SHA-256 one) is refused. The trust
model is then: the ledger is as trustworthy as the key's secrecy and the
server process itself.

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
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Optional, Union

if TYPE_CHECKING:  # pragma: no cover
    from .ledger import PrivacyLedger

FILE_FORMAT = "flwr-dp-strategies/ledger-file/1"
MAIN = "main"
DEFAULT_MAX_BYTES = 256 * 2**20
KEY_ENV = "FLWR_DP_LEDGER_KEY"
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
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
_BODY_FIELDS = ("accounting", "central", "clients", "events", "format", "labels", "max_epsilon",
                "neighboring_relation", "target_delta")


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
    if sorted(data) != sorted(_BODY_FIELDS):
        raise ValueError(f"a ledger holds exactly the fields {list(_BODY_FIELDS)}, got {sorted(data)}")
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
    return data


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


def encode_file(bodies: Mapping[str, str], key: Optional[bytes]) -> bytes:
    """The file's bytes for canonical ledger bodies by name (built without re-parsing them)."""
    ledgers = "{" + ",".join(f"{canonical_json(n)}:{bodies[n]}" for n in sorted(bodies)) + "}"
    signed = '{"format":' + canonical_json(FILE_FORMAT) + ',"ledgers":' + ledgers + "}"
    checksum = _checksum(signed, key)
    return ('{"checksum":' + canonical_json(checksum) + ',"format":' + canonical_json(FILE_FORMAT)
            + ',"ledgers":' + ledgers + "}\n").encode("ascii")


def decode_file(data: bytes, path: str, key: Optional[bytes]) -> tuple[dict[str, str], str]:
    """(canonical body text by name, checksum) of a file's bytes; :class:`LedgerFileError` if anything is off."""
    try:
        envelope = strict_loads(data.decode("ascii"))
    except (UnicodeDecodeError, ValueError) as err:
        raise LedgerFileError(path, f"is not valid ledger JSON ({err})") from err
    if not isinstance(envelope, dict) or sorted(envelope) != ["checksum", "format", "ledgers"]:
        if isinstance(envelope, dict) and "format" in envelope and "events" in envelope:
            raise LedgerFileError(path, "was written without a checksum (an older version of this package); it "
                                  "cannot be trusted as is: re-save it deliberately with PrivacyLedger.save after "
                                  "checking its content")
        raise LedgerFileError(path, "is not a ledger file (expected the fields checksum, format, ledgers)")
    if envelope["format"] != FILE_FORMAT:
        raise LedgerFileError(path, f"has format {envelope['format']!r}, expected {FILE_FORMAT!r}")
    ledgers, checksum = envelope["ledgers"], envelope["checksum"]
    if not isinstance(ledgers, dict) or not all(isinstance(n, str) and _NAME.match(n) for n in ledgers):
        raise LedgerFileError(path, "'ledgers' must map ledger names to ledgers")
    if not isinstance(checksum, str):
        raise LedgerFileError(path, "'checksum' must be a string")
    try:
        bodies = {name: canonical_json(body) for name, body in ledgers.items()}
        canonical = encode_file(bodies, key)
    except (TypeError, ValueError) as err:
        raise LedgerFileError(path, f"cannot be re-serialised ({err})") from err
    if checksum.startswith("hmac-") != (key is not None):
        problem = ("is authenticated with a key (HMAC); set the key (FLWR_DP_LEDGER_KEY) to load it"
                   if key is None else "is not authenticated with the configured key (FLWR_DP_LEDGER_KEY): "
                   "refused, it may have been forged")
        raise LedgerFileError(path, problem)
    expected = _HEADER.match(canonical)
    assert expected is not None
    if not hmac.compare_digest(checksum.encode("ascii", "replace"), expected.group(1)):
        raise LedgerFileError(path, "checksum mismatch: the file was changed after it was written "
                              "(corruption or an edit); refusing to load it")
    if canonical != data:
        raise LedgerFileError(path, "is not in canonical form: it was edited after it was written")
    return bodies, checksum


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
        raise LedgerFileError(path, f"is a dangling symbolic link (to {os.readlink(path)!r}): the ledger it "
                              "pointed to is missing; refusing to start from epsilon = 0")
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


def read_file(path: PathLike, *, key: Union[None, str, bytes] = None,
              max_bytes: Optional[int] = None) -> Optional[tuple[dict[str, str], str]]:
    """(canonical body text by name, checksum), or None if nothing is at ``path``."""
    path = os.fspath(path)
    data = read_bytes(path, max_bytes)
    return None if data is None else decode_file(data, path, _key_bytes(key))


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
                view = view[os.write(fd, view):]
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
            raise LedgerFileError(path, f"its lock file {lock_path!r} cannot be opened ({err.strerror or err})") from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise LedgerFileError(path, f"is in use by another process (pid {holder}, lock {lock_path!r}): "
                                      "two writers would lose each other's events") from err
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


# ---------------------------------------------------------------------- the store
_ORIGIN: "weakref.WeakKeyDictionary[Any, tuple[str, str]]" = weakref.WeakKeyDictionary()


def _is_empty(ledger: "PrivacyLedger") -> bool:
    return not ledger.clients and not ledger.rounds()


def _transplant(target: "PrivacyLedger", source: "PrivacyLedger") -> None:
    """Make ``target`` (an object others hold) the restored ledger ``source``."""
    state = vars(source).copy()
    vars(target).clear()
    vars(target).update(state)


class LedgerStore:
    """The named ledgers one strategy keeps, restored from and saved to one file together.

    Args:
        path: the file (None: nothing is persisted, :meth:`save` does nothing). Opening
            a path locks it for this process (see the module docstring) and restores
            what is there; nothing there is a fresh start, anything else unreadable raises.
        key: HMAC key (default: ``$FLWR_DP_LEDGER_KEY``, else plain SHA-256).
        max_bytes: size cap of the file, read and written (default :data:`DEFAULT_MAX_BYTES`,
            256 MiB, a module attribute an operator may raise).

    :meth:`claim` gives the ledger of a name, :meth:`save` writes all of them.
    """

    def __init__(self, path: Optional[PathLike] = None, *, key: Union[None, str, bytes] = None,
                 max_bytes: Optional[int] = None) -> None:
        self.max_bytes = _cap(max_bytes)
        self._key = _key_bytes(key)
        self.path: Optional[str] = None
        self._lock: Optional[_FileLock] = None
        self._checksum: Optional[str] = None
        self._stored: dict[str, str] = {}      # bodies in the file that no one has claimed yet
        self._ledgers: dict[str, "PrivacyLedger"] = {}
        self._explicit: set[str] = set()
        if path is not None:
            self.bind(path)

    @property
    def names(self) -> list[str]:
        """Names of the ledgers this store holds (claimed or only restored)."""
        return sorted(set(self._ledgers) | set(self._stored))

    def bind(self, path: PathLike) -> None:
        """Persist to ``path`` from now on: lock it, restore what it holds into the claimed ledgers."""
        real = _target(path)
        if self.path is not None:
            if self.path != real:
                raise LedgerFileError(path, f"these ledgers are already persisted to {self.path!r}")
            return
        lock = _FileLock.acquire(real)
        with lock.mutex:
            remove_stale_temps(real)
            found = self._read_keyed(real)
        bodies, checksum = found if found is not None else ({}, None)
        restored = {name: self._rebuild(real, name, body) for name, body in bodies.items()
                    if name in self._ledgers}
        for name, ledger in restored.items():  # check all before changing any
            self._check_compatible(real, name, self._ledgers[name], ledger, checksum)
        for name, ledger in restored.items():
            self._adopt(real, name, self._ledgers[name], ledger, checksum)
        self.path, self._lock, self._checksum = real, lock, checksum
        self._stored = {n: b for n, b in bodies.items() if n not in self._ledgers}
        for ledger in self._ledgers.values():
            _ORIGIN[ledger] = (real, checksum or "")

    def _read_keyed(self, real: str) -> Optional[tuple[dict[str, str], str]]:
        data = read_bytes(real, self.max_bytes)
        return None if data is None else decode_file(data, real, self._key)

    @staticmethod
    def _rebuild(path: str, name: str, body: str) -> "PrivacyLedger":
        from .ledger import PrivacyLedger

        try:
            ledger = PrivacyLedger.from_json(body)
        except Exception as err:  # noqa: BLE001 - any failure to rebuild means the content is invalid
            raise LedgerFileError(path, f"ledger {name!r} is not a valid ledger: {err}") from err
        return ledger

    def _check_compatible(self, path: str, name: str, held: "PrivacyLedger", restored: "PrivacyLedger",
                          checksum: Optional[str]) -> None:
        if _ORIGIN.get(held) == (path, checksum or ""):
            return  # ``held`` is the continuation of exactly this file
        if name not in self._explicit:
            if not _is_empty(held):
                raise LedgerFileError(path, f"holds ledger {name!r}, and the one in memory already holds other "
                                      "events: refusing to choose or merge")
            return
        for field in ("target_delta", "neighboring_relation"):
            mine, theirs = getattr(held, field), getattr(restored, field)
            if mine != theirs:
                raise LedgerFileError(path, f"holds ledger {name!r} with {field}={theirs!r}, but the ledger passed "
                                      f"has {field}={mine!r}: pass a matching ledger, or none to continue the file's")
        if not _is_empty(held):
            raise LedgerFileError(path, f"holds ledger {name!r} with events, and the ledger passed holds events "
                                  "of its own: refusing to choose or merge (pass an empty ledger or none)")

    def _adopt(self, path: str, name: str, held: "PrivacyLedger", restored: "PrivacyLedger",
               checksum: Optional[str]) -> None:
        if _ORIGIN.get(held) == (path, checksum or ""):
            return
        budget, accounting = held.max_epsilon, held.accounting
        _transplant(held, restored)
        if name in self._explicit:  # the caller's budget and accounting method apply from now on
            if (budget, accounting) != (restored.max_epsilon, restored.accounting):
                _LOG.warning("Ledger %r restored from %s: max_epsilon %s -> %s and accounting %r -> %r as passed",
                             name, path, restored.max_epsilon, budget, restored.accounting, accounting)
            held.max_epsilon, held.accounting = budget, accounting
        _LOG.info("Privacy ledger %r restored from %s: epsilon=%.4f at delta=%g, %d clients", name, path,
                  held.epsilon(), held.target_delta, len(held.clients))

    def claim(self, name: str, ledger: Optional["PrivacyLedger"],
              default: Callable[[], "PrivacyLedger"]) -> "PrivacyLedger":
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
                raise ValueError(f"two different ledgers were given for {name!r} of the same strategy (a wrapper "
                                 "shares the wrapped strategy's ledger: pass it to one of them only)")
            return held
        held = ledger if ledger is not None else default()
        if ledger is not None:
            self._explicit.add(name)
        if self.path is not None and name in self._stored:
            restored = self._rebuild(self.path, name, self._stored[name])
            self._ledgers[name] = held
            try:
                self._check_compatible(self.path, name, held, restored, self._checksum)
            except LedgerFileError:
                del self._ledgers[name]
                self._explicit.discard(name)
                raise
            if ledger is None:
                held = self._ledgers[name] = restored
                _LOG.info("Privacy ledger %r restored from %s: epsilon=%.4f at delta=%g, %d clients", name,
                          self.path, held.epsilon(), held.target_delta, len(held.clients))
            else:
                self._adopt(self.path, name, held, restored, self._checksum)
            del self._stored[name]
        self._ledgers[name] = held
        if self.path is not None:
            _ORIGIN[held] = (self.path, self._checksum or "")
        return held

    def get(self, name: str) -> Optional["PrivacyLedger"]:
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
                raise LedgerFileError(self.path, f"was changed by another writer since this process last read or "
                                      f"wrote it (expected {self._checksum}, found {current}); refusing to "
                                      "overwrite its events")
            bodies = dict(self._stored)
            bodies.update({name: ledger.to_json() for name, ledger in self._ledgers.items()})
            data = encode_file(bodies, self._key)
            if len(data) > self.max_bytes:
                raise LedgerFileError(self.path, f"would be {len(data)} bytes, above the size cap of "
                                      f"{self.max_bytes} (max_bytes); nothing was written")
            try:
                write_atomic(self.path, data)
            except OSError as err:
                raise LedgerFileError(self.path, f"could not be written ({err.strerror or err})") from err
            self._checksum = _HEADER.match(data).group(1).decode("ascii")  # type: ignore[union-attr]
            for ledger in self._ledgers.values():
                _ORIGIN[ledger] = (self.path, self._checksum)

    def close(self) -> None:
        """Stop persisting (the lock is released once no store of this process holds the path)."""
        self.path, self._lock = None, None


__all__ = [
    "DEFAULT_MAX_BYTES",
    "FILE_FORMAT",
    "KEY_ENV",
    "LedgerFileError",
    "LedgerStore",
    "MAIN",
    "canonical_json",
    "decode_file",
    "encode_file",
    "parse_body",
    "read_file",
    "strict_loads",
]
