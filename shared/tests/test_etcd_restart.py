"""The etcd client across a restart of its one etcd server, on a real etcd: a read whose connection breaks
under it is sent again instead of failing."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from octavo.cli.localcluster import EtcdProcess
from octavo.meta.errors import MetadataUnavailableError
from octavo.meta.etcd import EtcdClient, Txn


@pytest.mark.parametrize("how", ["get", "transaction of gets"])
async def test_a_read_whose_connection_breaks_under_it_is_sent_again_to_a_lone_endpoint(tmp_path: Path,
                                                                                         how: str) -> None:
    """The read is in flight to a frozen etcd when that etcd is killed (the kernel resets the connection: gRPC
    answers UNAVAILABLE, "Socket closed", at once despite wait_for_ready) and started again on the same port. A
    bookie's first-contact check is such a read: failing it refused a writer's adds with INTERNAL and made the
    writer drop a healthy bookie (CI of 71026b1, test_failures); that check is a transaction of gets, which the
    caller does not mark read_only (the CI of 52d2317 failed the same way after the fix for gets alone)."""
    proc = EtcdProcess(str(tmp_path / "data"))
    proc.start()
    try:
        async with EtcdClient(proc.endpoint, timeout_s=20.0) as client:
            await client.put(b"k", b"v")
            assert proc.proc is not None
            os.kill(proc.proc.pid, signal.SIGSTOP)
            stopped_by = time.monotonic() + 10
            while _state(proc.proc.pid) != "T":  # really frozen before the read goes out (CI once saw it answered)
                assert time.monotonic() < stopped_by, "etcd did not stop on SIGSTOP"
                await asyncio.sleep(0.01)
            async def read_value() -> bytes | None:
                if how == "get":
                    kv = await client.get(b"k")
                    return None if kv is None else kv.value
                _, resp = await client.txn(Txn().get(b"k"))
                kvs = resp.responses[0].response_range.kvs
                return kvs[0].value if kvs else None

            read = asyncio.ensure_future(read_value())
            await asyncio.sleep(0.5)
            assert not read.done()
            os.kill(proc.proc.pid, signal.SIGKILL)
            proc.proc.wait()
            proc.start()
            try:
                value = await asyncio.wait_for(read, 30)
            except MetadataUnavailableError as e:
                raise AssertionError(f"the read was not sent again after its connection broke: {e}") from e
            assert value == b"v"
    finally:
        if proc.proc is not None and proc.proc.poll() is None:
            os.kill(proc.proc.pid, signal.SIGCONT)  # a frozen etcd would not stop on SIGTERM
        proc.stop()


def _state(pid: int) -> str:
    """The process's state letter in /proc (T: stopped)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]
