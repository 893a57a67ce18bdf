"""Many concurrent ledger creators in one process, as a Spark job's tasks are: each creates a ledger, appends
entries and closes it, over and over. Used by client/tests/test_idgen.py and bench/creation_bench.py.

    python creators.py ETCD CLUSTER --creators 32 --ledgers 400 [--entries 1] [--entry-bytes 1024]
                       [--start-at UNIX_S]

`--ledgers` is this process's total, shared by its creators. `--start-at` makes several processes begin at
the same moment (after their imports and connections). Prints one JSON line: {"ids": [...], "failures":
[messages], "seconds": wall time of the creations, "cpu_s": this process's CPU time over them,
"latencies_ms": per-ledger times}.
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

    async with Client(args.etcd, args.cluster, ClientOptions(add_timeout_s=30.0, metadata_timeout_s=30.0)) as client:
        await client.bookies(refresh=True)  # connect before the clock starts
        if args.start_at:
            await asyncio.sleep(max(0.0, args.start_at - time.time()))

        async def creator() -> None:
            nonlocal left
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
                except Exception as e:  # every failure is reported, none ends the run
                    failures.append(f"{type(e).__name__}: {e}")
                latencies_ms.append((time.perf_counter() - t0) * 1000)

        t0, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(creator() for _ in range(args.creators)))
        seconds, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    return {"ids": ids, "failures": failures, "seconds": seconds, "cpu_s": cpu_s, "latencies_ms": latencies_ms}


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
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(run(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
