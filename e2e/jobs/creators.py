"""Many concurrent ledger creators in one process, as a Spark job's tasks are: each creates a ledger, appends
entries and closes it, over and over. Used by shared/tests/test_idgen.py and bench/creation_bench.py.

    python creators.py ETCD CLUSTER --creators 32 --ledgers 400 [--entries 1] [--entry-bytes 1024]
                       [--start-at UNIX_S] [--allocation blocks|per-id-cas]

`--ledgers` is this process's total, shared by its creators. `--start-at` makes several processes begin at
the same moment (after their imports and connections). Prints one JSON line: {"ids": ledgers created,
"completed": how many were created, written and closed, "failures": [messages], "seconds": wall time of the
creations, "cpu_s": this process's CPU time over them, "latencies_ms": per-ledger times}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time


async def run(args: argparse.Namespace) -> dict[str, object]:
    from octavo.client import Client, ClientOptions

    ids: list[int] = []
    failures: list[str] = []
    latencies_ms: list[float] = []
    payload = os.urandom(args.entry_bytes)
    left = args.ledgers
    completed = 0  # created, written and closed

    async with Client(args.etcd, args.cluster, ClientOptions(add_timeout_s=30.0, metadata_timeout_s=30.0)) as client:
        if args.allocation == "per-id-cas":
            use_per_id_cas(client)
        await client.bookies(refresh=True)  # connect before the clock starts
        if args.start_at:
            await asyncio.sleep(max(0.0, args.start_at - time.time()))

        async def creator() -> None:
            nonlocal left, completed
            while left > 0:
                left -= 1
                t0 = time.perf_counter()
                try:
                    writer = await client.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum,
                                                        password=b"creators")
                    ids.append(writer.ledger_id)
                    for _ in range(args.entries):
                        await writer.append(payload)
                    await writer.close()
                    completed += 1
                except Exception as e:  # every failure is reported, none ends the run
                    failures.append(f"{type(e).__name__}: {e}")
                latencies_ms.append((time.perf_counter() - t0) * 1000)

        t0, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(creator() for _ in range(args.creators)))
        seconds, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    return {"ids": ids, "completed": completed, "failures": failures, "seconds": seconds, "cpu_s": cpu_s,
            "latencies_ms": latencies_ms}


def use_per_id_cas(client: object) -> None:
    """The allocation of Octavo before id blocks, for the bench's side-by-side: every creation reads the counter
    and moves it one up with a CAS, in the transaction that creates the ledger, retried at once 50 times."""
    from octavo.meta.errors import MetadataUnavailableError
    from octavo.meta.etcd import Txn
    from octavo.meta.ledger_metadata import LedgerMetadata

    store = client.metadata_store  # type: ignore[attr-defined]

    async def create_ledger(**fields: object) -> tuple[LedgerMetadata, int]:
        counter_key = store.layout.ledger_id_counter
        for _ in range(50):
            current = await store.etcd.get(counter_key)
            next_id = int(current.value) if current else 0
            meta = LedgerMetadata(ledger_id=next_id, created_unix_ms=int(time.time() * 1000), **fields)  # type: ignore[arg-type]
            key = store.layout.ledger(next_id)
            ok, resp = await store.etcd.txn(
                Txn().mod_revision_is(counter_key, current.mod_revision if current else 0).mod_revision_is(key, 0)
                .put(counter_key, str(next_id + 1).encode()).put(key, meta.encode()))
            if ok:
                return meta, int(resp.header.revision)
        raise MetadataUnavailableError("could not allocate a ledger id in 50 attempts (too many concurrent creators)")

    store.create_ledger = create_ledger


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("etcd")
    parser.add_argument("cluster")
    parser.add_argument("--creators", type=int, default=32)
    parser.add_argument("--ledgers", type=int, default=400)
    parser.add_argument("--entries", type=int, default=1)
    parser.add_argument("--entry-bytes", type=int, default=1024)
    parser.add_argument("--ensemble", type=int, default=3)
    parser.add_argument("--write-quorum", type=int, default=3)
    parser.add_argument("--ack-quorum", type=int, default=2)
    parser.add_argument("--start-at", type=float, default=0.0)
    parser.add_argument("--allocation", choices=["blocks", "per-id-cas"], default="blocks",
                        help="per-id-cas: the allocation before id blocks (bench/creation_bench.py's baseline)")
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(run(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
