"""``flwr-dp``: the package's command line: ledger files read without Python, and the node roster.

``flwr-dp ledger show PATH [--key-env VAR | --key-file FILE] [--high-water FILE] [--json]``
verifies the file as the library does (strict canonical JSON, the checksum, or the
HMAC under the key; every ledger rebuilt and validated) and, when a high-water
record is found (``--high-water``, else ``PATH.hwm`` beside the file), that the file
is the latest save it records. It then prints, for every ledger in the file, ε per
client at the ledger's δ, the worst case, the rounds, the mechanisms (each distinct
event, its label and how many times it was booked) and the neighbouring relation,
as a table or (``--json``) as one JSON object.

The key is read from ``$FLWR_DP_LEDGER_KEY`` by default (as the library does), from
the variable ``--key-env`` names, or from ``--key-file`` (its bytes, one trailing
newline removed).

The roster (:mod:`flwr_dp_strategies.secure_aggregation.identity`) is how a SecAgg+ client tells a
real peer from a Sybil the server invented. The federation's operator holds an Ed25519 signing key
and signs the list of admitted nodes (a name and a long-term Ed25519 public key each); every
SuperNode gets its own private key, the roster and the operator's public key out of band, through
its node config (``dp-signing-key``, ``dp-roster``, ``dp-roster-signer``), never through the server.

* ``flwr-dp roster keygen --out KEY.pem [--public-out FILE]`` writes a fresh Ed25519 private key
  (PKCS#8 PEM, mode 0600; an existing file is never overwritten) and prints its public key
  (URL-safe base64 of the 32 raw bytes) on stdout, and into ``--public-out`` if given.
* ``flwr-dp roster sign --signer OPERATOR.pem --federation NAME --member NAME=PUBKEY_OR_FILE ...
  [--members-file FILE] --out ROSTER.json [--force]`` signs a roster with the operator's key.
  A member's key is base64 text or the path of a file holding it; ``--members-file`` holds lines
  ``NAME=PUBKEY`` (blank lines and ``#`` comments skipped; its members come first). A name or key
  given twice is refused. ``--out`` is not replaced unless ``--force`` (and never by the signer's
  own key file).
* ``flwr-dp roster verify ROSTER.json --signer PUBKEY_OR_FILE [--json]`` verifies the roster against
  the operator key the caller trusts (base64 or a file holding it) and prints the federation, the
  number of members and each member's name and key, as a table or as one JSON object. A base64 key
  may start with ``-``: give it as ``--signer=KEY``.
* ``flwr-dp roster demo --nodes N --out DIR [--federation NAME]`` (simulations and tests) creates
  ``DIR`` with ``operator.pem``, ``operator.pub``, ``node-<i>.pem`` for ``i`` in ``0..N-1`` (members
  ``node-<i>``) and ``roster.json`` signed by the operator (:func:`write_demo_roster`).

What the roster signer is trusted for: the operator vouches that distinct roster entries are
distinct parties (one party, one key), of whom at most a client's assumed number of colluders work
with the server. The server is trusted for nothing the roster covers: it cannot add a peer, swap a
peer's key or replay another round's keys, since each peer's round keys must be signed by a
roster member's key. Whoever holds the operator's private key can admit anyone: keep it off the
server and off the nodes. A roster signed by any key other than the one the node was given is
refused.

Exit status: 0 verified (or written) and printed; 1 refused: a file is missing, unreadable,
tampered with, not authenticated by the key, signed by another roster signer, older than its
high-water record, or would be overwritten (the message says which); 2 a usage error.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from .privacy.accounting.ledger import PrivacyLedger
from .privacy.accounting.ledger_file import (
    HIGH_WATER_SUFFIX,
    KEY_ENV,
    LedgerFileError,
    check_high_water,
    decode_high_water,
    parse_body,
    read_bytes,
    read_envelope,
)
from .secure_aggregation.identity import (
    Roster,
    decode_public,
    encode_public,
    generate_signing_key,
    load_private_key,
    public_bytes,
    save_private_key,
)

__all__ = ["main", "show", "write_demo_roster"]

_HIGH_WATER_MAX_BYTES = 8192
_ROSTER_MAX_BYTES = 64 * 1024 * 1024


def _key(args: argparse.Namespace) -> Optional[bytes]:
    """The HMAC key the options name (None: the file is read with plain SHA-256)."""
    if args.key_file is not None:
        try:
            with open(args.key_file, "rb") as handle:
                raw = handle.read()
        except OSError as err:
            raise LedgerFileError(args.key_file, f"(the key file) cannot be read ({err.strerror or err})") from err
        raw = raw[:-1] if raw.endswith(b"\n") else raw
        if not raw:
            raise LedgerFileError(args.key_file, "(the key file) is empty")
        return raw
    variable = args.key_env or KEY_ENV
    value = os.environ.get(variable)
    if args.key_env is not None and not value:
        raise ValueError(f"--key-env: the environment variable {variable} is not set")
    return value.encode() if value else None


def _number(value: float) -> Any:
    """A float JSON can hold: ∞ as the string "inf"."""
    return value if math.isfinite(value) else "inf"


def _mechanisms(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Each distinct event of a ledger body: its description, label and number of bookings."""
    counts: dict[str, int] = {key: len(rounds) for key, rounds in body["central"].items()}
    for bookings in body["clients"].values():
        for key, rounds in bookings.items():
            counts[key] = counts.get(key, 0) + len(rounds)
    return [
        {"event": body["events"][key], "label": body["labels"].get(key, ""), "bookings": counts.get(key, 0)}
        for key in body["events"]
    ]


