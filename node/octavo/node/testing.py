"""Helpers for tests and tools that run real bookie processes: start, wait until serving, kill, restart."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from octavo.node.config import KIB, NodeConfig

BOOKIE_START_TIMEOUT_S = 60.0


def payload_for(ledger_id: int, entry_id: int, size: int = 200) -> bytes:
    """Deterministic bytes for an entry, so a resend carries exactly the same payload."""
    seed = hashlib.sha256(f"{ledger_id}/{entry_id}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def small_config(data_dir: Path | str, **overrides: object) -> NodeConfig:
    """Limits small enough that a test sees logs roll and flush with a few hundred KiB of data."""
    values: dict[str, object] = {
        "data_dir": str(data_dir),
        "log_size_bytes_max": 256 * KIB,
        "batch_bytes_max": 128 * KIB,
        "entry_size_bytes_max": 64 * KIB,
        "read_bytes_max": 64 * KIB,
        "batch_entries_max": 1000,
        "write_cache_entries_max": 20_000,
        "log_rotate_on_close_bytes_min": 0,
    }
    values.update(overrides)
    return NodeConfig(**values)  # type: ignore[arg-type]


def roll_and_flush(storage: Any, timeout_s: float = 10.0) -> None:
    """Roll the active log and wait until the flusher has flushed every rolled log (tests of GC/compaction)."""
    storage.roll()
    deadline = time.monotonic() + timeout_s
    while storage.pending_flushes() and time.monotonic() < deadline:
        time.sleep(0.01)
    if storage.pending_flushes():
        raise AssertionError(f"{storage.pending_flushes()} rolled logs still not flushed after {timeout_s}s")


class BookieProcess:
    """One `octavo node` process on 127.0.0.1, on `port` (0: a port chosen by the OS at each start)."""

    def __init__(self, data_dir: str, args: Sequence[str] = (), env: dict[str, str] | None = None,
                 log_path: str | None = None, new_session: bool = False, wrapper: Sequence[str] = (),
                 port: int = 0) -> None:
        self.data_dir = data_dir
        self.port = port
        self.wrapper = list(wrapper)  # a command the bookie runs under (e.g. unshare + mount of a small tmpfs)
        self.new_session = new_session
        self.args = list(args)
        self.env = env or {}
        self.log_path = log_path or os.path.join(os.path.dirname(os.path.abspath(data_dir)),
                                                 os.path.basename(data_dir) + ".log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""
        self.metrics_address = ""  # host:port of /metrics when started with --metrics-port

    def start(self, timeout_s: float = BOOKIE_START_TIMEOUT_S) -> str:
        ready = os.path.abspath(self.data_dir) + ".ready"
        if os.path.exists(ready):
            os.unlink(ready)
        env = {**os.environ, **self.env}
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen(
                [*self.wrapper, sys.executable, "-m", "octavo.cli.main", "node", "--data-dir", self.data_dir,
                 "--port", str(self.port), "--ready-file", ready, *self.args],
                stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=self.new_session)
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(ready):
            if self.proc.poll() is not None:
                raise RuntimeError(f"bookie exited with {self.proc.returncode} before serving; see {self.log_path}:"
                                   f"\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"bookie did not serve within {timeout_s}s; see {self.log_path}")
            time.sleep(0.02)
        with open(ready) as f:
            lines = f.read().split()
        self.address = lines[0]
        self.metrics_address = next((line.split("=", 1)[1] for line in lines[1:] if line.startswith("metrics=")), "")
        return self.address

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def kill(self, sig: int = signal.SIGKILL) -> int:
        """Send `sig` and wait for the process to end; returns its exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=60)
        self.proc = None
        return code

    def stop(self) -> int:
        """Graceful stop (SIGTERM): the bookie syncs everything and checkpoints."""
        return self.kill(signal.SIGTERM)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class BookieConnection:
    """A plain synchronous gRPC connection to one bookie, for tests and tools (not the client library)."""

    def __init__(self, address: str, max_message_bytes: int = 256 * 1024 * 1024, tls: Any = None) -> None:
        """`tls`: an octavo.meta.tls.TlsFiles to connect over TLS (None: plaintext)."""
        from octavo.meta.tls import sync_channel
        from octavo.v1 import bookie_pb2_grpc as pb_grpc

        self.address = address
        self.channel = sync_channel(address, tls, options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ])
        self.bookie = pb_grpc.BookieStub(self.channel)
        self.admin = pb_grpc.BookieAdminStub(self.channel)
        self._request_id = 0

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> BookieConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_requests(self, requests: list[Any], timeout_s: float = 30) -> list[Any]:
        """Send requests on one AddEntries stream; returns the responses in order."""
        return list(self.bookie.AddEntries(iter(requests), timeout=timeout_s))

    def add(self, ledger_id: int, master_key: bytes, entry_ids: Sequence[int], payloads: Sequence[bytes],
            last_add_confirmed: int = -1, recovery: bool = False) -> Any:
        from octavo.v1 import bookie_pb2 as pb

        self._request_id += 1
        request = pb.AddRequest(request_id=self._request_id, ledgers=[pb.LedgerAdds(
            ledger_id=ledger_id, master_key=master_key, last_add_confirmed=last_add_confirmed,
            recovery=recovery, entry_ids=list(entry_ids), payloads=list(payloads))])
        return self.add_requests([request])[0]

    def read(self, ledger_id: int, first: int, last: int, **kw: Any) -> Any:
        from octavo.v1 import bookie_pb2 as pb

        return self.bookie.ReadEntries(pb.ReadRequest(ledger_id=ledger_id, first_entry_id=first,
                                                      last_entry_id=last, **kw), timeout=30)

    def read_all(self, ledger_id: int, first: int, last: int) -> dict[int, tuple[int, bytes]]:
        """entry id -> (code, payload) for [first, last], following the bookie's read limits."""
        out: dict[int, tuple[int, bytes]] = {}
        entry = first
        while entry <= last:
            resp = self.read(ledger_id, entry, last)
            if resp.error:
                for e in range(entry, last + 1):
                    out[e] = (resp.error, b"")
                break
            for item in resp.entries:
                out[item.entry_id] = (item.code, item.payload)
            entry = resp.entries[-1].entry_id + 1
        return out

    def read_lac(self, ledger_id: int, fence: bool = False, master_key: bytes = b"") -> Any:
        from octavo.v1 import bookie_pb2 as pb

        return self.bookie.ReadLastAddConfirmed(
            pb.ReadLacRequest(ledger_id=ledger_id, fence=fence, master_key=master_key), timeout=30)

    def status(self) -> Any:
        from octavo.v1 import bookie_pb2 as pb

        return self.admin.GetStatus(pb.GetStatusRequest(include_entry_logs=True), timeout=30)


