"""Helpers for tests and tools that run real bookie processes: start, wait until serving, kill, restart."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

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


class BookieProcess:
    """One `octavo node` process on 127.0.0.1 with a port chosen by the OS."""

    def __init__(self, data_dir: str, args: Sequence[str] = (), env: dict[str, str] | None = None,
                 log_path: str | None = None) -> None:
        self.data_dir = data_dir
        self.args = list(args)
        self.env = env or {}
        self.log_path = log_path or os.path.join(os.path.dirname(os.path.abspath(data_dir)),
                                                 os.path.basename(data_dir) + ".log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""

    def start(self, timeout_s: float = BOOKIE_START_TIMEOUT_S) -> str:
        ready = os.path.abspath(self.data_dir) + ".ready"
        if os.path.exists(ready):
            os.unlink(ready)
        env = {**os.environ, **self.env}
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "octavo.cli.main", "node", "--data-dir", self.data_dir, "--port", "0",
                 "--ready-file", ready, *self.args],
                stdout=log_file, stderr=subprocess.STDOUT, env=env)
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
            self.address = f.read().strip()
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
