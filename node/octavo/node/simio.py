"""A FileIO that remembers what each fsync made durable, and can simulate a power loss.

Used by the power-loss tests (node/tests/test_powerloss.py). It does the real IO on a real directory and in
addition keeps, like a disk would after a power cut:
- per inode, the content as of its last fsync/fdatasync;
- per directory, the names (and the inodes they point to) as of its last directory fsync;
- for the LMDB index, whose IO happens in C, the whole index directory as of each `index_synced()`.

`crash()` makes every later call fail (the machine is gone; threads still running see IO errors).
`power_loss(rng)` then rewrites the directory tree to what survives: durable names only, each file's durable
content, plus, for a file whose inode the directory still points at, a random prefix of the bytes written after
its last fsync (the OS may have written some of them back), cut at a random point (a torn write).
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import threading

from octavo.node.fileio import FileIO
from octavo.node.files import TMP_SUFFIX


class MachineCrashed(OSError):
    pass


class SimIO(FileIO):
    def __init__(self, root: str, crash_at_op: int | None = None) -> None:
        self.root = os.path.abspath(root)
        # The machine dies at this IO call (counted from 1 over every tracked call), if set: a single-threaded
        # run cut at a seeded call replays exactly.
        self.crash_at_op = crash_at_op
        self.ops = 0
        self._lock = threading.Lock()
        self._fd_paths: dict[int, str] = {}
        # A file is known by (inode, generation): the filesystem reuses a freed inode number for a new file,
        # and the new file must not inherit what the old one had made durable. Each file created or freed
        # through this IO moves its inode to a new generation.
        self._generations = itertools.count(1)
        self._generation: dict[int, int] = {}
        self._inode_durable: dict[tuple[int, int], bytes] = {}
        self._dir_durable: dict[str, dict[str, tuple[int, int]]] = {}
        self._index_snapshot: dict[str, dict[str, bytes]] = {}
        self.crashed = False
        self.fsyncs = 0

    def _ident(self, ino: int) -> tuple[int, int]:
        return ino, self._generation.get(ino, 0)

    def _new_generation(self, ino: int) -> None:
        with self._lock:
            self._generation[ino] = next(self._generations)

    def _check(self) -> None:
        self.ops += 1
        if self.crash_at_op is not None and self.ops >= self.crash_at_op:
            self.crashed = True
        if self.crashed:
            raise MachineCrashed(5, "simulated machine crash")

    # -- tracked operations ----------------------------------------------------------------------
    def open_append(self, path: str, create: bool) -> int:
        self._check()
        fd = super().open_append(path, create)
        self._fd_paths[fd] = os.path.abspath(path)
        if create:
            self._new_generation(os.fstat(fd).st_ino)
        return fd

    def open_read(self, path: str) -> int:
        self._check()
        fd = super().open_read(path)
        self._fd_paths[fd] = os.path.abspath(path)
        return fd

    def write_at_end(self, fd: int, data: bytes | memoryview) -> None:
        self._check()
        super().write_at_end(fd, data)

    def write_parts(self, fd: int, parts: list[bytes] | list[bytes | memoryview], total_bytes: int) -> None:
        self._check()
        super().write_parts(fd, parts, total_bytes)

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        self._check()
        return super().pread(fd, length, offset)

    def truncate(self, fd: int, length: int) -> None:
        self._check()
        super().truncate(fd, length)

    def _snapshot_fd(self, fd: int) -> None:
        # Read under the lock, as fsync_dir lists: of two syncs of one file, the one that stores last saw the
        # file last, so an older image never replaces a newer one.
        with self._lock:
            size = os.fstat(fd).st_size
            content = os.pread(fd, size, 0) if size else b""
            self._inode_durable[self._ident(os.fstat(fd).st_ino)] = content
            self.fsyncs += 1

    def fsync(self, fd: int) -> None:
        self._check()
        super().fsync(fd)
        self._snapshot_fd(fd)

    def fdatasync(self, fd: int) -> None:
        self._check()
        super().fdatasync(fd)
        self._snapshot_fd(fd)

    def close(self, fd: int) -> None:
        self._fd_paths.pop(fd, None)
        super().close(fd)

    def fsync_dir(self, path: str) -> None:
        self._check()
        super().fsync_dir(path)
        path = os.path.abspath(path)
        # Listed under the lock: two threads syncing one directory (the flusher after a log, a roll after
        # creating the next one) store their listings in the order they took them. Listed outside it, a listing
        # taken before the new log existed could be stored after the roll's and lose the new log's name, and
        # with it every add acknowledged in it (a group-commit power-loss test saw this once in CI).
        with self._lock:
            # One scandir: its entries know their type and inode without a stat each (a symlink's inode is its
            # target's, as os.stat would give).
            with os.scandir(path) as entries:
                names = {e.name: self._ident(e.stat().st_ino if e.is_symlink() else e.inode())
                         for e in entries if e.is_file()}
            self._dir_durable[path] = names

    def write_file_atomic(self, path: str, data: bytes) -> None:
        self._check()
        tmp = path + TMP_SUFFIX
        fd = self.open_append(tmp, create=not os.path.exists(tmp))
        try:
            os.ftruncate(fd, 0)
            self.write_at_end(fd, data)
            self.fsync(fd)
        finally:
            self.close(fd)
        self.rename(tmp, path)
        self.fsync_dir(os.path.dirname(path) or ".")

    def rename(self, src: str, dst: str) -> None:
        self._check()
        replaced = os.stat(dst).st_ino if os.path.isfile(dst) else None
        super().rename(src, dst)
        if replaced is not None:
            self._new_generation(replaced)  # freed: a later file may get its number

    def unlink(self, path: str) -> None:
        self._check()
        ino = os.stat(path).st_ino if os.path.isfile(path) else None
        super().unlink(path)
        if ino is not None:
            self._new_generation(ino)

    def index_synced(self, index_dir: str) -> None:
        self._check()
        snap = {}
        for name in os.listdir(index_dir):
            if name == "lock.mdb":
                continue
            with open(os.path.join(index_dir, name), "rb") as f:
                snap[name] = f.read()
        with self._lock:
            self._index_snapshot[os.path.abspath(index_dir)] = snap

    def settle(self, index_dirs: tuple[str, ...] = ()) -> None:
        """Take everything on disk now as durable (a machine booting again after a power cut: what it finds is
        what the disk holds), the LMDB index directories named too. A later power_loss starts from here."""
        for dirpath, _, files in os.walk(self.root):
            dirpath = os.path.abspath(dirpath)
            names = {}
            for name in files:
                path = os.path.join(dirpath, name)
                ident = self._ident(os.stat(path).st_ino)
                names[name] = ident
                with open(path, "rb") as f:
                    self._inode_durable[ident] = f.read()
            self._dir_durable[dirpath] = names
        for index_dir in index_dirs:
            if os.path.isdir(index_dir):
                self.index_synced(index_dir)

    # -- the power cut ---------------------------------------------------------------------------
    def crash(self) -> None:
        self.crashed = True

    def power_loss(self, rng: random.Random, keep_unsynced: bool = True) -> dict[str, str]:
        """Rewrite the tree under root to what a power cut leaves. Returns what happened to each file."""
        self.crashed = True
        report: dict[str, str] = {}
        with self._lock:
            for dirpath, dirs, files in os.walk(self.root):
                dirs.sort()  # a fixed order: the rng decides the same thing for the same file in every run
                dirpath = os.path.abspath(dirpath)
                if dirpath in self._index_snapshot:
                    continue
                durable_names = self._dir_durable.get(dirpath, {})
                for name in sorted(files):
                    path = os.path.join(dirpath, name)
                    ident = self._ident(os.stat(path).st_ino)
                    if name not in durable_names:
                        os.unlink(path)
                        report[path] = "lost (name never synced)"
                        continue
                    durable = self._inode_durable.get(durable_names[name], b"")
                    with open(path, "rb") as f:
                        current = f.read()
                    content = durable
                    if durable_names[name] != ident:
                        report[path] = "old version (rename not synced)"
                    elif keep_unsynced and current.startswith(durable) and len(current) > len(durable):
                        extra = rng.randrange(len(current) - len(durable) + 1)
                        content = current[:len(durable) + extra]
                        report[path] = f"durable {len(durable)} + {extra} of {len(current) - len(durable)} unsynced"
                    else:
                        report[path] = f"durable {len(durable)} of {len(current)}"
                    with open(path, "wb") as f:
                        f.write(content)
            for index_dir, snap in self._index_snapshot.items():
                shutil.rmtree(index_dir)
                os.makedirs(index_dir)
                for name, content in snap.items():
                    with open(os.path.join(index_dir, name), "wb") as f:
                        f.write(content)
                report[index_dir] = "index as of its last sync"
        return report
