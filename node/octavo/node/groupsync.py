"""Group commit of the active entry log, for fsync_policy = "batch" (BookKeeper's journal does the same).

Adds are written to the active log as they come, under the engine lock and in order, as with the default policy.
What changes is the acknowledgement: an add is answered only once an fdatasync of its log that *began after its
write completed* has finished. One sync is in flight at a time; the requests written while it runs wait for the
next one, which covers all of them. So a busy bookie pays one fdatasync per round, not one per request.

The rules, checked here:
- `written(log_id, end)` is called under the engine lock right after a write of [.., end) to the active log
  returned; a sync round reads the written end when it begins (under this module's lock), so it covers every
  write noted before it began.
- The group sync syncs through fds of its own, each a separate open of the log's file (never a dup of the
  engine's fd), so the flusher closing the engine's fd of a rolled log never pulls one from under a round, and a
  writeback error is reported to the group sync even when the flusher's fsync of the log reported it first
  (Linux reports it once per open file description, and dup'd fds share one).
- A roll (`roll`, under the engine lock, often on the event loop) returns at once: the old log joins the rolled
  logs the next round syncs whole, and the new log's name is made durable by that round's directory sync before
  any add in it is answered. (The roll used to sync the old log itself, stalling the loop once a roll.)
- A point (log id, end) is covered when a finished round covered `end` of its log (the active one, or one rolled
  while that round ran), or when its log is older and not among the rolled logs still to sync (synced whole
  since its roll, or below the recovery point). The logs a start replays count as rolled: the last process may
  have died before syncing them.
- A failed fdatasync fails every add waiting on it and every later one (`failure` is kept until the bookie
  restarts): after EIO the kernel may have dropped the dirty pages and a later fdatasync can succeed without
  them (Linux marks them clean), so nothing written to this disk is acknowledged again in this process. The
  records stay in the log, unacknowledged (docs/durability.md, "fsync_policy = batch").

Waiters are asyncio futures (the data plane) or threads blocked in `wait_blocking` (the engine's synchronous API);
the rounds for the futures run on one thread of their own. The waiters are bounded by the add requests in flight:
the data plane holds at most ADD_REQUESTS_AWAITING_SYNC_MAX per stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from octavo.node.fileio import FileIO

# A stream's add requests written but not yet answered because their sync has not finished. Above the client's
# pipelining window (bookie_client.REQUESTS_IN_FLIGHT_MAX, 8), so a client never waits on it; a client that
# sends more is slowed by gRPC flow control (the handler stops reading).
ADD_REQUESTS_AWAITING_SYNC_MAX = 16


@dataclass(frozen=True, slots=True)
class SyncPoint:
    """Bytes [0, end) of entry log `log_id` must be durable before the add is answered."""

    log_id: int
    end: int


@dataclass(slots=True)
class _Waiter:
    point: SyncPoint
    future: asyncio.Future[OSError | None]
    loop: asyncio.AbstractEventLoop


def _settle(future: asyncio.Future[OSError | None], outcome: OSError | None) -> None:
    if not future.done():  # a cancelled stream's waiter
        future.set_result(outcome)


class GroupSync:
    """The group commit of one bookie's active entry log (see the module docstring)."""

    def __init__(self, io: FileIO, log_id: int, path: str, size: int, sync_dir: Callable[[], None],
                 replayed: list[tuple[int, str, int]]) -> None:
        """`log_id`, `path`, `size`: the active log, just created. `replayed`: (log id, path, size) of the logs this
        start replayed: written by the last process and maybe never synced (it died before the flusher got to
        them), yet a resend of an entry in them is answered OK without a second copy, so the first round syncs
        them whole, after the directory (their names and the active log's may not be durable either)."""
        self._io = io
        self._sync_dir = sync_dir  # fsync of the logs directory: a new log's name is durable
        self._cond = threading.Condition(threading.Lock())
        self._log_id = log_id
        self._fd = io.open_read(path)  # our own open file description (see the module docstring)
        self._written = size   # bytes of the active log written (noted under the engine lock)
        self._synced = 0       # bytes of the active log a finished round covered
        # Rolled (or replayed) logs not yet synced whole since their roll: log id -> (our fd, its size then, the bytes
        # of it a finished round covered). A log older than the active one and not here is durable (synced by a
        # round, or below the recovery point).
        self._rolled: dict[int, tuple[int, int, int]] = {
            lid: (io.open_read(rpath), rsize, 0) for lid, rpath, rsize in replayed}
        self._dir_pending = True   # a log was created (or replayed) since the last directory sync began
        self._failure: OSError | None = None
        self._in_flight = False
        self._waiters: list[_Waiter] = []
        self._runner = False   # a round loop is queued or running on the executor for the async waiters
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="octavo-groupsync")
        self.syncs = 0         # finished fdatasync rounds (the closing roll's included)
        self.waited = 0        # adds that waited for a round

    # ------------------------------------------------------------------------------------------------
    # The engine's side (under the engine lock)

    def written(self, log_id: int, end: int) -> None:
        """A write to the active log returned: bytes [0, end) are in the page cache."""
        with self._cond:
            if log_id != self._log_id or end < self._written:
                raise RuntimeError(f"group sync: write to log {log_id} ending at {end}, but the active log is "
                                   f"{self._log_id} with {self._written} bytes written")
            self._written = end

    def point(self) -> SyncPoint:
        """Where the active log's writes end now: an add written before this call is durable once it is."""
        with self._cond:
            return SyncPoint(self._log_id, self._written)

    def roll(self, log_id: int | None, path: str, size: int) -> None:
        """The engine rolled the active log to `log_id`, the file `path` it just created: returns at once (the engine
        holds its lock, often on the event loop). The old log joins the rolled logs the next round syncs (with
        the directory, for the new log's name); a round in flight keeps its own fd of it. `None`: the engine
        closes: everything is synced here and now, and no point taken later is ever covered."""
        if log_id is None:
            self._close()
            return
        fd = self._io.open_read(path)  # may raise (EMFILE): nothing changed
        with self._cond:
            if self._in_flight or self._written > self._synced:
                self._rolled[self._log_id] = (self._fd, self._written, self._synced)
            else:
                self._io.close(self._fd)  # synced whole, and no round uses it
            self._log_id, self._fd, self._written, self._synced = log_id, fd, size, 0
            self._dir_pending = True

    def _close(self) -> None:
        with self._cond:
            while self._in_flight:
                self._cond.wait()
            if self._failure is None:
                try:
                    if self._dir_pending:
                        self._sync_dir()
                        self._dir_pending = False
                    for lid, (rolled_fd, _, _) in list(self._rolled.items()):
                        self._io.fdatasync(rolled_fd)
                        del self._rolled[lid]
                        self._io.close(rolled_fd)
                    if self._written > self._synced:
                        self._io.fdatasync(self._fd)
                        self._synced = self._written
                    self.syncs += 1
                except OSError as e:
                    self._failure = e
            self._failure = self._failure or OSError(errno.ESHUTDOWN, "the bookie is shutting down")
            settled = self._take_settled_locked()
            self._retire_locked()
            self._cond.notify_all()
        _settle_all(settled)

    def _retire_locked(self) -> None:
        """No round runs again (the failure is set): close our fds. A log not synced whole stays in `_rolled`, so
        its points get the failure; a point taken from now on is in a log after the last: never covered."""
        for rolled_fd, _, _ in self._rolled.values():
            if rolled_fd >= 0:
                self._io.close(rolled_fd)
        self._rolled = {lid: (-1, end, synced) for lid, (_, end, synced) in self._rolled.items()}
        if self._written > self._synced:
            self._rolled[self._log_id] = (-1, self._written, self._synced)
        if self._fd >= 0:
            self._io.close(self._fd)
        self._log_id, self._fd, self._written, self._synced = self._log_id + 1, -1, 0, -1

    def abandon(self) -> None:
        """Drop every waiter unanswered (failed) without syncing: a simulated crash (Storage.abandon)."""
        with self._cond:
            while self._in_flight:
                self._cond.wait()
            self._failure = self._failure or OSError(errno.ESHUTDOWN, "the bookie stopped")
            settled = self._take_settled_locked()
            if self._fd >= 0:
                self._retire_locked()
            self._cond.notify_all()
        _settle_all(settled)
        self._executor.shutdown(wait=False)

    def shutdown(self) -> None:
        """After the closing roll: every waiter is settled; stop the round thread."""
        self._executor.shutdown(wait=True)

    @property
    def failure(self) -> OSError | None:
        return self._failure

    # ------------------------------------------------------------------------------------------------
    # The waiters' side

    async def wait(self, point: SyncPoint) -> OSError | None:
        """Wait until `point` is durable (None) or cannot be (the failure)."""
        return await self.waiter(point)

    def waiter(self, point: SyncPoint) -> asyncio.Future[OSError | None]:
        """A future of the running loop that gets None once `point` is durable or the failure if it cannot be;
        starts the round loop if none runs. Taken right after the write, so the next round starts at once."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[OSError | None] = loop.create_future()
        with self._cond:
            done, outcome = self._outcome_locked(point)
            if done:
                future.set_result(outcome)
                return future
            self._waiters.append(_Waiter(point, future, loop))
            self.waited += 1
            start = not self._runner
            self._runner = True
        if start:
            self._executor.submit(self._run_rounds)
        return future

    def wait_blocking(self, point: SyncPoint) -> OSError | None:
        """wait() for a thread (the engine's synchronous add API): runs the round itself when none is in flight,
        so a caller without a round thread (a stepped test) never waits for one."""
        counted = False
        while True:
            with self._cond:
                while True:
                    done, outcome = self._outcome_locked(point)
                    if done:
                        return outcome
                    if not counted:
                        self.waited += 1
                        counted = True
                    if not self._in_flight:
                        break
                    self._cond.wait()
                round_ = self._begin_locked()
            self._round(round_)

    # ------------------------------------------------------------------------------------------------
    # Rounds

    def _run_rounds(self) -> None:
        """The round loop of the async waiters (on the executor's thread): sync while any waits."""
        try:
            while True:
                with self._cond:
                    while self._in_flight:
                        self._cond.wait()
                    settled = self._take_settled_locked()
                    if not self._waiters:
                        self._runner = False
                        break
                    round_ = self._begin_locked()
                _settle_all(settled)
                self._round(round_)
        except BaseException as e:  # an invariant broke: fail the waiters rather than leave them hanging
            with self._cond:
                self._failure = self._failure or OSError(errno.EIO, f"group sync failed: {e}")
                self._runner = False
                settled = self._take_settled_locked()
                self._cond.notify_all()
            _settle_all(settled)
            raise
        _settle_all(settled)

    def _begin_locked(self) -> _Round:
        if self._in_flight or self._fd < 0:
            raise RuntimeError(f"group sync: a round began on log {self._log_id} while another was in flight "
                               "or after the last log was handed over")
        self._in_flight = True
        round_ = _Round(self._dir_pending, [(lid, fd) for lid, (fd, _, _) in self._rolled.items()],
                        self._log_id, self._fd, self._written)
        self._dir_pending = False
        return round_

    def _round(self, round_: _Round) -> None:
        """One round: the logs directory if a log was created since the last one began, the rolled logs not yet
        synced whole, then the active log up to what was written when the round began. No lock is held while it
        runs; the fds are ours, so a roll meanwhile changes nothing under it."""
        # Failed until every sync returned: anything else raised (a bug, an interrupt) must not count as synced.
        error: OSError | None = OSError(errno.EIO, "group sync: a round did not finish")
        try:
            if round_.sync_dir:
                self._sync_dir()
            for _, rolled_fd in round_.rolled:
                self._io.fdatasync(rolled_fd)
            self._io.fdatasync(round_.fd)
            error = None
        except OSError as e:
            error = e
        finally:
            with self._cond:
                try:
                    if error is not None:
                        self._failure = self._failure or error
                        if round_.sync_dir:
                            self._dir_pending = True
                    else:
                        self.syncs += 1
                        for lid, rolled_fd in round_.rolled:  # each synced whole: its size was fixed at its roll
                            del self._rolled[lid]
                            self._io.close(rolled_fd)
                        self._covered_locked(round_.log_id, round_.covered)
                finally:  # even if an invariant broke above: no waiter is left waiting for a round that ended
                    self._in_flight = False
                    settled = self._take_settled_locked()
                    self._cond.notify_all()
            _settle_all(settled)

    def _covered_locked(self, log_id: int, covered: int) -> None:
        """A round synced log `log_id` up to `covered`: the active log, or one rolled while the round ran (whose
        adds the round covered are answered now, not after the next round syncs the log whole)."""
        if log_id == self._log_id:
            self._synced = max(self._synced, covered)
            return
        rolled = self._rolled.get(log_id)
        if rolled is None:
            raise RuntimeError(f"group sync: a round synced log {log_id}, neither active nor rolled")
        fd, size, synced = rolled
        if covered < size:
            self._rolled[log_id] = (fd, size, max(synced, covered))
            return
        del self._rolled[log_id]  # it got nothing after the round began: whole
        self._io.close(fd)

    def _outcome_locked(self, point: SyncPoint) -> tuple[bool, OSError | None]:
        """(True, None): durable; (True, the failure): it never will be; (False, None): not yet."""
        if point.log_id > self._log_id:
            raise RuntimeError(f"group sync: point in log {point.log_id}, after the active log {self._log_id}")
        if point.log_id == self._log_id:
            if point.end <= self._synced:
                return True, None
        elif point.log_id not in self._rolled or point.end <= self._rolled[point.log_id][2]:
            return True, None
        if self._failure is not None:
            return True, self._failure
        return False, None

    def _take_settled_locked(self) -> list[tuple[_Waiter, OSError | None]]:
        settled: list[tuple[_Waiter, OSError | None]] = []
        waiting: list[_Waiter] = []
        for w in self._waiters:
            done, outcome = self._outcome_locked(w.point)
            if done:
                settled.append((w, outcome))
            elif not w.future.done():  # a cancelled stream's waiter is dropped
                waiting.append(w)
        self._waiters = waiting
        return settled


@dataclass(frozen=True, slots=True)
class _Round:
    """What one round syncs, fixed when it begins."""

    sync_dir: bool
    rolled: list[tuple[int, int]]  # (log id, our fd) of the rolled logs not yet synced whole
    log_id: int                    # the active log then, and our fd of it
    fd: int
    covered: int                   # its bytes written then


def failure_message(error: OSError) -> str:
    """What an add whose group sync failed is told."""
    return (f"the entry log's fdatasync failed ({error}): the add is not acknowledged, and under fsync_policy=batch "
            "this bookie acknowledges no more adds until it restarts")


def _settle_all(settled: list[tuple[_Waiter, OSError | None]]) -> None:
    for w, outcome in settled:
        with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits any more
            w.loop.call_soon_threadsafe(_settle, w.future, outcome)
