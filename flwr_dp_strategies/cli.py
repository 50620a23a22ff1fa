"""``flwr-dp``: the package's command line; ``flwr-dp ledger show PATH`` reads a ledger file without Python.

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
newline removed). Exit status: 0 verified and printed; 1 the file is missing,
unreadable, tampered with, not authenticated by the key, or older than its
high-water record (the message says which); 2 a usage error.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any, Optional

from .privacy.ledger import PrivacyLedger
from .privacy.ledger_file import (
    HIGH_WATER_SUFFIX,
    KEY_ENV,
    LedgerFileError,
    check_high_water,
    decode_high_water,
    parse_body,
    read_bytes,
    read_envelope,
)

_HIGH_WATER_MAX_BYTES = 8192


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
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; the exit status (0 verified, 1 refused or unreadable, 2 usage)."""
    args = _parser().parse_args(argv)
    try:
        report = show(args.path, _key(args), args.high_water)
    except ValueError as err:  # LedgerFileError included
        print(f"flwr-dp: error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if args.json else _table(report))
    return 0


if __name__ == "__main__":  # pragma: no cover - exercised through a subprocess in the tests
    sys.exit(main())