def _describe(name: str, text: str) -> dict[str, Any]:
    body = parse_body(text)
    ledger = PrivacyLedger.from_json(text)
    worst = ledger.report()
    order = sorted(ledger.clients, key=lambda c: (not c.isdigit(), int(c) if c.isdigit() else 0, c))
    clients = {client: _number(ledger.epsilon(client)) for client in order}
    rounds = sorted(set(ledger.rounds()).union(*(ledger.rounds(c) for c in ledger.clients)))
    return {
        "name": name,
        "neighboring_relation": ledger.neighboring_relation,
        "delta": ledger.target_delta,
        "accounting": ledger.accounting,
        "max_epsilon": ledger.max_epsilon,
        "worst_case": {"epsilon": _number(worst.epsilon), "client": worst.client},
        "rounds": rounds,
        "clients": clients,
        "mechanisms": _mechanisms(body),
    }


def show(path: str, key: Optional[bytes], high_water_path: Optional[str]) -> dict[str, Any]:
    """Everything ``ledger show`` prints, after verifying the file; :class:`LedgerFileError` if it does not verify."""
    envelope = read_envelope(path, key=key)
    if envelope is None:
        raise LedgerFileError(path, "does not exist")
    real = os.path.realpath(os.path.abspath(path))
    mark_path = high_water_path if high_water_path is not None else real + HIGH_WATER_SUFFIX
    freshness = "not checked: the file has no run binding (format 1)"
    if envelope.run is not None:
        data = read_bytes(mark_path, _HIGH_WATER_MAX_BYTES)
        if data is None:
            if high_water_path is not None:
                raise LedgerFileError(mark_path, "(the high-water record) does not exist")
            freshness = f"not checked: no high-water record at {mark_path}"
        else:
            check_high_water(real, envelope, mark_path, decode_high_water(data, mark_path, key))
            freshness = f"latest save recorded by {mark_path}"
    ledgers = []
    for name, text in envelope.bodies.items():
        try:
            ledgers.append(_describe(name, text))
        except LedgerFileError:
            raise
        except Exception as err:  # noqa: BLE001 - any failure to rebuild means the content is invalid
            raise LedgerFileError(path, f"ledger {name!r} is not a valid ledger: {err}") from err
    return {
        "path": real,
        "format": envelope.format,
        "verified": "hmac-sha256 (authenticated with the key)"
        if key is not None
        else "sha256 (integrity only: anyone who can write the file can recompute it)",
        "run": envelope.run,
        "written_to": envelope.path,
        "generation": envelope.generation,
        "freshness": freshness,
        "state": envelope.state,
        "ledgers": ledgers,
    }


