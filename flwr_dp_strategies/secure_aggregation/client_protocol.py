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
What a client enforces, whatever the server does (each rule is what makes one attack impossible; the
active-server argument is in :func:`~.protocol.survivor_set_flaw`):

* one setup per round number (:data:`GUARD_RECORD` outlives the round): no second encoding of an update;
* the threshold: ``2t > h + c`` for its h share holders and the c colluders declared by the server
  or assumed by the client, whichever is larger (:func:`~.protocol.min_threshold`): no server can
  collect both secrets of a client, and c colluders never hold t shares;
* the graph: its neighbours are the ones the public ring of the view and the graph seed gives
  (:func:`~.protocol.ring_neighbours`), and the seed is the one committed at setup, before any key;
* authenticated peers: every view member's identity is in the client's operator-signed roster
  (:mod:`.identity`), distinct, and each neighbour's round keys are signed by its identity for this run,
  round and node id (no invented or substituted peer); keys are SECP384R1 points;
* consistency: every share carries the sender's digest of the round (run, parameters, n_h, view and its
  identities, graph), checked by the receiver (:func:`~.protocol.view_digest`);
* the survivor set: signed once, only under :func:`~.protocol.survivor_set_flaw`'s rule;
* the unmask: answered once, for the set it signed, only with the signatures on it that
  :func:`~.protocol.required_signers` names; seed shares for held peers in it, key shares for held peers
  outside it, never both.

It also refuses any instruction out of order (a stage other than the next one, another round),
repeated keys or node ids, and a ciphertext that is not addressed to it. Without a roster a client
signs with a fresh key per round and cannot tell invented peers from real ones: the noise floor then
counts its own share only (:func:`check_noise_floor`). ``docs/distributed-dp.md`` has the threat model.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
from typing import Any, Callable, Optional

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
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
    graph_commitment,
    list_field,
    min_threshold,
    ring_neighbours_of,
    required_signers,
    stage_of,
    survivor_set_flaw,
    view_digest,
)
from .identity import NodeIdentity, advertisement, generate_signing_key, public_bytes, survivors_statement, verify

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


def check_public_key(value: object, what: str) -> bytes:
    """``value`` if it is a PEM SECP384R1 public key (parsing checks the point is on the curve and not the
    identity), else ProtocolError naming ``what``."""
    if not isinstance(value, bytes):
        raise ProtocolError(f"{what} must be bytes")
    try:
        key = bytes_to_public_key(value)
    except Exception as err:  # noqa: BLE001 - any parse failure is malformed
        raise ProtocolError(f"{what} does not parse as a public key") from err
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != ec.SECP384R1.name:
        raise ProtocolError(f"{what} is not a SECP384R1 key")
    return value


GUARD_RECORD = "secure-aggregation-guard"
"""The part of a client's state that outlives a round: the last round it set up (one setup per round)."""


