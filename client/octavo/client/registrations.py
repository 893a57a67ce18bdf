"""The client's view of the bookie registrations: kept current by one etcd watch, read again only when the
watch cannot vouch for it.

Every ledger creation, open and ensemble change, and the bookies' self-healing passes, ask for the
registrations as they are now (`bookies(refresh=True)`). Reading the registrations prefix for each of them made
etcd's load grow with the creations. As BookKeeper's RegistrationClient does with ZooKeeper watches, the view
is kept by one watch on the registrations prefix and served from memory:

- The watch starts with the first `bookies()` call. Once etcd has created it, the prefix is read once: a change
  made after that read is reported by the watch, one made before it is in the read. The first calls wait for
  that read (up to WATCH_FIRST_VIEW_WAIT_S, then they read on their own) rather than make one more.
- Each response's changes are applied to the view as they come, with no read (as BookKeeper's
  RegistrationClient applies its watch's): a put brings the bookie's registration (decoded as a read decodes
  it), a delete takes it away. A response is applied whole and the view changes once for it: etcd sends the
  events of one revision in one response, so a bookie changing mode (a transaction that puts one key and
  deletes the other) is one change, and the read-only key wins if both are there, as in a read. The view knows
  the revision it reflects (its last read's, then its last event's) and skips events it already holds.
- The prefix is read again instead when the events cannot be applied on their own: a value that does not
  decode, or a read in flight (or asked for) that may or may not hold them. The responses that arrive while a
  read is in flight share the next read.
- `bookies(refresh=True)` is served without an etcd call while the watch is live, no change it reported is
  unread, and the view was confirmed (by a read, or by a watch response) less than `ttl_s` ago. A stream can
  go silent without breaking (a partition, a frozen etcd), so a view older than that is read again before it is
  served: an idle cluster costs one read per `ttl_s` per client, not one per creation.
- When the watch fails or ends, `bookies(refresh=True)` reads etcd as it did before the watch (one read shared
  by the concurrent callers), and the watch is established again after a pause (doubling, jittered, capped):
  changes in the gap are not replayed, so the read after the new watch is created catches up.
- `close()` cancels the watch and the reader; a closed view never starts the watch again.

Every change of the view, whatever its source, goes to `on_change(before, after)` (the client replaces the
connections of bookies that moved or restarted).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from octavo.meta.errors import MetadataUnavailableError
from octavo.meta.etcdwatch import WatchEvent
from octavo.meta.keyrange import WatchPosition, WatchRange
from octavo.meta.metadata import BookieInfo, MetadataStore
from octavo.meta.retry import backoff_s

log = logging.getLogger(__name__)

# Pauses between attempts to establish the watch again (doubling from the first, half jittered, up to the
# last); it is retried for as long as the client is open, and reads serve the callers meanwhile.
WATCH_RETRY_S_INITIAL = 0.5
WATCH_RETRY_S_MAX = 10.0
# How long the calls that started the watch wait for its first view (created, then read) before they read etcd
# themselves: etcd answers in milliseconds, so a wait this long means etcd is away and the read fails as before.
WATCH_FIRST_VIEW_WAIT_S = 1.0

Registrations = dict[str, BookieInfo]


def registrations_of(by_key: dict[bytes, BookieInfo], readonly_prefix: bytes) -> Registrations:
    """The registrations by bookie id, from the registrations by etcd key, as MetadataStore.bookies() makes them
    from a read: in key order, and a bookie registered under both prefixes counts as read-only."""
    out: Registrations = {}
    for key in sorted(by_key):
        info = by_key[key]
        if key.startswith(readonly_prefix) or info.bookie_id not in out:
            out[info.bookie_id] = info
    return out


class RegistrationView:
    def __init__(self, store: MetadataStore, ttl_s: float,
                 on_change: Callable[[Registrations, Registrations], None]) -> None:
        if not ttl_s >= 0:
            raise ValueError(f"the registrations' ttl_s must be zero or more, got {ttl_s!r}")
        self.store = store
        self.ttl_s = ttl_s
        self.on_change = on_change
        self.current: Registrations = {}
        # The registrations by etcd key, and the etcd revision they reflect (every change up to it, none after).
        self.by_key: dict[bytes, BookieInfo] = {}
        self.revision = 0
        # When the view was last confirmed (the event loop's clock): a read, or a watch response.
        self.confirmed_at = -1e9
        # The watch is established and the prefix was read after etcd created it.
        self.live = False
        self.closed = False
        self.reads = 0  # prefix reads made: what the watch saves is visible in tests and measurements
        self._reading = False  # a read is in flight
        # Change batches the watch reported that only a read can bring (their events could not be applied), and
        # how many of them the view holds (a read that began after them).
        self._changes = 0
        self._changes_read = 0
        # The read that callers arriving now will share, the task that makes the reads, and the read the watch
        # asked for after its last change batch.
        self._next_read: asyncio.Future[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._change_read: asyncio.Future[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        # Done when the watch's first attempt gave a view, or failed to.
        self._first_view: asyncio.Future[None] | None = None

    async def bookies(self, refresh: bool = False) -> Registrations:
        """The registrations. refresh: as they are now (the watched view if it can vouch for that, else read);
        otherwise as known, read again if not confirmed for ttl_s."""
        self._start_watch()
        if self._serves(refresh):
            return self.current
        # A read this caller needs may be in flight already: the watch's first view (the read after etcd created
        # it), or the read of a change the watch reported.
        pending = self._first_view
        if pending is None or pending.done():
            pending = self._change_read if refresh and self.live else None
        if pending is not None and not pending.done():
            await asyncio.wait([pending], timeout=WATCH_FIRST_VIEW_WAIT_S)  # never cancels it: others share it
            if self._serves(refresh):
                return self.current
        await self.read()
        return self.current

    def _serves(self, refresh: bool) -> bool:
        fresh = asyncio.get_running_loop().time() - self.confirmed_at <= self.ttl_s
        if not refresh:
            return fresh
        return fresh and self.live and self._changes_read == self._changes

    # -- reads -----------------------------------------------------------------------------------------
    async def read(self) -> Registrations:
        """Read the registrations from etcd: a read that starts after this call did, shared with every caller
        that arrived while an earlier read was in flight. Hundreds of concurrent creators then cost one etcd
        read per round trip, not one each, none of them sees registrations older than its call, and all of them
        go on in the same event-loop turn (their creations then share etcd transactions and add requests)."""
        await asyncio.shield(self._request_read())
        return self.current

    def _request_read(self) -> asyncio.Future[None]:
        """The future of the next read (one that starts after this call), starting the reader if it is idle."""
        if self._next_read is None:
            self._next_read = asyncio.get_running_loop().create_future()
            if self._reader is None or self._reader.done():
                self._reader = asyncio.get_running_loop().create_task(self._reads(), name="octavo-registrations")
        return self._next_read

    async def _reads(self) -> None:
        while self._next_read is not None:
            done, self._next_read = self._next_read, None
            changes = self._changes
            position = WatchPosition()
            self._reading = True
            try:
                kvs = await self.store.etcd.get_prefix(self.store.layout.registrations, position=position)
                by_key = {kv.key: BookieInfo.decode(kv.value) for kv in kvs}
            except Exception as e:
                done.set_exception(e)
                done.exception()  # retrieved: a read nobody waits for any more must not warn
            except BaseException:  # cancelled: its waiters, and those of the next read, are cancelled too
                done.cancel()
                if self._next_read is not None:
                    self._next_read.cancel()
                    self._next_read = None
                raise
            else:
                self.reads += 1
                self._changes_read = max(self._changes_read, changes)
                self.by_key, self.revision = by_key, position.revision
                self._apply(registrations_of(by_key, self.store.layout.bookies(True)))
                done.set_result(None)
            finally:
                self._reading = False

    def _apply(self, registrations: Registrations) -> None:
        before, self.current = self.current, registrations
        self.confirmed_at = asyncio.get_running_loop().time()
        self.on_change(before, registrations)

    # -- the watch -------------------------------------------------------------------------------------
    def _start_watch(self) -> None:
        if self._watcher is None and not self.closed:
            self._first_view = asyncio.get_running_loop().create_future()
            self._watcher = asyncio.get_running_loop().create_task(self._watch(), name="octavo-registrations-watch")

    async def _watch(self) -> None:
        """Keep the watch on the registrations prefix; runs until cancelled (close)."""
        ranges = [WatchRange.prefix(self.store.layout.registrations)]
        attempt = 0
        while True:
            try:
                async for events in self.store.etcd.watch_events(ranges):
                    if not self.live:  # created: from now on no change is missed, so read what is there
                        await self.read()
                        self.live = True
                        self._first_viewed()
                        attempt = 0
                        log.debug("registrations watch established")
                        continue
                    self.confirmed_at = asyncio.get_running_loop().time()
                    if events and not self._applied(events):
                        self._changes += 1
                        self._change_read = self._request_read()
            except MetadataUnavailableError as e:
                log.info("the registrations watch %s (%s): reading etcd until it is back",
                         "broke" if self.live else "could not be established", e)
            except Exception:  # not an etcd outage (a registration that does not decode): say so, and go on
                log.exception("the registrations watch failed: reading etcd until it is back")
            finally:
                self.live = False
                self._first_viewed()
            await asyncio.sleep(backoff_s(attempt, WATCH_RETRY_S_INITIAL, WATCH_RETRY_S_MAX))
            attempt += 1

    def _applied(self, events: list[WatchEvent]) -> bool:
        """Apply one watch response's events to the view (one change of it); False when they cannot be applied
        on their own and a read must bring them."""
        if self._reading or self._next_read is not None or self._changes_read != self._changes:
            return False  # a read in flight may or may not hold them; one asked for or failed holds them
        by_key = dict(self.by_key)
        revision = self.revision
        for event in events:
            if event.mod_revision <= self.revision:
                continue  # the last read holds it
            if event.deleted:
                by_key.pop(event.key, None)
            else:
                try:
                    by_key[event.key] = BookieInfo.decode(event.value)
                except Exception as e:  # what a read of it will say to its callers
                    log.warning("the registration %r does not decode (%s): reading the registrations", event.key, e)
                    return False
            revision = max(revision, event.mod_revision)
        self.by_key, self.revision = by_key, revision
        registrations = registrations_of(by_key, self.store.layout.bookies(True))
        if registrations != self.current:
            self._apply(registrations)
        return True

    def _first_viewed(self) -> None:
        if self._first_view is not None and not self._first_view.done():
            self._first_view.set_result(None)

    async def close(self) -> None:
        """Stop the watch and the reader (their waiters see CancelledError); the watch is never started again."""
        self.closed = True
        tasks = [t for t in (self._watcher, self._reader) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
