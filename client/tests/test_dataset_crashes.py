"""Dataset commits and checkpoints killed with SIGKILL at random moments: every acknowledged commit is in the
dataset exactly once, the head agrees with the ledgers, and orphan collection afterwards deletes nothing a
version needs. On a real etcd and real bookies."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from octavo.cli.localcluster import LocalCluster
from octavo.client import Client

SCHEMA = '{"fields":[{"metadata":{},"name":"id","nullable":false,"type":"long"}],"type":"struct"}'

# Small limits so that the killed processes are often inside a forced checkpoint written to a ledger, or a
# commit whose record went to a ledger.
COMMITTER = """
import asyncio, os, sys
import octavo.client.dataset as ds
from octavo.client import Client
from octavo.client.dataset import DatasetLedger

ds.CHECKPOINT_FORCED_COMMITS = 6
ds.CHECKPOINT_INLINE_BYTES_MAX = 300
ds.RECORD_INLINE_BYTES_MAX = 400

async def main(etcd, worker, start):
    async with Client(etcd) as client:
        k = start
        while True:
            n = 1 + k % 13
            ledgers = [DatasetLedger(worker * 10**7 + k * 100 + i, 1, 10, 1) for i in range(n)]
            await client.datasets.commit("crashy", SCHEMA, ledgers)
            # One write(2) of a line under PIPE_BUF lands whole. With PYTHONUNBUFFERED set (CI sets it), print(k, n)
            # writes k, the space, n and the newline separately, and a kill between them left a last line holding
            # only a commit number (CI saw it).
            os.write(1, f"{k} {n}\\n".encode())
            if k == start:
                open(sys.argv[4], "w").close()  # committing: the kill's random delay starts now
            k += 1

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("dataset-crashes")), bookies=3,
                      bookie_args=["--dataset-maintenance-interval-s", "0"]) as c:
        yield c


def test_committers_killed_at_random_lose_no_acknowledged_commit(cluster: LocalCluster, tmp_path: Path) -> None:
    script = tmp_path / "committer.py"
    script.write_text(COMMITTER.replace("SCHEMA", repr(SCHEMA)))
    rng = random.Random(39)
    acked: dict[int, set[int]] = {}  # worker -> acknowledged commit numbers
    next_k = {w: 0 for w in range(3)}
    for round_ in range(5):
        ready = {w: tmp_path / f"ready-{round_}-{w}" for w in range(3)}
        procs = {w: subprocess.Popen([sys.executable, str(script), cluster.etcd_endpoint, str(w), str(next_k[w]),
                                      str(ready[w])],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
                 for w in range(3)}
        # The delay counts from each committer's first commit, not from its start: under load the imports alone
        # could take the whole delay, and a round would kill committers that never committed (CI load saw it).
        deadline = time.monotonic() + 120
        while not all(path.exists() for path in ready.values()):
            assert time.monotonic() < deadline, "a committer made no commit within 120 s"
            assert all(p.poll() is None for p in procs.values()), "a committer exited"
            time.sleep(0.05)
        time.sleep(rng.uniform(2.0, 4.0))
        for p in procs.values():
            os.killpg(p.pid, signal.SIGKILL)
        for w, p in procs.items():
            out, err = p.communicate(timeout=30)
            lines = [line.split() for line in out.splitlines(keepends=True) if line.endswith("\n")]
            assert all(len(fields) == 2 for fields in lines), out[-2000:]
            assert p.returncode == -signal.SIGKILL, err[-2000:]
            acked.setdefault(w, set()).update(int(k) for k, _ in lines)
            # A commit killed before its acknowledgement may have landed: the next round uses new numbers.
            next_k[w] = max([next_k[w], *(int(k) + 1 for k, _ in lines)]) + 1
    assert sum(len(ks) for ks in acked.values()) > 20, "the committers made progress between the kills"

    async def check() -> None:
        async with Client(cluster.etcd_endpoint) as client:
            for _ in range(2):  # before and after orphan collection and one more checkpoint
                manifest = await client.datasets.get("crashy")
                head = await client.datasets.head("crashy")
                ids = [x.ledger_id for x in manifest.ledgers]
                assert len(ids) == len(set(ids)), "no commit applied twice"
                assert (head.ledger_count, head.rows) == (len(ids), manifest.rows)
                assert sorted(x.seq for x in manifest.ledgers) == list(range(1, head.next_seq))
                present = set(ids)
                for w, ks in acked.items():
                    for k in ks:
                        want = {w * 10**7 + k * 100 + i for i in range(1 + k % 13)}
                        assert want <= present, f"worker {w}'s acknowledged commit {k} is missing"
                # Commits are whole: every commit's ledgers are all there or none is.
                by_commit: dict[tuple[int, int], int] = {}
                for lid in ids:
                    key = (lid // 10**7, lid % 10**7 // 100)
                    by_commit[key] = by_commit.get(key, 0) + 1
                assert all(n == 1 + k % 13 for (_, k), n in by_commit.items())
                await client.datasets.collect_orphans("crashy", 0)
                await client.datasets.checkpoint("crashy", 1)

    asyncio.run(check())
