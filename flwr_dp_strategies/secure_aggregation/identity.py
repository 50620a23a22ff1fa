r"""Long-term node identities and the operator-signed roster that lets a client tell a real peer from a Sybil.

Trust anchor. The federation's *operator* (the party that admits SuperNodes, as Flower's
``--auth-supernode-public-key`` / ``--trusted-entities`` do for node keys and app bundles) holds an
Ed25519 signing key. It signs a **roster**: the federation's name and, for every admitted node, a
name and that node's long-term Ed25519 public key. Each SuperNode holds its own private key, the
roster and the operator's public key, all delivered out of band through its node config (never
through the server). A client verifies the roster against the operator key it was given, and then
accepts as a SecAgg+ peer only a key advertisement signed by a roster member for this run, this
round and this node id (:func:`advertisement`). The operator is trusted for one thing: that
distinct roster entries are distinct parties, of whom at most the client's assumed number of
colluders work with the server. The server is trusted for nothing the roster covers: it cannot
invent peers, substitute their round keys or replay an old round's keys.

Without a roster a client cannot tell invented peers from real ones; it then counts only its own
noise share (:mod:`.client_protocol`).

Everything here is ``cryptography``'s Ed25519 (RFC 8032); nothing is new crypto.

Files (``flwr-dp roster ...``): a private key is PKCS#8 PEM written with mode 0600; a public key is
its 32 raw bytes in URL-safe base64; a roster is JSON ``{"format", "federation", "members":
[{"name", "public_key"}], "signer", "signature"}`` whose signature covers the canonical JSON of
everything but the signature.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ROSTER_FORMAT = "flwr-dp-roster/1"
PUBLIC_BYTES = 32
SIGNATURE_BYTES = 64
_AD_TAG = b"flwr-dp/secagg+/key-advertisement/v1"
_SURVIVORS_TAG = b"flwr-dp/secagg+/survivors/v1"
_ROSTER_TAG = b"flwr-dp/roster/v1"

NODE_CONFIG_KEY = "dp-signing-key"
"""Node-config key: path of this node's Ed25519 private key (PEM)."""
NODE_CONFIG_ROSTER = "dp-roster"
"""Node-config key: path of the signed roster (JSON)."""
NODE_CONFIG_SIGNER = "dp-roster-signer"
"""Node-config key: the operator's public key (URL-safe base64 of 32 bytes), or a path to a file holding it."""
ROSTER_DIR_ENV = "FLWR_DP_ROSTER_DIR"
"""Environment variable (of the node's process, client side) naming a roster directory as ``flwr-dp roster demo``
writes it: ``roster.json``, ``operator.pub`` and ``<name>.pem`` per member."""


# ---------------------------------------------------------------------------------------------- keys
def generate_signing_key() -> Ed25519PrivateKey:
    """A fresh Ed25519 key from OS entropy."""
    return Ed25519PrivateKey.generate()