def _eps(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _rounds_text(rounds: list[int]) -> str:
    if not rounds:
        return "none"
    return f"{len(rounds)} ({rounds[0]}..{rounds[-1]})" if len(rounds) > 1 else f"1 ({rounds[0]})"


def _table(report: dict[str, Any]) -> str:
    lines = [f"ledger file  {report['path']}", f"format       {report['format']}", f"verified     {report['verified']}"]
    if report["run"] is not None:
        lines.append(
            f"run          {report['run']}, generation {report['generation']}, written to {report['written_to']}"
        )
    lines.append(f"freshness    {report['freshness']}")
    for name, state in report["state"].items():
        lines.append(f"state        {name}: {json.dumps(state, sort_keys=True)}")
    for ledger in report["ledgers"]:
        worst = ledger["worst_case"]
        lines += [
            "",
            f"ledger {ledger['name']!r}: relation {ledger['neighboring_relation']}, delta "
            f"{ledger['delta']:g}, accounting {ledger['accounting']}, budget "
            f"{'none' if ledger['max_epsilon'] is None else ledger['max_epsilon']}",
            f"  worst case   epsilon {_eps(worst['epsilon'])}"
            + (f" (client {worst['client']})" if worst["client"] is not None else ""),
            f"  rounds       {_rounds_text(ledger['rounds'])}",
            "  mechanisms",
        ]
        for mechanism in ledger["mechanisms"]:
            lines.append(
                f"    {mechanism['bookings']:>6} x {json.dumps(mechanism['event'], sort_keys=True)}"
                + (f"  [{mechanism['label']}]" if mechanism["label"] else "")
            )
        if ledger["clients"]:
            width = max(6, *(len(c) for c in ledger["clients"]))
            lines.append(f"  {'client':<{width}}  epsilon")
            lines += [f"  {client:<{width}}  {_eps(eps)}" for client, eps in ledger["clients"].items()]
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------- roster
class _UsageError(Exception):
    """A usage error found after parsing (exit status 2, with the subcommand's usage)."""


def read_public_key(value: str, what: str) -> bytes:
    """A raw Ed25519 public key given as URL-safe base64 text or as the path of a file holding it (as
    :func:`~flwr_dp_strategies.secure_aggregation.identity.load_public` reads the roster signer; a file is
    tried first); ValueError naming ``what`` otherwise."""
    text = os.fspath(value)
    candidate = Path(text)
    if len(text) < 256 and candidate.is_file():
        try:
            content = candidate.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"{what}: cannot read {text} ({err})") from err
        if content.lstrip().startswith("-----BEGIN"):
            raise ValueError(
                f"{what}: {text} is a PEM file, not a base64 public key (a private key? give the public key that "
                "`flwr-dp roster keygen` printed or wrote with --public-out)"
            )
        return decode_public(content, f"{what} (the file {text})")
    try:
        return decode_public(text, what)
    except ValueError as err:
        raise ValueError(
            f"{what}: {text!r} is neither a readable file nor a base64 Ed25519 public key ({err})"
        ) from err


def _member_spec(value: str) -> tuple[str, str]:
    """``NAME=PUBKEY_OR_FILE`` split at its first ``=`` (argparse type: a usage error if malformed)."""
    name, sep, key = value.partition("=")
    if not sep or not name.strip() or not key.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=PUBKEY_OR_FILE, got {value!r}")
    return name.strip(), key.strip()


