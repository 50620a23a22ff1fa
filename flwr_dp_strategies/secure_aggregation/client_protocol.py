"""The client's side of one SecAgg+ round (Bell et al. 2020), on Flower's own crypto primitives.

Key agreement: ECDH on SECP384R1 + HKDF-SHA256 (``flwr.supercore.primitives.asymmetric``,
``flwr.common.secure_aggregation.crypto.symmetric_encryption.generate_shared_key``);
secret sharing: Shamir over the prime field GF(2^521 − 1) (:mod:`.shamir`: every secret one field
element, all polynomials evaluated in one pass; Flower's ``crypto.shamir`` shares 16-byte chunks over
GF(2^128) in pure Python, 150-350× slower at the protocol's sizes); authenticated encryption of the shares: Fernet
(``...symmetric_encryption.encrypt``). Nothing here is new crypto; the departures from Flower's
``secaggplus_mod`` are the mask generator (:mod:`.masks`: ChaCha20 under the full key, not a 32-bit
NumPy seed, streamed into the vector in place) and the sharing field. Key agreement is batched: each
private key and each peer's public key is parsed once per round (:func:`pairwise_keys`), and the
Fernet keys agreed at ``share-keys`` are kept in the state for ``collect``.

:class:`ClientRound` keeps its state in a ConfigRecord (``context.state``), so a
SuperNode that runs the ClientApp in a fresh process for every message keeps it.
What a client enforces, whatever the server does (each rule is what makes one attack impossible):

* the threshold: ``2t > h + c`` for its h share holders and the c colluders declared by the server
  or assumed by the client, whichever is larger (:func:`~.protocol.min_threshold`): no server can
  collect both secrets of a client, and c colluders never hold t shares;
* the graph: its neighbours are the ones the public ring of the view and the graph seed gives
  (:func:`~.protocol.ring_neighbours`), not a list the server picked;
* consistency: every share carries the sender's digest of the round (parameters, view, graph), checked
  by the receiver (:func:`~.protocol.view_digest`), so clients that exchange shares saw the same round;
* the unmask request: it names every peer the client holds shares of, each exactly once as alive or
  dropped, with at least t alive (itself among them), and is answered once.

It also refuses any instruction out of order (a stage other than the next one, another round),
repeated keys or node ids, and a ciphertext that is not addressed to it.

Against a server that replaces public keys (a man in the middle between clients) none of this
holds: that needs authenticated keys (a PKI), which Flower does not provide; see
``docs/distributed-dp.md`` for the threat model.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
from typing import Any, Callable, Optional

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, encrypt, generate_shared_key
from flwr.common.secure_aggregation.secaggplus_utils import share_keys_plaintext_concat, share_keys_plaintext_separate
from flwr.supercore.primitives.asymmetric import (
    bytes_to_private_key,
    bytes_to_public_key,
    generate_key_pairs,
    private_key_to_bytes,
    public_key_to_bytes,
)

from . import shamir
from .masks import add_prg_mask, check_bits, pack_bits, pairwise_sign, reduce_mod
from .protocol import (
    MASKED_KEY,
    MASKED_RECORD,
    RECORD,
    STAGE_KEY,
    STATE_RECORD,
    ProtocolError,
    Stage,
    distinct,
    field,
    honest_shares_bound,
    list_field,
    min_threshold,
    ring_neighbours_of,
    stage_of,
    view_digest,
)

DIGEST_BYTES = 32


def agreed_key(private_key: bytes, public_key: bytes) -> bytes:
    """The 32-byte key two nodes agree on (Flower's ECDH + HKDF; its base64 form decoded)."""
    return base64.urlsafe_b64decode(
        generate_shared_key(bytes_to_private_key(private_key), bytes_to_public_key(public_key))
    )


def private_scalar(private_key: bytes) -> bytes:
    """The 48-byte secret scalar of a SECP384R1 private key (PEM): what is Shamir-shared.

    The scalar (< 2^384) is one element of :mod:`.shamir`'s field, the 306-byte PEM would not be;
    :func:`private_key_from_scalar` rebuilds the key."""
    key = bytes_to_private_key(private_key)
    return key.private_numbers().private_value.to_bytes(48, "big")


def private_key_from_scalar(scalar: bytes) -> bytes:
    """The PEM private key of a SECP384R1 secret scalar (ValueError if it is not one)."""
    if len(scalar) != 48:
        raise ValueError("a SECP384R1 secret scalar has 48 bytes")
    return private_key_to_bytes(ec.derive_private_key(int.from_bytes(scalar, "big"), ec.SECP384R1()))


def fernet_key(private_key: bytes, public_key: bytes) -> bytes:
    """The Fernet key (base64) for the encrypted shares between two nodes."""
    return generate_shared_key(bytes_to_private_key(private_key), bytes_to_public_key(public_key))


def pairwise_keys(private_key: bytes, public_keys: list[bytes]) -> list[bytes]:
    """Flower's ECDH + HKDF key (base64, as ``generate_shared_key`` returns it) of ``private_key`` with each
    of ``public_keys``, the private key parsed once for all (parsing a PEM key costs about half an exchange)."""
    own = bytes_to_private_key(private_key)
    return [generate_shared_key(own, bytes_to_public_key(public)) for public in public_keys]


def mask_keys(private_key: bytes, public_keys: list[bytes]) -> list[bytes]:
    """:func:`agreed_key` of ``private_key`` with each of ``public_keys`` (batched: :func:`pairwise_keys`)."""
    return [base64.urlsafe_b64decode(key) for key in pairwise_keys(private_key, public_keys)]


class ClientRound:
    """One client's protocol state, read from and written back to a ConfigRecord."""

    def __init__(self, state: ConfigRecord, node_id: int, *, min_colluders: int = 0) -> None:
        self.state = state
        self.node_id = int(node_id)
        self.min_colluders = int(min_colluders)

    # ------------------------------------------------------------------ state helpers
    def _expect(self, stage: str, record: ConfigRecord) -> int:
        """The round number, after checking that ``stage`` follows the stored one in the same round."""
        server_round = field(record, "round", int)
        current = self.state.get("stage")
        previous = Stage.ORDER[Stage.ORDER.index(stage) - 1]
        if current != previous or self.state.get("round") != server_round:
            raise ProtocolError(
                f"stage {stage!r} of round {server_round} after stage {current!r} of round {self.state.get('round')!r}"
            )
        return server_round

    def _set(self, **values: Any) -> None:
        for key, value in values.items():
            self.state[key] = value

    def _shares(self, kind: str) -> dict[int, bytes]:
        return dict(zip(self.state.get(f"{kind}-owners", []), self.state.get(f"{kind}-shares", [])))

    def _store_share(self, kind: str, owner: int, share: bytes) -> None:
        owners = list(self.state.get(f"{kind}-owners", []))
        shares = list(self.state.get(f"{kind}-shares", []))
        owners.append(int(owner))
        shares.append(bytes(share))
        self._set(**{f"{kind}-owners": owners, f"{kind}-shares": shares})

    # ------------------------------------------------------------------ stages
    def setup(self, record: ConfigRecord) -> dict[str, Any]:
        """Stage 0: fresh key pairs for this round (any earlier round's state is dropped)."""
        server_round = field(record, "round", int)
        threshold = field(record, "threshold", int)
        bits = check_bits(field(record, "bits", int))
        declared = field(record, "colluders", int)
        if declared < 0:
            raise ProtocolError("field 'colluders' must be at least 0")
        colluders = max(declared, self.min_colluders)
        if threshold < 2 or threshold <= colluders:
            raise ProtocolError(
                f"field 'threshold' must be at least 2 and exceed the {colluders} colluders, got {threshold}"
            )
        self.state.clear()
        sk1, pk1 = generate_key_pairs()
        sk2, pk2 = generate_key_pairs()
        self._set(
            stage=Stage.SETUP,
            round=server_round,
            threshold=threshold,
            bits=bits,
            colluders=colluders,
            **{"declared-colluders": declared},
            sk1=private_key_to_bytes(sk1),
            pk1=public_key_to_bytes(pk1),
            sk2=private_key_to_bytes(sk2),
            pk2=public_key_to_bytes(pk2),
        )
        return {"pk1": self.state["pk1"], "pk2": self.state["pk2"]}

    def share_keys(self, record: ConfigRecord) -> dict[str, Any]:
        """Stage 1: check the view, the graph and the threshold; Shamir-share b_u and sk1 among the
        neighbours, one ciphertext per neighbour, each bound to the round's digest."""
        server_round = self._expect(Stage.SHARE_KEYS, record)
        nids = list_field(record, "nids", int)
        pk1s = list_field(record, "pk1s", bytes, length=len(nids))
        pk2s = list_field(record, "pk2s", bytes, length=len(nids))
        view = list_field(record, "view", int)
        graph_seed = field(record, "graph-seed", int)
        num_shares = field(record, "num-shares", int)
        distinct("nids", nids)
        distinct("view", view)
        distinct("public keys", pk1s + pk2s)
        if num_shares < 2:
            raise ProtocolError("field 'num-shares' must be at least 2")
        if self.node_id not in view:
            raise ProtocolError("the view does not hold this node")
        members = set(view)
        # one ring order for this node's neighbourhood and its neighbours' (their shares' points for it)
        hoods = ring_neighbours_of(view, num_shares, graph_seed, [self.node_id, *(u for u in nids if u in members)])
        expected = sorted(hoods[self.node_id])
        if sorted(nids) != expected:
            raise ProtocolError("the neighbour list is not this node's neighbourhood in the public graph")
        threshold, colluders = int(self.state["threshold"]), int(self.state["colluders"])
        if threshold < min_threshold(len(nids), colluders):
            raise ProtocolError(
                f"threshold {threshold} for {len(nids)} share holders and {colluders} colluders: "
                f"a server could rebuild both secrets of a client (needs 2t > h + c, "
                f"t >= {min_threshold(len(nids), colluders)})"
            )
        own = nids.index(self.node_id)
        if pk1s[own] != self.state["pk1"] or pk2s[own] != self.state["pk2"]:
            raise ProtocolError("the neighbour list holds other public keys for this node")
        digest = view_digest(
            server_round=server_round,
            threshold=threshold,
            bits=int(self.state["bits"]),
            colluders=int(self.state["declared-colluders"]),
            num_shares=num_shares,
            graph_seed=graph_seed,
            view=view,
        )
        bound = honest_shares_bound(len(view), threshold, colluders, complete=len(nids) == len(view))
        seed = os.urandom(32)
        # holder i of this node's (sorted) neighbourhood gets x = i + 1; the shares this node will receive
        # carry its position in each neighbour's neighbourhood, checked at collect
        shares = shamir.SCHEME.split([seed, private_scalar(self.state["sk1"])], threshold, len(nids))
        my_xs = [sorted(hoods[nid]).index(self.node_id) + 1 for nid in nids]
        others = [index for index, nid in enumerate(nids) if nid != self.node_id]
        agreed = dict(zip(others, pairwise_keys(self.state["sk2"], [pk2s[i] for i in others])))
        self._set(
            stage=Stage.SHARE_KEYS,
            seed=seed,
            digest=digest,
            **{
                "peer-nids": nids,
                "peer-pk1s": pk1s,
                "peer-xs": my_xs,
                "peer-fernet": [agreed.get(i, b"") for i in range(len(nids))],
                "honest-bound": bound,
            },
        )
        dsts, ciphertexts = [], []
        for index, nid in enumerate(nids):
            seed_share, sk1_share = shares[index]
            if nid == self.node_id:
                self._store_share("seed", nid, seed_share)
                self._store_share("sk1", nid, sk1_share)
                continue
            plaintext = digest + share_keys_plaintext_concat(self.node_id, nid, seed_share, sk1_share)
            dsts.append(nid)
            ciphertexts.append(encrypt(agreed[index], plaintext))
        return {"dsts": dsts, "ctxts": ciphertexts, "seed-hash": hashlib.sha256(seed).digest()}

    def collect(self, record: ConfigRecord, encode: Callable[[], np.ndarray]) -> np.ndarray:
        """Stage 2: store the neighbours' shares, then ``encode()`` (uint64 in [0, 2^b)) plus the masks."""
        self._expect(Stage.COLLECT, record)
        srcs = list_field(record, "srcs", int)
        ciphertexts = list_field(record, "ctxts", bytes, length=len(srcs))
        distinct("srcs", srcs)
        peers = list(self.state["peer-nids"])
        threshold = int(self.state["threshold"])
        if len(srcs) + 1 < threshold:
            raise ProtocolError(f"shares from {len(srcs)} neighbours, fewer than the threshold {threshold} - 1")
        for src, ciphertext in zip(srcs, ciphertexts):
            if src == self.node_id or src not in peers:
                raise ProtocolError(f"a ciphertext from node {src}, not a neighbour")
            try:
                plaintext = decrypt(self.state["peer-fernet"][peers.index(src)], ciphertext)
            except Exception as err:  # noqa: BLE001 - Fernet's InvalidToken and malformed tokens alike
                raise ProtocolError(f"the ciphertext from node {src} does not decrypt") from err
            if plaintext[:DIGEST_BYTES] != self.state["digest"]:
                raise ProtocolError(
                    f"node {src} shared its keys for another view of the round (parameters, node set or graph)"
                )
            actual_src, dst, seed_share, sk1_share = share_keys_plaintext_separate(plaintext[DIGEST_BYTES:])
            if actual_src != src or dst != self.node_id:
                raise ProtocolError(
                    f"the ciphertext forwarded as from node {src} to this node is from {actual_src} to {dst}"
                )
            expected_x = int(self.state["peer-xs"][peers.index(src)])
            try:
                xs = (shamir.SCHEME.x_of(seed_share), shamir.SCHEME.x_of(sk1_share))
            except ValueError as err:
                raise ProtocolError(f"node {src} sent a malformed share ({err})") from err
            if xs != (expected_x, expected_x):
                raise ProtocolError(f"node {src} sent shares at x = {xs}, not this node's point {expected_x}")
            self._store_share("seed", src, seed_share)
            self._store_share("sk1", src, sk1_share)
        vector = np.array(encode(), dtype=np.uint64, copy=True).ravel()
        bits = int(self.state["bits"])
        add_prg_mask(vector, self.state["seed"], +1)
        pk1s = list(self.state["peer-pk1s"])
        for src, key in zip(srcs, mask_keys(self.state["sk1"], [pk1s[peers.index(src)] for src in srcs])):
            add_prg_mask(vector, key, pairwise_sign(self.node_id, src))
        self._set(stage=Stage.COLLECT, included=srcs)
        return reduce_mod(vector, bits)

    def unmask(self, record: ConfigRecord) -> dict[str, Any]:
        """Stage 3: the shares of b_v for surviving v, of sk1_v for dropped v; the state is then closed."""
        self._expect(Stage.UNMASK, record)
        active = list_field(record, "active", int)
        dead = list_field(record, "dead", int)
        distinct("active", active)
        distinct("dead", dead)
        if set(active) & set(dead):
            raise ProtocolError("a node is named both as survivor and as dropped")
        threshold = int(self.state["threshold"])
        if len(active) < threshold:
            raise ProtocolError(f"{len(active)} survivors, fewer than the threshold {threshold}")
        if self.node_id not in active:
            raise ProtocolError("this node is not named as a survivor")
        held = set(int(n) for n in self.state.get("included", [])) | {self.node_id}
        if set(active) | set(dead) != held:
            raise ProtocolError("the request must name every peer this node holds shares of, as alive or dropped")
        seeds, sk1s = self._shares("seed"), self._shares("sk1")
        missing = [nid for nid in active if nid not in seeds] + [nid for nid in dead if nid not in sk1s]
        if missing:
            raise ProtocolError(f"no share held for nodes {sorted(missing)}")
        self.state.clear()  # one answer per round: a second unmask request finds no state
        self._set(stage=Stage.UNMASK, round=field(record, "round", int))
        return {"nids": active + dead, "shares": [seeds[n] for n in active] + [sk1s[n] for n in dead]}


def check_noise_floor(state: ConfigRecord, share: float, sensitivity: float, floor: float) -> float:
    r"""The noise multiplier of the smallest sum this client's rules let any server unmask,
    :math:`\sqrt{n_{\min}\,\sigma^2_{\mathrm{share}}}/\Delta`, with :math:`n_{\min}` = ``state["honest-bound"]``
    (:func:`~.protocol.honest_shares_bound`: honest shares in a sum a server lying about dropouts can
    unmask); ProtocolError if it is below ``floor`` (the client then sends nothing)."""
    honest = int(state["honest-bound"])
    implied = math.sqrt(honest * share) / sensitivity
    if implied < floor:
        raise ProtocolError(
            f"the server asks for noise shares whose smallest unmaskable sum ({honest} honest "
            f"client(s), threshold t = {state['threshold']}, {state['colluders']} colluders) has "
            f"noise multiplier {implied:.4g}, below this client's minimum {floor}"
        )
    return implied


def handle(
    state: ConfigRecord,
    node_id: int,
    stage: str,
    record: ConfigRecord,
    encode: Optional[Callable[[], np.ndarray]] = None,
    *,
    min_colluders: int = 0,
) -> tuple[dict[str, Any], Optional[np.ndarray]]:
    """Run ``stage`` for this node: (the reply's protocol fields, the masked vector for ``collect``);
    ``min_colluders``: the colluders this client assumes whatever the server declares."""
    client = ClientRound(state, node_id, min_colluders=min_colluders)
    if stage == Stage.SETUP:
        return client.setup(record), None
    if stage == Stage.SHARE_KEYS:
        return client.share_keys(record), None
    if stage == Stage.COLLECT:
        if encode is None:
            raise ValueError("the collect stage needs encode")
        return {}, client.collect(record, encode)
    if stage == Stage.UNMASK:
        return client.unmask(record), None
    raise ProtocolError(f"unknown stage {stage!r}")


def answer_message(
    msg: Message, ctxt: Context, encode: Callable[[ConfigRecord], np.ndarray], *, min_colluders: int = 0
) -> Message:
    """The reply to one protocol message: state kept in ``ctxt.state``, the stage run by :func:`handle`,
    and at ``collect`` the masked ``encode(state)`` (uint64 in [0, 2^b); ``state`` holds ``bits``,
    ``threshold``, ``colluders`` and ``honest-bound``, the fewest honest clients in any sum a server
    lying about dropouts can unmask: :func:`~.protocol.honest_shares_bound`) packed into
    :data:`MASKED_RECORD`. The reply holds the protocol records only."""
    stage = stage_of(msg.content)
    record = msg.content[RECORD]
    if STATE_RECORD not in ctxt.state:
        ctxt.state[STATE_RECORD] = ConfigRecord()
    state = ctxt.state[STATE_RECORD]
    node = int(msg.metadata.dst_node_id)
    out = RecordDict()
    if stage == Stage.COLLECT:
        fields, vector = handle(state, node, stage, record, lambda: encode(state), min_colluders=min_colluders)
        out[MASKED_RECORD] = ArrayRecord({MASKED_KEY: Array(pack_bits(vector, int(state["bits"])))})
    else:
        fields, _ = handle(state, node, stage, record, min_colluders=min_colluders)
    out[RECORD] = ConfigRecord({STAGE_KEY: stage, **fields})
    return Message(out, reply_to=msg)


__all__ = [
    "DIGEST_BYTES",
    "ClientRound",
    "agreed_key",
    "answer_message",
    "check_noise_floor",
    "fernet_key",
    "handle",
    "mask_keys",
    "pairwise_keys",
    "private_key_from_scalar",
    "private_scalar",
]
