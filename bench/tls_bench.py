"""What mutual TLS costs: the cluster benchmark's writes (E=3, Qw=3, Qa=2; every ledger writes its share of an
8 MiB in-flight budget and waits for it, again and again) of 1 KB and 64 KB entries, on two local clusters of
three bookies side by side in one run: one in plaintext, one with mutual TLS between the client and the bookies
(certificates from a throwaway CA, client certificates required) and etcd in plaintext for both.

Each round runs both clusters once per entry size, in an order drawn at random per round (seeded). Reported:
medians of entries/s and the median of per-round ratios (TLS over plaintext), and CPU per MB on the bookies
and in the client. Target (issue 15): TLS keeps at least 80% of the plaintext throughput. Writes the `tls`
section of docs/benchmarks.md.

Usage: python bench/tls_bench.py [--rounds N] [--seconds S] [--ledgers N] [--no-report]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_bench import INFLIGHT_BYTES
from common import machine_line, median, table, write_section
from observability_bench import cpu_s, run_octavo_cleanup

from octavo.cli.certs import CertificateAuthority
from octavo.cli.localcluster import LocalCluster
from octavo.client import Client, ClientOptions

SIZES = [1024, 64 * 1024]
BOOKIE_ARGS = ["--log-size-bytes-max", str(64 << 20)]


async def write_for(client: Client, size: int, ledgers: int, seconds: float) -> int:
    writers = [await client.create_ledger(3, 3, 2, password=b"bench") for _ in range(ledgers)]
    payload = os.urandom(size)
    chunk = max(1, INFLIGHT_BYTES // size // ledgers)
    deadline = time.perf_counter() + seconds
    done = [0] * ledgers

    async def one(i: int) -> None:
        while time.perf_counter() < deadline:
            await writers[i].append_many([payload] * chunk)
            done[i] += chunk

    await asyncio.gather(*(one(i) for i in range(ledgers)))
    await asyncio.gather(*(w.close() for w in writers))
    return sum(done)


async def measured_run(cluster: LocalCluster, options: ClientOptions, size: int, ledgers: int,
                       seconds: float) -> tuple[float, float, float]:
    """(entries/s, bookie CPU ms per MB, client CPU ms per MB) of one write run."""
    pids = [b.proc.pid for b in cluster.bookies.values() if b.proc is not None]
    async with Client(cluster.etcd_endpoint, options=options) as client:
        bookie0, client0, t0 = cpu_s(pids), time.process_time(), time.perf_counter()
        entries = await write_for(client, size, ledgers, seconds)
        elapsed = time.perf_counter() - t0
        client_cpu, bookie_cpu = time.process_time() - client0, cpu_s(pids) - bookie0
        await run_octavo_cleanup(client)
    mb = entries * size / 1e6
    return entries / elapsed, bookie_cpu / mb * 1000, client_cpu / mb * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--ledgers", type=int, default=50)
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--no-report", action="store_true")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="octavo-tls-bench-", dir=os.environ.get("OCTAVO_BENCH_DIR")))
    ca = CertificateAuthority("octavo-bench-ca")
    bookie = ca.write(root / "pki", "bookie")
    client = ca.write(root / "pki", "client", server=False)
    tls_args = ["--tls-cert-file", bookie.cert_file, "--tls-key-file", bookie.key_file, "--tls-ca-file",
                bookie.ca_file]
    plain = LocalCluster(str(root / "plain"), bookies=3, bookie_args=BOOKIE_ARGS, new_session=True)
    secure = LocalCluster(str(root / "tls"), bookies=3, bookie_args=[*BOOKIE_ARGS, *tls_args], new_session=True)
    tls_options = ClientOptions(tls_ca_file=client.ca_file, tls_cert_file=client.cert_file,
                                tls_key_file=client.key_file)
    runs: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    rng = random.Random(args.seed)
    try:
        plain.start()
        secure.start()
        for r in range(args.rounds):
            for size in SIZES:
                order = [("plaintext", plain, ClientOptions()), ("mTLS", secure, tls_options)]
                rng.shuffle(order)
                for name, cluster, options in order:
                    result = asyncio.run(measured_run(cluster, options, size, args.ledgers, args.seconds))
                    runs.setdefault((name, size), []).append(result)
                    print(f"round {r + 1} {size:>6} B {name:>9}: {result[0]:,.0f} entries/s "
                          f"({result[0] * size / 1e6:,.1f} MB/s); CPU per MB: bookies {result[1]:.1f} ms, "
                          f"client {result[2]:.1f} ms", flush=True)
    finally:
        plain.stop()
        secure.stop()
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    verdicts = []
    for size in SIZES:
        base, tls = runs[("plaintext", size)], runs[("mTLS", size)]
        ratio = median([t[0] / b[0] for t, b in zip(tls, base, strict=True)])
        for name, values in (("plaintext", base), ("mTLS", tls)):
            rate = median([v[0] for v in values])
            rows.append([f"{size:,} B x {args.ledgers}", name, f"{rate:,.0f} ({rate * size / 1e6:,.1f} MB/s)",
                         f"{ratio:.0%}" if name == "mTLS" else "100%",
                         f"{median([v[1] for v in values]):.1f}", f"{median([v[2] for v in values]):.1f}"])
        print(f"{size:>6} B: mTLS keeps {ratio:.0%} of plaintext (median of per-round ratios)", flush=True)
        verdicts.append(f"{size:,} B: {ratio:.0%}, {'met' if ratio >= 0.8 else 'missed'}")
    body = "\n".join([
        "## TLS",
        "",
        f"`python bench/tls_bench.py --rounds {args.rounds} --seconds {args.seconds:g} --ledgers {args.ledgers}` "
        f"({machine_line()}).",
        "The cluster benchmark's writes (E=3, Qw=3, Qa=2, an 8 MiB in-flight budget shared by the ledgers) on two "
        "local clusters of three bookies: one in plaintext, one with mutual TLS between the client and the "
        "bookies (TLS 1.3, client certificates required; etcd in plaintext for both). Each round runs both once per "
        f"size in a random order (seed {args.seed}); medians of {args.rounds} rounds of {args.seconds:g}-s runs; "
        "the share is the median of per-round ratios. CPU per MB written: the three bookie processes' user+system "
        "time (/proc) and the client process's.",
        "",
        table(["entries", "transport", "entries/s", "of plaintext", "bookie CPU ms/MB", "client CPU ms/MB"], rows),
        "",
        f"Target: TLS keeps at least 80% of the plaintext throughput ({'; '.join(verdicts)}). Here the client "
        "and the three bookies share "
        "two cores, so throughput follows the CPU spent per byte: TLS adds its encryption on the client (each "
        "byte three times, once per bookie of the write quorum) and its decryption on every bookie, which the "
        "CPU columns show; large entries, where bytes dominate, pay the most.",
    ])
    if not args.no_report:
        write_section("tls", body)
        print("wrote docs/benchmarks.md (tls)")


if __name__ == "__main__":
    main()