def _members_file(path: str) -> list[tuple[str, bytes]]:
    """The ``NAME=PUBKEY`` lines of a members file (blank lines and ``#`` comments skipped)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: (the members file) cannot be read ({err})") from err
    members = []
    for number, line in enumerate(lines, start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, key = line.partition("=")
        if not sep or not name.strip() or not key.strip():
            raise ValueError(f"{path}:{number}: expected NAME=PUBKEY, got {line!r}")
        name = name.strip()
        members.append((name, decode_public(key.strip(), f"{path}:{number}: the public key of member {name!r}")))
    return members


def _check_distinct(members: Sequence[tuple[str, bytes]]) -> None:
    """ValueError naming the first repeated name or key (one party, one entry, one key)."""
    names: dict[str, int] = {}
    keys: dict[bytes, str] = {}
    for name, key in members:
        if name in names:
            raise ValueError(f"member {name!r} is given twice (member names must be distinct)")
        names[name] = 1
        if key in keys:
            raise ValueError(
                f"members {keys[key]!r} and {name!r} have the same public key (one party, one key: "
                "distinct roster entries must be distinct parties)"
            )
        keys[key] = name


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _write_new(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to a file that must not exist yet."""
    try:
        with open(path, "x", encoding="utf-8") as handle:
            handle.write(text)
    except FileExistsError as err:
        raise ValueError(f"{os.fspath(path)} exists: refusing to overwrite it") from err


def _replace(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file beside it, then a rename)."""
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "x", encoding="utf-8") as handle:
        handle.write(text)
    try:
        os.replace(temporary, path)
    except OSError:
        os.unlink(temporary)
        raise


def _keygen(args: argparse.Namespace) -> int:
    out, public_out = args.out, args.public_out
    if public_out is not None and os.path.abspath(public_out) == os.path.abspath(out):
        raise _UsageError("--public-out must name another file than --out")
    for path, what in ((out, "the key file"), (public_out, "the public key file")):
        if path is not None and os.path.lexists(path):
            raise ValueError(f"{path} ({what}) exists: refusing to overwrite it")
    key = generate_signing_key()
    try:
        save_private_key(key, out)
    except FileExistsError as err:
        raise ValueError(f"{out} (the key file) exists: refusing to overwrite it") from err
    public = encode_public(public_bytes(key))
    if public_out is not None:
        _write_new(public_out, public + "\n")
    print(public)
    return 0


def _sign(args: argparse.Namespace) -> int:
    if not args.member and args.members_file is None:
        raise _UsageError("give the members: --member NAME=PUBKEY_OR_FILE (repeatable) and/or --members-file FILE")
    inputs = [
        args.signer,
        *([args.members_file] if args.members_file is not None else []),
        *(k for _, k in args.member),
    ]
    if any(_same_file(args.out, path) for path in inputs):
        raise ValueError(f"{args.out}: --out names an input file; refusing to overwrite it")
    if os.path.lexists(args.out) and not args.force:
        raise ValueError(f"{args.out} exists: refusing to overwrite it (--force replaces it)")
    signer = load_private_key(args.signer)
    members = _members_file(args.members_file) if args.members_file is not None else []
    members += [(name, read_public_key(key, f"the public key of member {name!r}")) for name, key in args.member]
    _check_distinct(members)
    roster = Roster.sign(args.federation, members, signer)
    if args.force:
        _replace(args.out, roster.to_json())
    else:
        _write_new(args.out, roster.to_json())
    print(
        f"signed roster {args.out}: federation {roster.federation!r}, {len(roster.members)} member(s), "
        f"signer {encode_public(roster.signer)}"
    )
    return 0


def verify_roster(path: str, trusted_signer: bytes) -> Roster:
    """The roster file at ``path``, verified against ``trusted_signer`` (ValueError naming the file otherwise)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(_ROSTER_MAX_BYTES + 1)
    except OSError as err:
        raise ValueError(f"{path}: cannot be read ({err.strerror or err})") from err
    if len(data) > _ROSTER_MAX_BYTES:
        raise ValueError(f"{path}: larger than {_ROSTER_MAX_BYTES} bytes, not a roster file")
    try:
        return Roster.from_json(data.decode("utf-8")).verify(trusted_signer)
    except ValueError as err:  # UnicodeDecodeError included
        raise ValueError(f"{path}: refused: {err}") from err