def public_bytes(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    """The 32 raw bytes of a key's public half."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def encode_public(raw: bytes) -> str:
    """URL-safe base64 of 32 raw public-key bytes."""
    parse_public(raw, "public key")
    return base64.urlsafe_b64encode(bytes(raw)).decode()


def decode_public(text: str, what: str = "public key") -> bytes:
    """The 32 raw bytes of a URL-safe base64 public key (ValueError naming ``what`` otherwise)."""
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a base64 string, got {type(text).__name__}")
    try:
        raw = base64.urlsafe_b64decode(text.strip().encode())
    except (ValueError, TypeError) as err:
        raise ValueError(f"{what} is not base64") from err
    parse_public(raw, what)
    return raw


def parse_public(raw: object, what: str = "public key") -> Ed25519PublicKey:
    """An Ed25519 public key from 32 raw bytes (ValueError naming ``what`` otherwise)."""
    if not isinstance(raw, (bytes, bytearray)) or len(raw) != PUBLIC_BYTES:
        raise ValueError(f"{what} must be {PUBLIC_BYTES} raw Ed25519 bytes")
    try:
        return Ed25519PublicKey.from_public_bytes(bytes(raw))
    except ValueError as err:
        raise ValueError(f"{what} is not an Ed25519 public key") from err


def verify(raw_public: bytes, signature: object, message: bytes) -> bool:
    """Whether ``signature`` is a valid Ed25519 signature of ``message`` under ``raw_public`` (never raises
    for malformed input)."""
    if not isinstance(signature, (bytes, bytearray)) or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        parse_public(raw_public).verify(bytes(signature), message)
    except (InvalidSignature, ValueError):
        return False
    return True


def save_private_key(key: Ed25519PrivateKey, path: str | os.PathLike[str]) -> None:
    """Write ``key`` as unencrypted PKCS#8 PEM, readable by its owner only (0600); refuses to overwrite."""
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PEM file (ValueError naming the file otherwise)."""
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(f"{path}: not a readable unencrypted PEM private key ({err})") from err
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path}: not an Ed25519 private key")
    return key


def load_public(value: str | os.PathLike[str]) -> bytes:
    """A public key given as base64 text or as the path of a file holding it."""
    text = os.fspath(value)
    candidate = Path(text)
    if len(text) < 256 and candidate.is_file():
        text = candidate.read_text()
    return decode_public(text, "roster signer")


# ------------------------------------------------------------------------------------- signed bodies
def _u64(value: int) -> bytes:
    """8 big-endian bytes of an id in [0, 2^64) (ValueError otherwise: no two ids may sign alike)."""
    if not 0 <= int(value) < 1 << 64:
        raise ValueError(f"an id must lie in [0, 2^64), got {value!r}")
    return struct.pack(">Q", int(value))


def _chunk(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def advertisement(*, run_id: int, server_round: int, node_id: int, pk1: bytes, pk2: bytes) -> bytes:
    """What a node signs at setup: its two round keys, bound to the run, the round and its node id (so a
    key advertised for one round, node or run is refused in any other)."""
    return _AD_TAG + _u64(run_id) + _u64(server_round) + _u64(node_id) + _chunk(pk1) + _chunk(pk2)


def survivors_statement(digest: bytes, survivors: Sequence[int]) -> bytes:
    """What a node signs at the consistency stage: the set of survivors (sorted node ids) of the round whose
    view digest is ``digest`` (the digest binds run, round, parameters and view)."""
    ids = b"".join(_u64(n) for n in sorted(int(n) for n in survivors))
    return _SURVIVORS_TAG + digest + hashlib.sha256(ids).digest()


# -------------------------------------------------------------------------------------------- roster
@dataclass(frozen=True)
class Roster:
    """The operator-signed list of admitted nodes: ``members`` (name, raw Ed25519 public key) pairs, each name
    and key distinct; ``signer`` the operator's public key and ``signature`` its signature of :meth:`body`."""

    federation: str
    members: tuple[tuple[str, bytes], ...]
    signer: bytes
    signature: bytes

    def body(self) -> bytes:
        """The signed bytes: the canonical JSON of the format, federation, members and signer."""
        content = {
            "format": ROSTER_FORMAT,
            "federation": self.federation,
            "members": [{"name": n, "public_key": base64.urlsafe_b64encode(k).decode()} for n, k in self.members],
            "signer": base64.urlsafe_b64encode(self.signer).decode(),
        }
        return _ROSTER_TAG + json.dumps(content, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def sign(cls, federation: str, members: Sequence[tuple[str, bytes]], signer_key: Ed25519PrivateKey) -> "Roster":
        """A roster of ``members`` signed by the operator's ``signer_key`` (ValueError on repeats or bad keys)."""
        roster = cls(str(federation), tuple((str(n), bytes(k)) for n, k in members), public_bytes(signer_key), b"")
        roster._check_members()
        return cls(roster.federation, roster.members, roster.signer, signer_key.sign(roster.body()))

    def _check_members(self) -> None:
        if not self.members:
            raise ValueError("a roster needs at least one member")
        names = [n for n, _ in self.members]
        keys = [k for _, k in self.members]
        if len(set(names)) != len(names):
            raise ValueError("roster member names must be distinct")
        if len(set(keys)) != len(keys):
            raise ValueError("roster member keys must be distinct (one party, one key)")
        for name, key in self.members:
            parse_public(key, f"the public key of roster member {name!r}")

    def verify(self, trusted_signer: bytes) -> "Roster":
        """This roster, after checking that ``trusted_signer`` (the operator key the node was given out of band)
        signed it (ValueError otherwise)."""
        parse_public(trusted_signer, "roster signer")
        if bytes(trusted_signer) != self.signer:
            raise ValueError("the roster is signed by another key than the trusted roster signer")
        if not verify(self.signer, self.signature, self.body()):
            raise ValueError("the roster's signature does not verify (tampered or truncated)")
        self._check_members()
        return self

    def keys(self) -> frozenset[bytes]:
        """The members' public keys."""
        return frozenset(k for _, k in self.members)

    def to_json(self) -> str:
        """The roster file's text."""
        data = json.loads(self.body()[len(_ROSTER_TAG) :])
        data["signature"] = base64.urlsafe_b64encode(self.signature).decode()
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Roster":
        """A roster parsed from its file's text, not yet verified (ValueError if malformed)."""
        try:
            data = json.loads(text)
            if data.get("format") != ROSTER_FORMAT:
                raise ValueError(f"format must be {ROSTER_FORMAT!r}")
            members = tuple(
                (str(m["name"]), decode_public(m["public_key"], f"member {m.get('name')!r}")) for m in data["members"]
            )
            signature = base64.urlsafe_b64decode(str(data["signature"]).encode())
            return cls(str(data["federation"]), members, decode_public(data["signer"], "signer"), signature)
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as err:
            raise ValueError(f"not a roster file ({err})") from err

    @classmethod
    def load(cls, path: str | os.PathLike[str], trusted_signer: bytes) -> "Roster":
        """The roster at ``path``, verified against ``trusted_signer`` (ValueError naming the file otherwise)."""
        try:
            return cls.from_json(Path(path).read_text()).verify(trusted_signer)
        except (OSError, ValueError) as err:
            raise ValueError(f"{path}: {err}") from err


@dataclass(frozen=True)
class NodeIdentity:
    """A node's long-term signing key and, where the operator issued one, the verified roster it belongs to.

    ``roster=None`` is a node with no way to authenticate its peers: it still signs (with this key), but
    counts only its own noise share (see :mod:`.client_protocol`)."""

    signing_key: Ed25519PrivateKey
    roster: Optional[Roster] = None

    def __post_init__(self) -> None:
        if not isinstance(self.signing_key, Ed25519PrivateKey):
            raise TypeError(f"signing_key must be an Ed25519PrivateKey, got {type(self.signing_key).__name__}")
        if self.roster is not None:
            if not isinstance(self.roster, Roster):
                raise TypeError(f"roster must be a Roster, got {type(self.roster).__name__}")
            if self.public not in self.roster.keys():
                raise ValueError("this node's signing key is not a member of its roster")

    @property
    def public(self) -> bytes:
        """This node's raw public key."""
        return public_bytes(self.signing_key)

    def sign(self, message: bytes) -> bytes:
        """Ed25519 signature of ``message``."""
        return self.signing_key.sign(message)

    @classmethod
    def ephemeral(cls) -> "NodeIdentity":
        """A fresh key and no roster (a client that authenticates no peer)."""
        return cls(generate_signing_key(), None)

    @classmethod
    def from_files(
        cls, key_path: str | os.PathLike[str], roster_path: str | os.PathLike[str], signer: str | os.PathLike[str]
    ) -> "NodeIdentity":
        """The identity of a node from its key file, the roster file and the trusted signer (base64 or a file)."""
        return cls(load_private_key(key_path), Roster.load(roster_path, load_public(signer)))

    @classmethod
    def from_node_config(cls, node_config: Mapping[str, Any]) -> Optional["NodeIdentity"]:
        """The identity named by the node config keys :data:`NODE_CONFIG_KEY`, :data:`NODE_CONFIG_ROSTER` and
        :data:`NODE_CONFIG_SIGNER`; None if none is set; ValueError if only some are, or they do not verify."""
        keys = (NODE_CONFIG_KEY, NODE_CONFIG_ROSTER, NODE_CONFIG_SIGNER)
        given = [k for k in keys if str(node_config.get(k, "") or "")]
        if not given:
            return None
        if len(given) != len(keys):
            missing = sorted(set(keys) - set(given))
            raise ValueError(f"node config sets {given} but not {missing}: a roster needs all three")
        return cls.from_files(*(str(node_config[k]) for k in keys))


def identity_from_directory(directory: str | os.PathLike[str], name: str) -> NodeIdentity:
    """Member ``name``'s identity from a roster directory (``roster.json``, ``operator.pub``, ``<name>.pem``)."""
    root = Path(directory)
    return NodeIdentity.from_files(root / f"{name}.pem", root / "roster.json", root / "operator.pub")


def identity_from_environment(ctxt: Any) -> Optional[NodeIdentity]:
    """For simulation, where nodes have no node config of their own: the identity of member ``node-<partition-id>``
    (or the node config's ``dp-node-name``) in the directory :data:`ROSTER_DIR_ENV` names; None when it is unset.
    The variable belongs to the process that runs the ClientApp (the client side), never to the server."""
    directory = os.environ.get(ROSTER_DIR_ENV, "")
    if not directory:
        return None
    config = getattr(ctxt, "node_config", {}) or {}
    name = str(config.get("dp-node-name") or f"node-{config.get('partition-id')}")
    return identity_from_directory(directory, name)


class InProcessRoster:
    """A roster of ``size`` fresh keys signed by a fresh operator key, handed to node ids as they first ask: for
    benchmarks and tests that play every node in one process. Every private key lives in this process, so it
    authenticates nothing against a server in the same process; it lets the protocol run as it does when
    deployed. Calling it with a Context gives that node's identity (a mod's ``identity`` argument)."""

    def __init__(self, size: int, *, federation: str = "in-process") -> None:
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be an integer >= 1, got {size!r}")
        operator = generate_signing_key()
        self._keys = [generate_signing_key() for _ in range(size)]
        self.roster = Roster.sign(
            federation, [(f"member-{i}", public_bytes(k)) for i, k in enumerate(self._keys)], operator
        )
        self.assigned: dict[int, NodeIdentity] = {}

    def identity_of(self, node: int) -> NodeIdentity:
        """Node ``node``'s identity (a fresh member key on its first call; ValueError when none is left)."""
        node = int(node)
        if node not in self.assigned:
            if len(self.assigned) >= len(self._keys):
                raise ValueError("the roster has no member key left")
            self.assigned[node] = NodeIdentity(self._keys[len(self.assigned)], self.roster)
        return self.assigned[node]

    def __call__(self, ctxt: Any) -> NodeIdentity:
        return self.identity_of(int(ctxt.node_id))


__all__ = [
    "InProcessRoster",
    "ROSTER_DIR_ENV",
    "identity_from_directory",
    "identity_from_environment",
    "NODE_CONFIG_KEY",
    "NODE_CONFIG_ROSTER",
    "NODE_CONFIG_SIGNER",
    "NodeIdentity",
    "ROSTER_FORMAT",
    "Roster",
    "advertisement",
    "decode_public",
    "encode_public",
    "generate_signing_key",
    "load_private_key",
    "load_public",
    "parse_public",
    "public_bytes",
    "save_private_key",
    "survivors_statement",
    "verify",
]