def entry_size(ledger: int) -> int:
    """The entry size PipelinedWriter uses for a ledger: a mix of small, medium and large entries."""
    return (100, 1000, 8000)[ledger % 3]


class PipelinedWriter(threading.Thread):
    """Appends to several ledgers on one stream, WINDOW requests in flight, until stopped or the bookie dies.

    `acked[ledger]` is the highest entry id acknowledged (entries of a ledger are acknowledged in order). It
    starts each round from there: entries sent but not acknowledged before a kill are sent again with the
    same bytes, which the bookie must accept as duplicates or store anew.
    """

    def __init__(self, address: str, acked: dict[int, int], ledgers: list[int], seed: int,
                 master_key: bytes = b"writer-key", window: int = 8) -> None:
        super().__init__(daemon=True)
        self.master_key = master_key
        self.address = address
        self.acked = acked
        self.ledgers = ledgers
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.window = threading.Semaphore(window)
        self.pending: dict[int, tuple[int, list[int]]] = {}
        self.errors: list[str] = []
        self.requests_acked = 0
        self.entries_acked = 0

    def requests(self) -> Iterator[Any]:
        from octavo.v1 import bookie_pb2 as pb

        next_id = {lg: self.acked.get(lg, -1) + 1 for lg in self.ledgers}
        request_id = 0
        while not self.stop.is_set():
            if not self.window.acquire(timeout=0.05):
                continue
            ledger = self.rng.choice(self.ledgers)
            count = self.rng.randrange(1, min(50, 120_000 // entry_size(ledger)))
            ids = list(range(next_id[ledger], next_id[ledger] + count))
            next_id[ledger] += count
            request_id += 1
            self.pending[request_id] = (ledger, ids)
            yield pb.AddRequest(request_id=request_id, ledgers=[pb.LedgerAdds(
                ledger_id=ledger, master_key=self.master_key, last_add_confirmed=self.acked.get(ledger, -1),
                entry_ids=ids, payloads=[payload_for(ledger, e, entry_size(ledger)) for e in ids])])

    def run(self) -> None:
        import grpc

        from octavo.v1 import bookie_pb2 as pb

        try:
            with BookieConnection(self.address) as conn:
                for resp in conn.bookie.AddEntries(self.requests()):
                    ledger, ids = self.pending.pop(resp.request_id)
                    if resp.error:
                        self.errors.append(resp.error_message)
                        return
                    if list(resp.results[0].codes) != [pb.OK] * len(ids):
                        self.errors.append(resp.results[0].message)
                        return
                    self.acked[ledger] = ids[-1]
                    self.requests_acked += 1
                    self.entries_acked += len(ids)
                    self.window.release()
        except grpc.RpcError:
            pass  # the bookie was killed
        finally:
            self.stop.set()
