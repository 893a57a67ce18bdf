"""`octavo ledger ls|show|read|delete --etcd HOST:PORT`: look at and remove ledgers.

    octavo ledger ls      --etcd E [--cluster C] [--json]
    octavo ledger show ID --etcd E [--json]
    octavo ledger read ID --etcd E --password P [--first N] [--last N] [--recover] [--json]
    octavo ledger delete ID --etcd E

`read` opens without recovery by default (it never fences a writer); --recover closes an open ledger first.
Exit codes: 0 success, 1 the operation failed (message on stderr), 2 bad usage.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from argparse import Namespace
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1


def add_parser(sub: Any) -> None:
    p = sub.add_parser("ledger", help="list, show, read and delete ledgers")
    lsub = p.add_subparsers(dest="ledger_cmd", required=True)
    for name, help_text in (("ls", "list ledger ids"), ("show", "show a ledger's metadata"),
                            ("read", "print a ledger's entries"), ("delete", "delete a ledger")):
        c = lsub.add_parser(name, help=help_text)
        if name != "ls":
            c.add_argument("ledger_id", type=int)
        c.add_argument("--etcd", required=True, help="etcd endpoints host:port[,host:port...]")
        c.add_argument("--cluster", default="default")
        if name in ("ls", "show", "read"):
            c.add_argument("--json", action="store_true", help="print JSON")
        if name == "read":
            c.add_argument("--password", default="", help="the ledger's password")
            c.add_argument("--first", type=int, default=0)
            c.add_argument("--last", type=int, default=None, help="default: the last readable entry")
            c.add_argument("--recover", action="store_true", help="recovery open: fence and close the ledger")


def run(args: Namespace) -> int:
    from octavo.client.errors import OctavoError

    try:
        return asyncio.run(_run(args))
    except OctavoError as e:
        print(f"octavo ledger {args.ledger_cmd}: {e}", file=sys.stderr)
        return EXIT_FAILED
    except ValueError as e:
        print(f"octavo ledger {args.ledger_cmd}: {e}", file=sys.stderr)
        return EXIT_FAILED


async def _run(args: Namespace) -> int:
    from octavo.client import Client

    async with Client(args.etcd, args.cluster) as client:
        if args.ledger_cmd == "ls":
            ids = await client.list_ledgers()
            print(json.dumps(ids) if args.json else "\n".join(map(str, ids)) or "(no ledgers)")
        elif args.ledger_cmd == "show":
            meta = await client.ledger_metadata(args.ledger_id)
            if args.json:
                print(json.dumps({k: v for k, v in json.loads(meta.encode()).items() if k != "master_key_hex"}))
            else:
                print(f"ledger   {meta.ledger_id}: {meta.state}, last entry {meta.last_entry_id}, "
                      f"length {meta.length} bytes")
                print(f"quorums  E={meta.ensemble_size} Qw={meta.write_quorum} Qa={meta.ack_quorum}")
                for first, bookies in meta.ensembles:
                    print(f"segment  from entry {first}: {', '.join(bookies)}")
                for key, value in sorted(meta.custom_metadata.items()):
                    print(f"metadata {key} = {value}")
        elif args.ledger_cmd == "read":
            reader = await client.open_ledger(args.ledger_id, args.password.encode(), recovery=args.recover)
            last = reader.last_entry_id if args.last is None else args.last
            if last < args.first:
                print(f"(no entries: last readable entry is {reader.last_entry_id})", file=sys.stderr)
                return EXIT_OK
            async for entry in reader.read(args.first, last):
                if args.json:
                    print(json.dumps({"entry_id": entry.entry_id, "data": base64.b64encode(entry.data).decode()}))
                else:
                    print(f"{entry.entry_id}\t{entry.data!r}")
        elif args.ledger_cmd == "delete":
            await client.delete_ledger(args.ledger_id)
            print(f"ledger {args.ledger_id} deleted; its bookies reclaim the space at their next GC pass")
    return EXIT_OK
