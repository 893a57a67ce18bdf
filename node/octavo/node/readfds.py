"""The read fds of a bookie's entry logs, under one lock: a bounded LRU of flushed logs' fds
(`open_log_files_max`) and the pinned fds of compaction logs, which are never evicted (between its index
switch and its rename to a normal log name a compaction log cannot be reopened by its log name).

Logs not yet flushed (the active one, the rolled ones) keep their own fds; `pread` asks the engine for those
under this lock, so a log being flushed meanwhile cannot have its fd closed under the read.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable

from octavo.node.fileio import FileIO
from octavo.node.files import log_file_name


class ReadFds:
    def __init__(self, io: FileIO, logs_dir: str, files_max: int) -> None:
        self.io = io
        self.logs_dir = logs_dir
        self.files_max = files_max
        self._lock = threading.Lock()
        self._lru: OrderedDict[int, int] = OrderedDict()
        self._pinned: dict[int, int] = {}

    def pread(self, log_id: int, length: int, offset: int, unflushed_fd: Callable[[int], int | None]) -> bytes:
        """`length` bytes at `offset` of log `log_id`: through the fd of an unflushed log (asked under the
        lock), a pinned fd, a cached one, or a newly opened one that joins the LRU."""
        with self._lock:
            fd = unflushed_fd(log_id)
            if fd is None:
                fd = self._pinned.get(log_id)
            if fd is None:
                fd = self._lru.get(log_id)
                if fd is not None:
                    self._lru.move_to_end(log_id)
            if fd is None:
                fd = self.io.open_read(os.path.join(self.logs_dir, log_file_name(log_id)))
                self._remember_locked(log_id, fd)
            return self.io.pread(fd, length, offset)

    def adopt(self, log_id: int, fd: int) -> None:
        """A flushed log's fd stays open for reads, in the bounded LRU."""
        with self._lock:
            self._remember_locked(log_id, fd)

    def pin(self, log_id: int, fd: int) -> None:
        with self._lock:
            self._pinned[log_id] = fd

    def unpin(self, log_id: int, keep: bool) -> None:
        """End a pin: the fd joins the LRU (keep: the file now has its log name) or is closed."""
        with self._lock:
            fd = self._pinned.pop(log_id, None)
            if fd is None:
                return
            if keep:
                self._remember_locked(log_id, fd)
            else:
                self.io.close(fd)

    def delete_file(self, log_id: int, path: str) -> int | None:
        """Close the log's cached fd and unlink its file, under the lock (no read reopens it meanwhile).
        Returns the file's size, None if it was already gone."""
        with self._lock:
            fd = self._lru.pop(log_id, None)
            if fd is not None:
                self.io.close(fd)
            try:
                size = self.io.file_size(path)
                self.io.unlink(path)
            except FileNotFoundError:
                return None
            return size

    def close_all(self) -> None:
        with self._lock:
            for fd in [*self._lru.values(), *self._pinned.values()]:
                self.io.close(fd)
            self._lru.clear()
            self._pinned.clear()

    def _remember_locked(self, log_id: int, fd: int) -> None:
        self._lru[log_id] = fd
        while len(self._lru) > self.files_max:
            _, old = self._lru.popitem(last=False)
            self.io.close(old)
