"""The background flusher: one thread that makes rolled entry logs durable, in order.

For each rolled log (Engine.flush_one): fsync the log and its directory -> commit its index entries and the
dirty ledger rows in one synced index transaction -> write the recovery point past it. It also rolls an
active log whose oldest unsynced record is older than log_roll_interval_ms. Between rounds it sleeps until a roll
wakes it (Engine.wake_on_roll) or the active log is due to roll by age (wait_s): an idle bookie's flusher wakes once a
roll interval, not every tick. A failure is logged, kept for
status, and retried with backoff; the log stays queued and adds wait once the write cache fills. Except a failed
sync (SyncLostError, synclost.py): never retried; the thread hands the reason to the engine's on_sync_lost (the
server exits with EXIT_SYNC_LOST) and ends, the engine read-only.
"""

from __future__ import annotations

import logging
import threading

from octavo.node.engine import Engine
from octavo.node.synclost import SyncLostError

log = logging.getLogger(__name__)

FLUSH_RETRY_DELAY_MS_MIN = 50
FLUSH_RETRY_DELAY_MS_MAX = 5_000


class Flusher:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="octavo-flusher", daemon=True)
        # The shortest sleep between rounds: a quarter of the roll interval, at most a second (how late an age roll
        # may be), and how soon a failed flush is tried again.
        self.tick_s = min(1.0, engine.config.log_roll_interval_ms / 1000 / 4)

    def start(self) -> None:
        self._engine.wake_on_roll(self.wake)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def step(self, logs_max: int | None = None) -> int:
        """One round of the flusher's work, on the caller's thread: roll the active log if its oldest record
        is older than the roll interval (by the engine's clock), then flush rolled logs, oldest first (all of
        them, or at most `logs_max`). Returns the logs flushed. Raises what a flush raises. The thread runs
        this; tests that must replay exactly run it themselves instead (Storage.open(start_flusher=False))."""
        engine = self._engine
        engine.roll_if_older_than(engine.config.log_roll_interval_ms / 1000)
        flushed = 0
        while (logs_max is None or flushed < logs_max) and not self._stop.is_set() and engine.flush_one():
            flushed += 1
        return flushed

    def wait_s(self) -> float:
        """How long to sleep before the next round unless a roll wakes it: until the active log is due to roll by
        age, but at least a tick and at most a roll interval (a record written meanwhile, the log's first, is
        due no sooner than that). A tick while rolled logs wait (a flush failed: it is tried again)."""
        engine = self._engine
        if engine.pending_flushes():
            return self.tick_s
        interval_s = engine.config.log_roll_interval_ms / 1000
        age_s = engine.active_log_age_s()
        return min(interval_s, max(self.tick_s, interval_s - (age_s or 0.0)))

    def _run(self) -> None:
        engine = self._engine
        delay_ms = FLUSH_RETRY_DELAY_MS_MIN
        while not self._stop.is_set():
            self._wake.wait(self.wait_s())
            self._wake.clear()
            try:
                self.step()
                engine.set_flush_error("")
                delay_ms = FLUSH_RETRY_DELAY_MS_MIN
            except SyncLostError as e:  # a retry could succeed over dropped pages ("fsyncgate"): stop for good
                engine.set_flush_error(f"{type(e).__name__}: {e}")
                log.critical("background flush stopped: %s", e, extra={"event": "sync_lost"})
                if engine.on_sync_lost is not None:
                    engine.on_sync_lost(e.message)
                return
            except Exception as e:  # keep flushing: a stuck flusher would stall every add (seed 000)
                engine.set_flush_error(f"{type(e).__name__}: {e}")
                log.exception("background flush failed; retrying in %d ms", delay_ms)
                self._stop.wait(delay_ms / 1000)
                delay_ms = min(delay_ms * 2, FLUSH_RETRY_DELAY_MS_MAX)
