"""The file operations the storage engine uses, behind one object so a test can replace them.

The engine never calls `os` for data files directly: it calls a `FileIO`. The default does the real thing;
the power-loss harness (`SimIO` in node/octavo/node/simio.py, used by node/tests/test_powerloss.py) subclasses
it to remember what each fsync made durable and, on a simulated power loss, puts every file back to that image
(plus a random torn prefix of what was not).
"""

from __future__ import annotations

import os

from octavo.node.files import TMP_SUFFIX

# Buffers per writev call (Linux's IOV_MAX).
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
# Below this average part size a batch is joined and written with one write() instead of writev().
WRITEV_PART_BYTES_MIN = 4096


class FileIO:
    """Real file IO. Every method is a thin, documented wrapper; errors are the OSErrors of the calls."""

    def open_append(self, path: str, create: bool) -> int:
        """An fd for appending at the end of `path` (created, exclusively, if `create`), readable with pread."""
        flags = os.O_RDWR | os.O_CLOEXEC
        if create:
            flags |= os.O_CREAT | os.O_EXCL
        return os.open(path, flags, 0o644)

    def open_read(self, path: str) -> int:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def write_at_end(self, fd: int, data: bytes | memoryview) -> None:
        """Write all of `data` at the fd's position (the end of the log: the engine only appends)."""
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]

    def write_parts(self, fd: int, parts: list[bytes] | list[bytes | memoryview], total_bytes: int) -> None:
        """Write the concatenation of `parts` (`total_bytes` in all) at the fd's position.

        Large parts go out with writev, which saves copying the batch into one buffer first; small ones are
        joined and written once, because the kernel's per-buffer cost of writev then outweighs the copy
        (measured: join+write ~1.5-2x faster than writev for 100 B and 1 KB records, writev faster for 64 KB).
        """
        if total_bytes < len(parts) * WRITEV_PART_BYTES_MIN:
            self.write_at_end(fd, b"".join(parts))
            return
        for start in range(0, len(parts), IOV_MAX):
            chunk = parts[start:start + IOV_MAX]
            written = os.writev(fd, chunk)
            total = sum(map(len, chunk))
            if written < total:  # a short write: finish the chunk the plain way
                self.write_at_end(fd, memoryview(b"".join(chunk))[written:])

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        return os.pread(fd, length, offset)

    def seek_end(self, fd: int) -> int:
        return os.lseek(fd, 0, os.SEEK_END)

    def truncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)
        os.lseek(fd, length, os.SEEK_SET)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def write_file_atomic(self, path: str, data: bytes) -> None:
        """Replace `path` with `data` so that a crash leaves either the old or the new content, never a mix:
        write a temporary file, fsync it, rename it over `path`, fsync the directory."""
        tmp = path + TMP_SUFFIX
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            self.write_at_end(fd, data)
            self.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        self.fsync_dir(os.path.dirname(path) or ".")

    def read_file(self, path: str) -> bytes | None:
        """The whole content of a small file, or None if it does not exist."""
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def file_size(self, path: str) -> int:
        return os.stat(path).st_size

    def index_synced(self, index_dir: str) -> None:
        """Called after the index store has synced: real IO has nothing to do (the harness snapshots)."""