def _printable(name: str) -> str:
    return name if name.isprintable() and name.strip() == name and name else json.dumps(name)


def _verify(args: argparse.Namespace) -> int:
    trusted = read_public_key(args.signer, "--signer (the trusted roster signer)")
    roster = verify_roster(args.roster, trusted)
    report = {
        "path": os.path.realpath(os.path.abspath(args.roster)),
        "verified": True,
        "federation": roster.federation,
        "signer": encode_public(roster.signer),
        "member_count": len(roster.members),
        "members": [{"name": name, "public_key": encode_public(key)} for name, key in roster.members],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    names = [_printable(member["name"]) for member in report["members"]]
    width = max(4, *(len(name) for name in names))
    lines = [
        f"roster      {report['path']}",
        f"verified    signed by the trusted roster signer {report['signer']}",
        f"federation  {_printable(roster.federation)}",
        f"members     {report['member_count']}",
        f"  {'name':<{width}}  public key",
    ]
    lines += [f"  {name:<{width}}  {member['public_key']}" for name, member in zip(names, report["members"])]
    print("\n".join(lines))
    return 0


def write_demo_roster(directory: str | os.PathLike[str], num_nodes: int, federation: str = "demo") -> Path:
    """A demo federation in ``directory`` (simulations and tests): the operator's key ``operator.pem`` and public
    key ``operator.pub``, one key ``node-<i>.pem`` per node ``i`` in ``0..num_nodes-1`` (roster member
    ``node-<i>``) and ``roster.json`` signed by the operator, written last; the roster's path.

    ``directory`` is created (mode 0700) if missing and must otherwise be an empty directory (FileExistsError);
    every private key file has mode 0600. A node's config then names ``dp-signing-key=<dir>/node-<i>.pem``,
    ``dp-roster=<dir>/roster.json`` and ``dp-roster-signer=<dir>/operator.pub``. Nothing here is for production:
    the operator's key lies beside the nodes' keys."""
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"num_nodes must be a positive integer, got {num_nodes!r}")
    root = Path(directory)
    if root.exists() or root.is_symlink():
        if not root.is_dir():
            raise FileExistsError(f"{root} exists and is not a directory")
        if any(root.iterdir()):
            raise FileExistsError(f"{root} exists and is not empty: refusing to write a demo roster into it")
    else:
        root.mkdir(parents=True, mode=0o700)
    operator = generate_signing_key()
    save_private_key(operator, root / "operator.pem")
    _write_new(root / "operator.pub", encode_public(public_bytes(operator)) + "\n")
    members = []
    for index in range(num_nodes):
        key = generate_signing_key()
        save_private_key(key, root / f"node-{index}.pem")
        members.append((f"node-{index}", public_bytes(key)))
    roster_path = root / "roster.json"
    _write_new(roster_path, Roster.sign(federation, members, operator).to_json())
    return roster_path


def _demo(args: argparse.Namespace) -> int:
    if args.nodes < 1:
        raise _UsageError(f"--nodes must be at least 1, got {args.nodes}")
    roster = write_demo_roster(args.out, args.nodes, args.federation)
    directory = roster.parent
    print(
        f"wrote {directory}: operator.pem, operator.pub, node-0.pem .. node-{args.nodes - 1}.pem and roster.json "
        f"(federation {args.federation!r}, {args.nodes} member(s))\n"
        f"node i's config: dp-signing-key={directory / 'node-<i>.pem'} dp-roster={roster} "
        f"dp-roster-signer={directory / 'operator.pub'}"
    )
    return 0


