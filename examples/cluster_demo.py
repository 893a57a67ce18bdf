"""The cluster demo (`make demo`): a replicated ledger keeps every acknowledged entry through a SIGKILL.

1. Start a local cluster: a real etcd and four bookies on 127.0.0.1 (what `octavo dev up` runs).
2. A writer appends to a ledger replicated on three bookies (E=3, Qw=3, Qa=2), many appends in flight.
3. One bookie of its ensemble is killed with SIGKILL mid-write: the writer replaces it (ensemble change)
   and goes on without losing an acknowledged entry.
4. The writer "crashes" (stops without closing). A second client opens the ledger with recovery: it fences
   the bookies, finds the last entry, re-replicates the tail and closes the ledger.
5. Every acknowledged entry is read back and compared byte for byte; the old writer is refused.

Run: `make demo`, or `.venv/bin/python examples/cluster_demo.py [--data-dir DIR] [--seconds S]`.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from pathlib import Path

from octavo.cli.localcluster import LocalCluster
from octavo.client import Client, LedgerFencedError

PASSWORD = b"demo-password"
ENTRY_BYTES = 1024


_FILLER = bytes(range(256)) * (ENTRY_BYTES // 256 + 2)


def payload(entry_id: int) -> bytes:
    """1 KB that differs per entry: the id, then filler starting at a position the id chooses."""
    head = f"entry {entry_id:>9} ".encode()
    start = entry_id % 251
    return head + _FILLER[start:start + ENTRY_BYTES - len(head)]


async def write_for(writer, seconds: float, first: int, acked: list[int]) -> int:  # type: ignore[no-untyped-def]
    """Append for `seconds`, up to 2,000 entries in flight; returns the next entry number."""
    deadline = time.monotonic() + seconds
    entry = first
    while time.monotonic() < deadline:
        batch = [payload(entry + i) for i in range(2000)]
        entry += len(batch)
        acked.extend(await writer.append_many(batch))
    return entry


async def run(cluster: LocalCluster, seconds: float) -> int:
    async with Client(cluster.etcd_endpoint) as client:
        writer = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD)
        ensemble = writer.metadata.last_ensemble
        print(f"2. ledger {writer.ledger_id} on {', '.join(ensemble)} (E=3, Qw=3, Qa=2); appending 1 KB entries ...")
        acked: list[int] = []
        t0 = time.monotonic()
        entry = await write_for(writer, seconds / 2, 0, acked)
        victim = ensemble[1]
        print(f"3. SIGKILL {victim} after {len(acked):,} acknowledged entries ...")
        cluster.bookies[victim].kill()
        await write_for(writer, seconds / 2, entry, acked)
        elapsed = time.monotonic() - t0
        segments = writer.metadata.ensembles
        print(f"   the writer went on: {len(acked):,} entries acknowledged in {elapsed:.1f}s "
              f"({len(acked) / elapsed:,.0f}/s, {len(acked) * ENTRY_BYTES / elapsed / 1e6:.0f} MB/s, three copies); "
              f"{writer.ensemble_changes} ensemble change(s):")
        for first, bookies in segments:
            print(f"     from entry {first:>7}: {', '.join(bookies)}")
        if sorted(acked) != list(range(len(acked))):
            print("   acknowledged ids are not contiguous", file=sys.stderr)
            return 1

    print("4. the writer stops without closing; another client opens the ledger with recovery ...")
    async with Client(cluster.etcd_endpoint) as reader_client:
        t1 = time.monotonic()
        reader = await reader_client.open_ledger(writer.ledger_id, password=PASSWORD)
        meta = reader.metadata
        print(f"   recovered in {time.monotonic() - t1:.2f}s: {meta.state}, last entry {reader.last_entry_id}")
        print("5. reading back every acknowledged entry ...")
        count = 0
        async for entry in reader.read(0, reader.last_entry_id):
            if entry.data != payload(entry.entry_id):
                print(f"   entry {entry.entry_id} differs", file=sys.stderr)
                return 1
            count += 1
        missing = len(acked) - min(count, len(acked))
        if reader.last_entry_id < len(acked) - 1 or missing:
            print(f"   LOST: {missing} acknowledged entries", file=sys.stderr)
            return 1
        print(f"   {count:,} entries read back, byte-identical; all {len(acked):,} acknowledged ones among them")
    try:
        await writer.append(b"from the old writer")
        print("   the old writer could still append!", file=sys.stderr)
        return 1
    except LedgerFencedError:
        print("   the old writer is fenced: its next append fails with LedgerFencedError")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=".demo/cluster")
    ap.add_argument("--seconds", type=float, default=6.0, help="how long the writer appends")
    args = ap.parse_args()
    root = Path(args.data_dir)
    if root.exists():
        shutil.rmtree(root)
    print(f"1. starting etcd and 4 bookies under {root} ...")
    cluster = LocalCluster(str(root), bookies=4, bookie_args=["--log-size-bytes-max", str(64 << 20)],
                           new_session=True)
    cluster.start()
    try:
        print(f"   etcd {cluster.etcd_endpoint}; "
              + ", ".join(f"{b} {p.address}" for b, p in cluster.bookies.items()))
        code = asyncio.run(run(cluster, args.seconds))
    finally:
        cluster.stop()
    print("done: no acknowledged entry lost." if code == 0 else "FAILED")
    return code


if __name__ == "__main__":
    sys.exit(main())