class ClientRound:
    """One client's protocol state, read from and written back to a ConfigRecord.

    ``identity``: the node's signing key and verified roster (:class:`~.identity.NodeIdentity`); with no
    roster the client signs with a fresh key each round and counts only its own noise share.
    ``run_id``: the run the messages belong to (bound into every signature and the digest); ``guard``: the
    record that remembers the last round this client set up, across rounds."""

    def __init__(
        self,
        state: ConfigRecord,
        node_id: int,
        *,
        min_colluders: int = 0,
        identity: Optional[NodeIdentity] = None,
        run_id: int = 0,
        guard: Optional[ConfigRecord] = None,
    ) -> None:
        self.state = state
        self.node_id = int(node_id)
        self.min_colluders = int(min_colluders)
        self.identity = identity
        self.run_id = int(run_id)
        self.guard = ConfigRecord() if guard is None else guard

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

    def _signer(self) -> Ed25519PrivateKey:
        """The key this node advertised with at setup: its long-term key, or this round's own."""
        if self.state["id-sk"]:
            return Ed25519PrivateKey.from_private_bytes(bytes(self.state["id-sk"]))
        if self.identity is None or self.identity.public != self.state["id-pk"]:
            raise ProtocolError("this node's identity changed within the round")
        return self.identity.signing_key

    # ------------------------------------------------------------------ stages
    def setup(self, record: ConfigRecord) -> dict[str, Any]:
        """Stage 0: fresh key pairs for this round, advertised under this node's signature (once per round)."""
        server_round = field(record, "round", int)
        threshold = field(record, "threshold", int)
        bits = check_bits(field(record, "bits", int))
        declared = field(record, "colluders", int)
        commitment = field(record, "graph-commit", bytes)
        if len(commitment) != 32:
            raise ProtocolError("field 'graph-commit' must be 32 bytes")
        if declared < 0:
            raise ProtocolError("field 'colluders' must be at least 0")
        colluders = max(declared, self.min_colluders)
        if threshold < 2 or threshold <= colluders:
            raise ProtocolError(
                f"field 'threshold' must be at least 2 and exceed the {colluders} colluders, got {threshold}"
            )
        last = self.guard.get("last-round")
        if last is not None and server_round <= int(last):
            raise ProtocolError(
                f"setup of round {server_round} after this client set up round {last}: one setup per round "
                "(a second would give a server two encodings of one update)"
            )
        self.guard["last-round"] = server_round
        self.state.clear()
        sk1, pk1 = generate_key_pairs()
        sk2, pk2 = generate_key_pairs()
        long_term = self.identity is not None and self.identity.roster is not None
        signer = self.identity.signing_key if long_term else generate_signing_key()
        pk1_bytes, pk2_bytes = public_key_to_bytes(pk1), public_key_to_bytes(pk2)
        ad = advertisement(
            run_id=self.run_id, server_round=server_round, node_id=self.node_id, pk1=pk1_bytes, pk2=pk2_bytes
        )
        self._set(
            stage=Stage.SETUP,
            round=server_round,
            threshold=threshold,
            bits=bits,
            colluders=colluders,
            **{"declared-colluders": declared, "graph-commit": commitment},
            sk1=private_key_to_bytes(sk1),
            pk1=pk1_bytes,
            sk2=private_key_to_bytes(sk2),
            pk2=pk2_bytes,
            # a roster-less client's key lives for this round only; a long-term key is never copied into the state
            **{"id-sk": b"" if long_term else signer.private_bytes_raw(), "id-pk": public_bytes(signer)},
        )
        return {"pk1": pk1_bytes, "pk2": pk2_bytes, "identity": public_bytes(signer), "ad-sig": signer.sign(ad)}

    def share_keys(self, record: ConfigRecord) -> dict[str, Any]:
        """Stage 1: check the view, the graph, the threshold and every neighbour's signed key advertisement;
        Shamir-share b_u and sk1 among the neighbours, one ciphertext per neighbour, bound to the round's digest."""
        server_round = self._expect(Stage.SHARE_KEYS, record)
        nids = list_field(record, "nids", int)
        pk1s = list_field(record, "pk1s", bytes, length=len(nids))
        pk2s = list_field(record, "pk2s", bytes, length=len(nids))
        sigs = list_field(record, "ad-sigs", bytes, length=len(nids))
        view = list_field(record, "view", int)
        view_ids = list_field(record, "view-ids", bytes, length=len(view))
        graph_seed = field(record, "graph-seed", int)
        num_shares = field(record, "num-shares", int)
        honest = field(record, "honest", int)
        distinct("nids", nids)
        distinct("view", view)
        distinct("public keys", pk1s + pk2s)
        distinct("view-ids", view_ids)
        if graph_commitment(graph_seed) != self.state["graph-commit"]:
            raise ProtocolError("the graph seed is not the one committed to at setup")
        if num_shares < 2:
            raise ProtocolError("field 'num-shares' must be at least 2")
        if honest < 1:
            raise ProtocolError("field 'honest' must be at least 1")
        if self.node_id not in view:
            raise ProtocolError("the view does not hold this node")
        members = set(view)
        identity_of = dict(zip(view, view_ids))
        if not set(nids) <= members:
            raise ProtocolError("the neighbour list names nodes outside the view")
        ids = [identity_of[n] for n in nids]
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
        if pk1s[own] != self.state["pk1"] or pk2s[own] != self.state["pk2"] or ids[own] != self.state["id-pk"]:
            raise ProtocolError("the neighbour list holds other keys for this node")
        roster = self.identity.roster if self.identity is not None else None
        if roster is not None:
            admitted = roster.keys()
            strangers = [n for n, i in zip(view, view_ids) if i not in admitted]
            if strangers:
                raise ProtocolError(
                    f"nodes {strangers[:5]} of the view are not in this client's roster (invented peers)"
                )
        for nid, pk1, pk2, identity, sig in zip(nids, pk1s, pk2s, ids, sigs):
            check_public_key(pk1, f"node {nid}'s pk1")
            check_public_key(pk2, f"node {nid}'s pk2")
            ad = advertisement(run_id=self.run_id, server_round=server_round, node_id=nid, pk1=pk1, pk2=pk2)
            if not verify(identity, sig, ad):
                raise ProtocolError(f"node {nid}'s key advertisement is not signed by its identity for this round")
        digest = view_digest(
            run_id=self.run_id,
            honest=honest,
            server_round=server_round,
            threshold=threshold,
            bits=int(self.state["bits"]),
            colluders=int(self.state["declared-colluders"]),
            num_shares=num_shares,
            graph_seed=graph_seed,
            view=view,
            identities=view_ids,
        )
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
            honest=honest,
            authenticated=roster is not None,
            **{"num-shares": num_shares, "graph-seed": graph_seed},
            view=view,
            **{
                "view-ids": view_ids,
                "peer-nids": nids,
                "peer-pk1s": pk1s,
                "peer-xs": my_xs,
                "peer-fernet": [agreed.get(i, b"") for i in range(len(nids))],
                # the fewest honest shares in a sum holding this client that its rules let a server unmask
                "honest-bound": honest if roster is not None else 1,
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
        for src in srcs:
            if src == self.node_id or src not in peers:
                raise ProtocolError(f"a ciphertext from node {src}, not a neighbour")
        for src, ciphertext in zip(srcs, ciphertexts):
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

    def consistency(self, record: ConfigRecord) -> dict[str, Any]:
        """Stage 3: sign the survivor set S the server names, once, if S lies in the view, holds at least t nodes
        and passes :func:`~.protocol.survivor_set_flaw` (this node in it, masked with every neighbour in it,
        |S| − c ≥ n_h, on a ring fewer than k/2 − c neighbours outside it); S is kept for the unmask.
        Without a roster n_h is not relied on (the client's own share carries its floor)."""
        server_round = self._expect(Stage.CONSISTENCY, record)
        survivors = list_field(record, "survivors", int)
        distinct("survivors", survivors)
        members = set(survivors)
        threshold = int(self.state["threshold"])
        view = list(self.state["view"])
        if not members <= set(view):
            raise ProtocolError("the survivor set names nodes outside the round's view")
        if len(members) < threshold:
            raise ProtocolError(f"{len(members)} survivors, fewer than the threshold {threshold}")
        flaw = survivor_set_flaw(
            self.node_id,
            members,
            neighbourhood=self.state["peer-nids"],
            masked_with=self.state.get("included", []),
            view_size=len(view),
            num_shares=int(self.state["num-shares"]),
            colluders=int(self.state["colluders"]),
            honest=int(self.state["honest"]) if self.state.get("authenticated") else 1,
        )
        if flaw is not None:
            raise ProtocolError(f"this node does not sign the survivor set: {flaw}")
        signature = self._signer().sign(survivors_statement(self.state["digest"], survivors))
        self._set(stage=Stage.CONSISTENCY, round=server_round, survivors=sorted(members))
        return {"signature": signature}

    def unmask(self, record: ConfigRecord) -> dict[str, Any]:
        """Stage 4: for the survivor set this node signed, and only with the signature on it of every member
        :func:`~.protocol.required_signers` names (its held peers among them), the shares of b_v for every held v
        in it and of sk1_v for every held v outside it; the state is then closed."""
        self._expect(Stage.UNMASK, record)
        signers = list_field(record, "signers", int)
        signatures = list_field(record, "signatures", bytes, length=len(signers))
        distinct("signers", signers)
        survivors = [int(n) for n in self.state["survivors"]]
        members = set(survivors)
        held = [int(n) for n in self.state.get("included", [])]
        alive = sorted(n for n in held if n in members)
        dead = sorted(n for n in held if n not in members)
        given = dict(zip(signers, signatures))
        identity_of = dict(zip(self.state["view"], self.state["view-ids"]))
        statement = survivors_statement(self.state["digest"], survivors)
        needed = required_signers(
            self.node_id,
            survivors,
            view=self.state["view"],
            num_shares=int(self.state["num-shares"]),
            graph_seed=int(self.state["graph-seed"]),
        )
        for node in needed:
            if not verify(identity_of[node], given.get(node), statement):
                raise ProtocolError(f"no valid signature of node {node} on the survivor set this node signed")
        seeds, sk1s = self._shares("seed"), self._shares("sk1")
        active = [self.node_id, *alive]
        self.state.clear()  # one answer per round: a second unmask request finds no state
        self._set(stage=Stage.UNMASK, round=field(record, "round", int))
        return {"nids": active + dead, "shares": [seeds[n] for n in active] + [sk1s[n] for n in dead]}


FLOOR_RTOL = 1e-9
"""Relative slack of the floor check: a server calibrated for exactly z_min (μ = (z Δ)², split and recombined in
floating point) lands within a few ulps of it."""


def check_noise_floor(state: ConfigRecord, share: float, sensitivity: float, floor: float) -> float:
    r"""The noise multiplier of the smallest sum this client's rules let any server unmask,
    :math:`\sqrt{n_{\min}\,\sigma^2_{\mathrm{share}}}/\Delta`, with :math:`n_{\min}` = ``state["honest-bound"]``:
    the round's n_h when the peers are authenticated by a roster (the client signs a survivor set only if a
    sum holding it then holds n_h honest shares, :func:`~.protocol.survivor_set_flaw`), 1 without one
    (invented peers could surround it); ProtocolError if it is below ``floor`` (the client then sends nothing).

    Why the floor holds for the whole sum: every honest member x of a sum a server can unmask checked its own
    floor, :math:`\sigma_x^2 \ge (z_{\min}\Delta)^2 / n_h`, and the sum holds at least n_h of them, so its
    honest noise has variance at least :math:`(z_{\min}\Delta)^2`."""
    honest = int(state["honest-bound"])
    implied = math.sqrt(honest * share) / sensitivity
    if not implied >= floor * (1.0 - FLOOR_RTOL):
        raise ProtocolError(
            f"the server asks for noise shares whose smallest unmaskable sum ({honest} honest "
            f"client(s), threshold t = {state['threshold']}, {state['colluders']} colluders"
            f"{'' if state.get('authenticated') else ', peers not authenticated by a roster'}) has "
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
    identity: Optional[NodeIdentity] = None,
    run_id: int = 0,
    guard: Optional[ConfigRecord] = None,
) -> tuple[dict[str, Any], Optional[np.ndarray]]:
    """Run ``stage`` for this node: (the reply's protocol fields, the masked vector for ``collect``);
    ``min_colluders``: the colluders this client assumes whatever the server declares."""
    client = ClientRound(state, node_id, min_colluders=min_colluders, identity=identity, run_id=run_id, guard=guard)
    if stage == Stage.SETUP:
        return client.setup(record), None
    if stage == Stage.SHARE_KEYS:
        return client.share_keys(record), None
    if stage == Stage.COLLECT:
        if encode is None:
            raise ValueError("the collect stage needs encode")
        return {}, client.collect(record, encode)
    if stage == Stage.CONSISTENCY:
        return client.consistency(record), None
    if stage == Stage.UNMASK:
        return client.unmask(record), None
    raise ProtocolError(f"unknown stage {stage!r}")


def answer_message(
    msg: Message,
    ctxt: Context,
    encode: Callable[[ConfigRecord], np.ndarray],
    *,
    min_colluders: int = 0,
    identity: Optional[NodeIdentity] = None,
) -> Message:
    """The reply to one protocol message: state kept in ``ctxt.state``, the stage run by :func:`handle`,
    and at ``collect`` the masked ``encode(state)`` (uint64 in [0, 2^b); ``state`` holds ``bits``,
    ``threshold``, ``colluders`` and ``honest-bound``, the fewest honest shares in any sum holding this
    client that a server can unmask under its rules) packed into :data:`MASKED_RECORD`. The reply holds the
    protocol records only. ``identity``: the node's signing key and roster (None: no roster)."""
    stage = stage_of(msg.content)
    record = msg.content[RECORD]
    for name in (STATE_RECORD, GUARD_RECORD):
        if name not in ctxt.state:
            ctxt.state[name] = ConfigRecord()
    state, guard = ctxt.state[STATE_RECORD], ctxt.state[GUARD_RECORD]
    node = int(msg.metadata.dst_node_id)
    options = {"min_colluders": min_colluders, "identity": identity, "run_id": int(msg.metadata.run_id), "guard": guard}
    out = RecordDict()
    if stage == Stage.COLLECT:
        fields, vector = handle(state, node, stage, record, lambda: encode(state), **options)
        out[MASKED_RECORD] = ArrayRecord({MASKED_KEY: Array(pack_bits(vector, int(state["bits"])))})
    else:
        fields, _ = handle(state, node, stage, record, **options)
    out[RECORD] = ConfigRecord({STAGE_KEY: stage, **fields})
    return Message(out, reply_to=msg)


__all__ = [
    "DIGEST_BYTES",
    "GUARD_RECORD",
    "ClientRound",
    "check_public_key",
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