# ---------------------------------------------------------------------------------------------- main
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flwr-dp", description="flwr-dp-strategies command line")
    commands = parser.add_subparsers(dest="command", required=True)
    ledger = commands.add_parser("ledger", help="privacy ledger files")
    actions = ledger.add_subparsers(dest="action", required=True)
    show_cmd = actions.add_parser("show", help="verify a ledger file and print its epsilon, rounds and mechanisms")
    show_cmd.add_argument("path", help="the ledger file")
    keys = show_cmd.add_mutually_exclusive_group()
    keys.add_argument("--key-env", metavar="VAR", help=f"environment variable holding the HMAC key (default {KEY_ENV})")
    keys.add_argument("--key-file", metavar="FILE", help="file holding the HMAC key")
    show_cmd.add_argument("--high-water", metavar="FILE", help="the high-water record (default PATH.hwm if present)")
    show_cmd.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    show_cmd.set_defaults(handler=None, usage=show_cmd)

    roster = commands.add_parser("roster", help="node identities and the operator-signed roster (SecAgg+ peers)")
    roster_actions = roster.add_subparsers(dest="action", required=True)
    keygen = roster_actions.add_parser("keygen", help="write a fresh Ed25519 private key and print its public key")
    keygen.add_argument("--out", metavar="KEY.pem", required=True, help="the private key file (mode 0600, new)")
    keygen.add_argument("--public-out", metavar="FILE", help="also write the public key (base64) to this new file")
    keygen.set_defaults(handler=_keygen, usage=keygen)

    sign = roster_actions.add_parser("sign", help="sign a roster with the operator's key")
    sign.add_argument("--signer", metavar="OPERATOR.pem", required=True, help="the operator's private key")
    sign.add_argument("--federation", metavar="NAME", required=True, help="the federation's name")
    sign.add_argument(
        "--member",
        metavar="NAME=PUBKEY_OR_FILE",
        type=_member_spec,
        action="append",
        default=[],
        help="a member: its name and public key (base64, or a file holding it); repeatable",
    )
    sign.add_argument("--members-file", metavar="FILE", help="a file of NAME=PUBKEY lines (its members come first)")
    sign.add_argument("--out", metavar="ROSTER.json", required=True, help="the roster file to write")
    sign.add_argument("--force", action="store_true", help="replace --out if it exists")
    sign.set_defaults(handler=_sign, usage=sign)

    check = roster_actions.add_parser("verify", help="verify a roster against the trusted operator key")
    check.add_argument("roster", metavar="ROSTER.json", help="the roster file")
    check.add_argument(
        "--signer",
        metavar="PUBKEY_OR_FILE",
        required=True,
        help="the trusted operator key (base64, as --signer=KEY if it starts with '-'; or a file holding it)",
    )
    check.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    check.set_defaults(handler=_verify, usage=check)

    demo = roster_actions.add_parser("demo", help="write an operator key, N node keys and their signed roster")
    demo.add_argument("--nodes", metavar="N", type=int, required=True, help="the number of nodes")
    demo.add_argument("--out", metavar="DIR", required=True, help="the directory to create (or an empty one)")
    demo.add_argument("--federation", metavar="NAME", default="demo", help="the federation's name (default demo)")
    demo.set_defaults(handler=_demo, usage=demo)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; the exit status (0 verified or written, 1 refused or unreadable, 2 usage: argparse's
    SystemExit(2), as for any usage error). A reader that closes the pipe early (``flwr-dp ledger show FILE |
    head``) ends it quietly, as Unix tools do: no traceback, status 141 (128 + SIGPIPE)."""
    try:
        status = _run(argv)
        sys.stdout.flush()  # a closed pipe shows here, inside the try, not at interpreter exit
        return status
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit must not fail again
        return 128 + 13


def _run(argv: Optional[Sequence[str]]) -> int:
    args = _parser().parse_args(argv)
    if args.handler is not None:
        try:
            return args.handler(args)
        except _UsageError as err:
            args.usage.error(str(err))  # SystemExit(2)
        except BrokenPipeError:
            raise
        except (ValueError, OSError) as err:
            print(f"flwr-dp: error: {err}", file=sys.stderr)
            return 1
    try:
        report = show(args.path, _key(args), args.high_water)
    except ValueError as err:  # LedgerFileError included
        print(f"flwr-dp: error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if args.json else _table(report))
    return 0


if __name__ == "__main__":  # pragma: no cover - exercised through a subprocess in the tests
    sys.exit(main())
