"""A client process for the network-fault runs: run inside a lab host's namespace, it writes (or reads) ledgers
through the real client library and records every operation and its outcome in a history file (one JSON object
per line, flushed at once, so a SIGKILL loses nothing that was recorded).

    python worker.py write --etcd E --cluster C --name w1 --history H --seconds 30 --seed 7
    python worker.py read  --etcd E --cluster C --name r1 --history H --seconds 30 --seed 7
    python worker.py tail  --etcd E --cluster C --name t1 --history H --seconds 30
    python worker.py recover --etcd E --cluster C --name x1 --history H --seconds 30 --seed 7

History events (`p` the process, `t` the wall clock):
- create ok {ledger, ensemble}; append ok {ledger, first, last}: entries first..last acknowledged;
  append fail {ledger, error}: the handle is given up (a new ledger is started);
  close ok {ledger, last}; close fail {ledger, error};
- read ok {ledger, first, last, good}: entries first..last read (without recovery) and whether every one was
  the payload written; read fail {ledger, error}; open ok {ledger} (tail mode: the ledger it follows);
- recover ok {ledger, last}: a recovery open of another process's open ledger closed it at `last`.
Payloads are a function of (ledger, entry): the checker recomputes them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from typing import Any

PASSWORD = b"netfaults"


def payload(ledger: int, entry: int) -> bytes:
    head = f"{ledger}:{entry}:".encode()
    return (head * (64 // len(head) + 1))[:64]


class History:
    def __init__(self, path: str, name: str) -> None:
        self.file = open(path, "a", buffering=1)  # noqa: SIM115 (line-buffered for the life of the process)
        self.name = name

    def record(self, f: str, kind: str, **fields: Any) -> None:
        self.file.write(json.dumps({"p": self.name, "t": time.time(), "f": f, "type": kind, **fields}) + "\n")


async def write(args: argparse.Namespace, history: History) -> None:
    from octavo.client import Client, ClientOptions

    rng = random.Random(args.seed)
    options = ClientOptions(add_timeout_s=2.0, read_timeout_s=2.0, metadata_timeout_s=2.0, bookie_list_ttl_s=1.0)
    deadline = time.monotonic() + args.seconds
    async with Client(args.etcd, args.cluster, options) as client:
        while time.monotonic() < deadline:
            try:
                handle = await client.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum,
                                                    password=PASSWORD)
            except Exception as e:  # etcd or bookies unreachable: try again
                history.record("create", "fail", error=f"{type(e).__name__}: {e}"[:300])
                await asyncio.sleep(0.5)
                continue
            ledger = handle.ledger_id
            history.record("create", "ok", ledger=ledger, ensemble=list(handle.metadata.last_ensemble))
            entry = 0
            failed = False
            while time.monotonic() < deadline and entry < args.entries_per_ledger:
                batch = rng.randint(1, 20)
                try:
                    ids = await asyncio.wait_for(handle.append_many([payload(ledger, entry + i)
                                                                     for i in range(batch)]), args.op_timeout_s)
                except Exception as e:
                    history.record("append", "fail", ledger=ledger, error=f"{type(e).__name__}: {e}"[:300])
                    failed = True
                    break
                history.record("append", "ok", ledger=ledger, first=ids[0], last=ids[-1])
                entry += batch
            if failed:
                continue  # left open: a recovery open (the checker's) decides its end
            try:
                await asyncio.wait_for(handle.close(), args.op_timeout_s)
                history.record("close", "ok", ledger=ledger, last=handle.last_add_confirmed)
            except Exception as e:
                history.record("close", "fail", ledger=ledger, error=f"{type(e).__name__}: {e}"[:300])


async def read(args: argparse.Namespace, history: History) -> None:
    from octavo.client import Client, ClientOptions

    rng = random.Random(args.seed)
    options = ClientOptions(read_timeout_s=2.0, metadata_timeout_s=2.0)
    deadline = time.monotonic() + args.seconds
    async with Client(args.etcd, args.cluster, options) as client:
        while time.monotonic() < deadline:
            try:
                ledgers = await client.list_ledgers()
            except Exception:
                await asyncio.sleep(0.5)
                continue
            if not ledgers:
                await asyncio.sleep(0.2)
                continue
            ledger = rng.choice(ledgers)
            try:
                handle = await asyncio.wait_for(client.open_ledger(ledger, PASSWORD, recovery=False),
                                                args.op_timeout_s)
                last = handle.last_entry_id
                if last < 0:
                    continue
                first = max(0, last - 50)
                got = await asyncio.wait_for(handle.read_entries(list(range(first, last + 1))), args.op_timeout_s)
                good = all(got.get(e) == payload(ledger, e) for e in range(first, last + 1))
                history.record("read", "ok", ledger=ledger, first=first, last=last, good=good)
            except Exception as e:
                history.record("read", "fail", ledger=ledger, error=f"{type(e).__name__}: {e}"[:300])
                await asyncio.sleep(0.1)


async def recover(args: argparse.Namespace, history: History) -> None:
    """A second writer in Jepsen's sense: now and then it takes over an open ledger of the writers with a
    recovery open (fence, find the end, close), while their writers may still be writing. Records the end it
    closed the ledger at; the checker holds every writer's acks and every reader to it."""
    from octavo.client import Client, ClientOptions

    rng = random.Random(args.seed)
    options = ClientOptions(read_timeout_s=2.0, add_timeout_s=2.0, metadata_timeout_s=2.0)
    deadline = time.monotonic() + args.seconds
    async with Client(args.etcd, args.cluster, options) as client:
        while time.monotonic() < deadline:
            await asyncio.sleep(rng.uniform(0.5, 2.0))
            try:
                candidates = [m.ledger_id for m in await client.all_ledger_metadata() if m.state != "CLOSED"]
            except Exception:
                continue
            if not candidates:
                continue
            ledger = rng.choice(candidates)
            try:
                handle = await asyncio.wait_for(client.open_ledger(ledger, PASSWORD), args.op_timeout_s)
                history.record("recover", "ok", ledger=ledger, last=handle.last_entry_id)
            except Exception as e:
                history.record("recover", "fail", ledger=ledger, error=f"{type(e).__name__}: {e}"[:300])


