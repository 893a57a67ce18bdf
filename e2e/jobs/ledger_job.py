"""A writer and a checker for the kind e2e (run in the cluster, in the octavo image, from a ConfigMap):

    python ledger_job.py write SECONDS          # writes E3 Qw3 Qa2 ledgers; prints {"ledger": L, "acked": N}
                                                # after every acknowledged batch (N entries acknowledged so far)
    python ledger_job.py verify '{"L": N, ...}' # reads each ledger through a recovery open: its first N entries
                                                # must be exactly what was written; prints "ok: ..." or fails
    python ledger_job.py replicas '{"L": N, ...}'  # reads each closed ledger replica by replica: every entry on
                                                # every bookie of its segment's write set; "ok: ..." or fails

Payloads are a function of (ledger, entry), so the checker needs no copy of them. $OCTAVO_ETCD and
$OCTAVO_CLUSTER say where the cluster is.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time


def payload(ledger: int, entry: int) -> bytes:
    return f"{ledger}:{entry}:".encode() + bytes([entry % 251]) * 500


async def write(seconds: float) -> int:
    from octavo.client import Client

    deadline = time.monotonic() + seconds
    async with Client(os.environ["OCTAVO_ETCD"], os.environ.get("OCTAVO_CLUSTER", "default")) as client:
        while time.monotonic() < deadline:
            handle = await client.create_ledger(3, 3, 2, password=b"e2e")
            for batch in range(20):
                await handle.append_many([payload(handle.ledger_id, batch * 50 + i) for i in range(50)])
                print(json.dumps({"ledger": handle.ledger_id, "acked": batch * 50 + 50}), flush=True)
            await handle.close()
    return 0


async def verify(acked: dict[str, int]) -> int:
    from octavo.client import Client

    async with Client(os.environ["OCTAVO_ETCD"], os.environ.get("OCTAVO_CLUSTER", "default")) as client:
        for ledger_text, count in acked.items():
            ledger = int(ledger_text)
            reader = await client.open_ledger(ledger, password=b"e2e")
            if reader.last_entry_id < count - 1:
                print(f"ledger {ledger}: {count} entries were acknowledged, it ends at {reader.last_entry_id}",
                      file=sys.stderr)
                return 1
            async for entry in reader.read(0, count - 1):
                if entry.data != payload(ledger, entry.entry_id):
                    print(f"ledger {ledger}: entry {entry.entry_id} differs", file=sys.stderr)
                    return 1
    print(f"ok: {len(acked)} ledgers, {sum(acked.values())} acknowledged entries read back identical", flush=True)
    return 0


async def replicas(acked: dict[str, int]) -> int:
    from octavo.client import Client
    from octavo.meta.ledger_metadata import write_set
    from octavo.node.testing import BookieConnection
    from octavo.v1 import bookie_pb2 as pb

    copies = 0
    async with Client(os.environ["OCTAVO_ETCD"], os.environ.get("OCTAVO_CLUSTER", "default")) as client:
        registered = await client.bookies(refresh=True)
        for ledger_text in acked:
            meta = await client.ledger_metadata(int(ledger_text))
            ends = [first - 1 for first, _ in meta.ensembles[1:]] + [meta.last_entry_id]
            for (first, bookies), last in zip(meta.ensembles, ends, strict=True):
                for position, bookie in enumerate(bookies):
                    wanted = [e for e in range(first, last + 1)
                              if position in write_set(e, meta.ensemble_size, meta.write_quorum)]
                    with BookieConnection(registered[bookie].address) as connection:
                        for start in range(0, len(wanted), 500):
                            resp = connection.bookie.ReadEntries(pb.ReadRequest(
                                ledger_id=meta.ledger_id, entry_ids=wanted[start:start + 500]), timeout=60)
                            for got in resp.entries:
                                if got.code != pb.OK or got.payload != payload(meta.ledger_id, got.entry_id):
                                    print(f"ledger {meta.ledger_id} entry {got.entry_id} segment {bookies}: "
                                          f"missing or different on {bookie}", file=sys.stderr)
                                    return 1
                                copies += 1
    print(f"ok: {len(acked)} ledgers, {copies} copies on the bookies their segments name", flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        sys.exit(asyncio.run(write(float(sys.argv[2]))))
    if len(sys.argv) == 3 and sys.argv[1] == "verify":
        sys.exit(asyncio.run(verify(json.loads(sys.argv[2]))))
    if len(sys.argv) == 3 and sys.argv[1] == "replicas":
        sys.exit(asyncio.run(replicas(json.loads(sys.argv[2]))))
    print(__doc__, file=sys.stderr)
    sys.exit(2)
