"""`octavo ledger ls|show|read|delete`: look at and remove ledgers.

    octavo ledger ls      [--etcd E | --data-dir DIR] [--cluster C] [--json]
    octavo ledger show ID [...] [--json]
    octavo ledger read ID [...] [--password P | --password-file F] [--first N] [--last N | --follow]
                          [--format auto|text|hex|raw] [--recover | --unconfirmed] [--json]
    octavo ledger delete ID [...] [--password P | --password-file F] [--yes] [--json]

`read` opens without recovery by default (it never fences a writer); --recover closes an open ledger first.
An open ledger is read up to its last-add-confirmed (LAC), the last entry its bookies know was acknowledged;
--unconfirmed reads on to the last entry they hold on an ack quorum, entries that were not acknowledged and
that a recovery open may drop. With --follow (`tail -f`) the command prints what is there, then each entry as
its writer gets it acknowledged, and exits once the ledger is closed (Ctrl-C stops it earlier, exit code 130).
`show` of an open ledger prints its LAC and, labelled unconfirmed, the last entry its bookies hold past it.
`delete` asks for confirmation on a terminal; scripts pass --yes.
Exit codes: 0 success, 1 the operation failed (message on stderr), 2 bad usage.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from argparse import Namespace
from typing import Any

from octavo.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    PASSWORD_ENV,
    CliError,
    add_etcd_arguments,
    add_password_arguments,
    cluster_client,
    confirm,
    fmt_age,
    fmt_bytes,
    format_payload,
    non_negative_int,
    print_json,
    resolve_password,
    run_async,
)

# `ledger ls` prints its table this many rows at a time.
LS_PAGE_ROWS = 1000


def add_parser(sub: Any) -> None:
    p = sub.add_parser("ledger", help="list, show, read and delete ledgers")
    lsub = p.add_subparsers(dest="ledger_cmd", required=True)
    for name, help_text in (("ls", "list ledgers: state, entries, size, age"),
                            ("show", "show a ledger's metadata (an open one's LAC, and its unconfirmed last entry)"),
                            ("read", "print a ledger's entries"), ("delete", "delete a ledger")):
        c = lsub.add_parser(name, help=help_text)
        if name != "ls":
            c.add_argument("ledger_id", type=non_negative_int)
        add_etcd_arguments(c)
        c.add_argument("--json", action="store_true", help="print JSON")
        if name in ("read", "delete"):
            add_password_arguments(c)
        if name == "read":
            c.add_argument("--first", type=non_negative_int, default=None, help="first entry id (default: 0)")
            c.add_argument("--last", type=non_negative_int, default=None,
                           help="last entry id, inclusive (default: the last readable entry)")
            c.add_argument("--format", choices=("auto", "text", "hex", "raw"), default="auto",
                           help="auto: text when printable, hex otherwise; raw: the bytes alone, back to back")
            c.add_argument("--recover", action="store_true", help="recovery open: fence and close the ledger")
            c.add_argument("--unconfirmed", action="store_true",
                           help="read an open ledger past its last-add-confirmed, up to the last entry its bookies "
                                "hold on an ack quorum (default --last): those entries were not acknowledged and "
                                "may vanish, a recovery open may close the ledger before them")
            c.add_argument("--follow", "-f", action="store_true",
                           help="keep printing new entries as they are acknowledged, until the ledger is closed")
        if name == "delete":
            c.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def run(args: Namespace) -> int:
    return run_async(f"octavo ledger {args.ledger_cmd}", _run(args))


async def _run(args: Namespace) -> int:
    if args.ledger_cmd == "read" and args.first is not None and args.last is not None and args.last < args.first:
        raise CliError(f"--last {args.last} is before --first {args.first}", EXIT_USAGE)
    if args.ledger_cmd == "read" and args.follow and (args.last is not None or args.recover):
        raise CliError("--follow reads until the ledger is closed: it takes neither --last nor --recover",
                       EXIT_USAGE)
    if args.ledger_cmd == "read" and args.unconfirmed and (args.follow or args.recover):
        raise CliError("--unconfirmed reads an open ledger past its last-add-confirmed: it takes neither --follow "
                       "(which yields acknowledged entries only) nor --recover (which closes the ledger)", EXIT_USAGE)
    async with cluster_client(args) as client:
        handler = {"ls": _ls, "show": _show, "read": _read, "delete": _delete}[args.ledger_cmd]
        return await handler(client, args)  # type: ignore[no-any-return]


def _summary(meta: Any, now_s: float) -> dict[str, Any]:
    """One ledger as `ls --json` and `show --json` print it (without what needs a bookie)."""
    closed = meta.state == "CLOSED"
    return {"ledger_id": meta.ledger_id, "state": meta.state,
            "entries": meta.last_entry_id + 1 if closed else None,
            "last_entry_id": meta.last_entry_id if closed else None,
            "length_bytes": meta.length if closed and meta.length >= 0 else None,
            "created_unix_ms": meta.created_unix_ms,
            "age_s": round(now_s - meta.created_unix_ms / 1000, 3) if meta.created_unix_ms else None}


async def _ls(client: Any, args: Namespace) -> int:
    """Printed as etcd gives the metadata, a page at a time (in id order): memory holds one page of ledgers,
    however many the cluster has."""
    now = time.time()
    metas = client.iter_ledger_metadata()
    if args.json:  # the same document print_json makes, written row by row
        out = sys.stdout
        out.write('{"ledgers":[')
        first = True
        async for meta in metas:
            out.write(("" if first else ",") + json.dumps(_summary(meta, now), separators=(",", ":")))
            first = False
        out.write("]}\n")
        return EXIT_OK
    headers = ["LEDGER", "STATE", "ENTRIES", "SIZE", "AGE"]
    widths = [len(h) for h in headers]  # widened by each page as needed, never narrowed
    page: list[list[str]] = []
    printed = False
    async for meta in metas:
        page.append(_ls_row(_summary(meta, now)))
        if len(page) >= LS_PAGE_ROWS:
            widths = _print_rows(headers if not printed else None, page, widths)
            printed, page = True, []
    if page or printed:
        _print_rows(headers if not printed else None, page, widths)
    else:
        print("(no ledgers)", file=sys.stderr)
    return EXIT_OK


def _ls_row(r: dict[str, Any]) -> list[str]:
    return [str(r["ledger_id"]), r["state"].lower(),
            str(r["entries"]) if r["entries"] is not None else "open",
            fmt_bytes(r["length_bytes"]) if r["length_bytes"] is not None else ("unknown" if r["state"] == "CLOSED"
                                                                                 else "-"),
            fmt_age(r["age_s"]) if r["age_s"] is not None else "-"]


def _print_rows(headers: list[str] | None, rows: list[list[str]], widths: list[int]) -> list[int]:
    """Rows (after the headers, if given) padded as common.table pads them, to `widths` widened for these rows;
    returns the widths used."""
    widths = [max(w, *(len(r[i]) for r in rows)) if rows else w for i, w in enumerate(widths)]
    lines = ([headers] if headers else []) + rows
    sys.stdout.write("".join("  ".join(c.rjust(w) if c[:1].isdigit() else c.ljust(w)
                                       for c, w in zip(cells, widths, strict=True)).rstrip() + "\n"
                             for cells in lines))
    return widths


async def _show(client: Any, args: Namespace) -> int:
    meta = await client.ledger_metadata(args.ledger_id)
    lac = None if meta.closed else await client.read_last_add_confirmed(args.ledger_id)
    # Past the LAC: held by an ack quorum, not acknowledged; a recovery open may close the ledger before it.
    unconfirmed = None if meta.closed else await client.read_unconfirmed_last_entry(args.ledger_id)
    if args.json:
        out = _summary(meta, time.time())
        out.update(ensemble_size=meta.ensemble_size, write_quorum=meta.write_quorum, ack_quorum=meta.ack_quorum,
                   ensembles=[{"first_entry_id": first, "bookies": list(b)} for first, b in meta.ensembles],
                   password_digest=meta.password_digest, custom_metadata=dict(meta.custom_metadata),
                   last_add_confirmed=lac if lac is not None else meta.last_entry_id,
                   last_add_confirmed_source="bookies" if lac is not None else "metadata",
                   unconfirmed_last_entry_id=unconfirmed)
        print_json(out)
        return EXIT_OK
    if meta.closed:
        length = (f"{meta.length} bytes ({fmt_bytes(meta.length)})" if meta.length >= 0 else
                  "length unknown (closed by a recovery open, which reads only the entries past the last "
                  "add confirmed)")
        print(f"ledger   {meta.ledger_id}: CLOSED, {meta.last_entry_id + 1} entries (last entry "
              f"{meta.last_entry_id}), {length}")
    else:
        what = "a writer may still be appending" if meta.state == "OPEN" else "a recovery open is closing it"
        print(f"ledger   {meta.ledger_id}: {meta.state} ({what}); last add confirmed {lac} as read from its "
              f"bookies now; length unknown until it is closed")
        if unconfirmed is not None and lac is not None and unconfirmed > lac:
            print(f"unconfirmed last entry {unconfirmed}: entries {lac + 1}..{unconfirmed} are held by an ack "
                  f"quorum but not known to be acknowledged; a recovery open may drop them "
                  f"(`ledger read --unconfirmed` reads them)")
    print(f"quorums  E={meta.ensemble_size} Qw={meta.write_quorum} Qa={meta.ack_quorum}")
    for first, bookies in meta.ensembles:
        print(f"segment  from entry {first}: {', '.join(bookies)}")
    if meta.created_unix_ms:
        print(f"created  {fmt_age(time.time() - meta.created_unix_ms / 1000)} ago")
    for key, value in sorted(meta.custom_metadata.items()):
        print(f"metadata {key} = {value}")
    return EXIT_OK


def _password_refused(ledger_id: int, password: bytes) -> CliError:
    """A wrong password; or none given for a ledger that has one, which is said as such."""
    if not password:
        return CliError(f"ledger {ledger_id} has a password: give it with --password-file FILE, ${PASSWORD_ENV} "
                        "or --password", EXIT_USAGE)
    return CliError(f"wrong password for ledger {ledger_id}")


async def _read(client: Any, args: Namespace) -> int:
    from octavo.meta.errors import WrongPasswordError

    password = resolve_password(args)
    try:
        reader = await client.open_ledger(args.ledger_id, password, recovery=args.recover)
    except WrongPasswordError:
        raise _password_refused(args.ledger_id, password) from None
    if args.follow:
        async for batch in reader.tail_batches(args.first or 0):  # Ctrl-C: main() exits 130
            for entry in batch:
                _print_entry(entry, args)
            sys.stdout.flush()
        return EXIT_OK
    unconfirmed = args.unconfirmed and not reader.metadata.closed
    last_readable = await reader.read_unconfirmed_last_entry() if unconfirmed else reader.last_entry_id
    first = 0 if args.first is None else args.first
    last = last_readable if args.last is None else args.last
    explicit = args.first is not None or args.last is not None
    if last_readable < 0 and not explicit:
        state = "closed" if reader.metadata.closed else "open"
        hint = "" if reader.metadata.closed or unconfirmed else (
            ": its last-add-confirmed is -1; --unconfirmed reads entries its bookies hold past it")
        print(f"(ledger {args.ledger_id} is {state} with no readable entry{hint})", file=sys.stderr)
        return EXIT_OK
    if last > last_readable or first > last:
        raise CliError(f"entries [{first}, {max(first, last)}] are past the last readable entry {last_readable} of "
                       f"ledger {args.ledger_id}" + _open_ledger_hint(reader.metadata.closed, unconfirmed))
    async for batch in reader.read_batches(first, last, unconfirmed=unconfirmed):
        for entry in batch:
            _print_entry(entry, args)
    sys.stdout.flush()
    return EXIT_OK


def _open_ledger_hint(closed: bool, unconfirmed: bool) -> str:
    if closed:
        return ""
    if unconfirmed:
        return " (it is open: the last entry its bookies hold on an ack quorum, unconfirmed)"
    return (" (it is open: its last-add-confirmed; its writer may add more, and --unconfirmed reads what its "
            "bookies hold past it, entries that may vanish)")


def _print_entry(entry: Any, args: Namespace) -> None:
    out = sys.stdout
    if args.json:
        print_json({"ledger_id": entry.ledger_id, "entry_id": entry.entry_id, "size_bytes": len(entry.data),
                    "data_base64": base64.b64encode(entry.data).decode()})
    elif args.format == "raw":
        out.buffer.write(entry.data)
    else:
        out.write(f"{entry.entry_id}\t{format_payload(entry.data, args.format)}\n")


async def _delete(client: Any, args: Namespace) -> int:
    from octavo.meta.ledger_metadata import password_digest

    meta = await client.ledger_metadata(args.ledger_id)
    password = resolve_password(args)
    if meta.password_digest != password_digest(password):
        raise _password_refused(args.ledger_id, password)
    what = (f"{meta.last_entry_id + 1} entries" + (f", {fmt_bytes(meta.length)}" if meta.length >= 0 else "")
            if meta.closed else f"{meta.state}: a writer may still be appending")
    confirm(f"delete ledger {args.ledger_id} ({what}) for good", args.yes)
    await client.delete_ledger(args.ledger_id, password)
    if args.json:
        print_json({"deleted": args.ledger_id})
    else:
        print(f"ledger {args.ledger_id} deleted. Its bookies stop taking adds and reads for it as soon as they "
              "learn of the delete (an etcd watch, within about a second). Space comes back in two ways: an "
              "entry log holding nothing else alive is removed at the bookie's next GC pass; a log shared with "
              "live ledgers is rewritten by compaction once enough of it is dead.")
    return EXIT_OK