async def tail(args: argparse.Namespace, history: History) -> None:
    """Open the first ledger etcd lists (without recovery) and keep reading its tail: LAC, then the entries up
    to it, from whatever bookies answer (it may end up cut off from etcd and most bookies)."""
    from octavo.client import Client, ClientOptions

    options = ClientOptions(read_timeout_s=2.0, metadata_timeout_s=2.0)
    deadline = time.monotonic() + args.seconds
    async with Client(args.etcd, args.cluster, options) as client:
        handle = None
        while handle is None and time.monotonic() < deadline:
            try:
                ledgers = await client.list_ledgers()
                if ledgers:
                    handle = await client.open_ledger(min(ledgers), PASSWORD, recovery=False)
                    history.record("open", "ok", ledger=handle.ledger_id)
            except Exception:
                await asyncio.sleep(0.2)
        while handle is not None and time.monotonic() < deadline:
            try:
                lac = await asyncio.wait_for(handle.read_last_add_confirmed(), args.op_timeout_s)
                if lac >= 0:
                    first = max(0, lac - 20)
                    got = await asyncio.wait_for(handle.read_entries(list(range(first, lac + 1))), args.op_timeout_s)
                    good = all(got.get(e) == payload(handle.ledger_id, e) for e in range(first, lac + 1))
                    history.record("read", "ok", ledger=handle.ledger_id, first=first, last=lac, good=good)
            except Exception as e:
                history.record("read", "fail", ledger=handle.ledger_id, error=f"{type(e).__name__}: {e}"[:300])
            await asyncio.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["write", "read", "tail", "recover"])
    p.add_argument("--etcd", required=True)
    p.add_argument("--cluster", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--history", required=True)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ensemble", type=int, default=3)
    p.add_argument("--write-quorum", type=int, default=3)
    p.add_argument("--ack-quorum", type=int, default=2)
    p.add_argument("--entries-per-ledger", type=int, default=400)
    p.add_argument("--op-timeout-s", type=float, default=15.0)
    args = p.parse_args(argv)
    history = History(args.history, args.name)
    asyncio.run({"write": write, "read": read, "tail": tail, "recover": recover}[args.mode](args, history))
    return 0


if __name__ == "__main__":
    sys.exit(main())
