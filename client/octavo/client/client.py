"""The Octavo client: `Client` (asyncio) and `SyncClient` (the same names, blocking, for programs that are
not async).

    async with Client(etcd="127.0.0.1:2379") as client:
        writer = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"pw")
        ids = await asyncio.gather(*(writer.append(b"entry %d" % i) for i in range(1000)))
        await writer.close()
        reader = await client.open_ledger(writer.ledger_id, password=b"pw")
        async for entry in reader.read(0, reader.last_entry_id):
            ...
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import random
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Iterator
from concurrent.futures._base import CANCELLED as _CANCELLED
from concurrent.futures._base import CANCELLED_AND_NOTIFIED as _CANCELLED_AND_NOTIFIED
from concurrent.futures._base import FINISHED as _FINISHED
from concurrent.futures._base import PENDING as _PENDING
from typing import Any, TypeVar

from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from octavo.client.arguments import check_bool, check_bytes, check_instance, check_int, check_str, check_str_map
from octavo.client.bookie_client import REQUEST_BYTES_MAX, REQUEST_ENTRIES_MAX, BookieClient
from octavo.client.dataset import BlobLedgers, DatasetStore
from octavo.client.instruments import ClientTracing, client_metrics
from octavo.client.options import ClientOptions
from octavo.client.reader import Entry, ReadHandle
from octavo.client.recovery import recover_ledger
from octavo.client.registrations import RegistrationView
from octavo.client.scheduler import WriteScheduler
from octavo.client.writer import WriteHandle
from octavo.meta.errors import (
    BookieUnavailableError,
    BufferFullError,
    LedgerClosedError,
    NotEnoughBookiesError,
    OctavoError,
    WrongPasswordError,
)
from octavo.meta.etcd import EtcdClient
from octavo.meta.idgen import LEDGER_ID_MAX
from octavo.meta.layout import DEFAULT_CLUSTER, Layout
from octavo.meta.ledger_metadata import (
    CUSTOM_METADATA_BYTES_MAX,
    PASSWORD_BYTES_MAX,
    LedgerMetadata,
    MetadataError,
    check_quorums,
    master_key,
    password_digest,
)
from octavo.meta.metadata import BookieInfo, MetadataStore

log = logging.getLogger(__name__)

# How long closing a client waits for the bookies to answer the write-closes of its ledgers.
CLOSE_FLUSH_TIMEOUT_S = 1.0
# A draining bookie's flag rides every add response: its writers are asked to move at most this often.
DRAIN_CHECK_INTERVAL_S = 0.5
# A ledger's master key: a SHA-256 digest (octavo.meta.ledger_metadata.master_key).
MASTER_KEY_BYTES = 32

T = TypeVar("T")


class Client:
    def __init__(self, etcd: str, cluster: str = DEFAULT_CLUSTER, options: ClientOptions | None = None, *,
                 meter_provider: MeterProvider | None = None, tracer_provider: TracerProvider | None = None) -> None:
        """`meter_provider` / `tracer_provider`: where the client's metrics and spans go (default: the global
        OpenTelemetry providers, no-ops unless the application installed an SDK). Spans are made only for
        the share options.trace_sample_ratio of operations."""
        check_str("etcd", etcd)
        check_str("cluster", cluster)
        if options is not None:
            check_instance("options", options, ClientOptions, "a ClientOptions or None")
        self.options = options or ClientOptions()
        self.metrics = client_metrics(meter_provider)
        self.tracing = ClientTracing(self.options.trace_sample_ratio, tracer_provider)
        self.etcd = EtcdClient(etcd, timeout_s=self.options.metadata_timeout_s, auth=self.options.etcd_auth())
        self.metadata_store = MetadataStore(self.etcd, Layout(cluster))
        self.datasets = DatasetStore(self.etcd, self.metadata_store.layout, self.delete_ledger,
                                     self.metadata_store.iter_ledgers, BlobLedgers(self))
        self._bookie_clients: dict[str, BookieClient] = {}
        # The registrations, kept by an etcd watch (registrations.py).
        self._registration_view = RegistrationView(self.metadata_store, self.options.bookie_list_ttl_s,
                                                   self._registrations_changed)
        self._closing: set[asyncio.Task[None]] = set()
        self._writers: weakref.WeakSet[WriteHandle] = weakref.WeakSet()
        # Draining bookies (drain.py on the bookie): when their writers were last asked to move off each.
        self._drain_checked: dict[str, float] = {}
        self._drain_tasks: set[asyncio.Task[None]] = set()
        self.write_scheduler = WriteScheduler()
        self.closed = False

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the client. Appends still in flight on its write handles fail with LedgerClosedError (the
        ledgers stay open in etcd: a recovery open closes them). Every channel it opened is closed on return."""
        self.closed = True
        # Write-closes still lingering go now (they are advisory: a bookie that does not answer in time is left).
        await asyncio.gather(*(c.flush_closes(CLOSE_FLUSH_TIMEOUT_S) for c in self._bookie_clients.values()))
        for writer in list(self._writers):
            writer.abandon(LedgerClosedError("the client was closed with this append in flight"))
        self.write_scheduler.cancel()
        background = [*self._drain_tasks]
        for task in background:
            task.cancel()
        clients, self._bookie_clients = list(self._bookie_clients.values()), {}
        await asyncio.gather(*background, self._registration_view.close(), *self._closing,
                             *(c.close() for c in clients), return_exceptions=True)
        await self.etcd.close()

    # -- bookies ---------------------------------------------------------------------------------------
    async def bookies(self, refresh: bool = False) -> dict[str, BookieInfo]:
        """Registered bookies (writable and read-only). refresh: as they are now (the watched view while the
        watch vouches for it, else read from etcd); otherwise as known, read again after bookie_list_ttl_s."""
        return await self._registration_view.bookies(refresh)

    def _registrations_changed(self, before: dict[str, BookieInfo], registrations: dict[str, BookieInfo]) -> None:
        for bookie_id, info in registrations.items():
            known = self._bookie_clients.get(bookie_id)
            if known is None:
                continue
            if known.address != info.address:  # it moved (restarted elsewhere)
                self._replace_connection(bookie_id, known, "moved")
            elif self._restarted(before.get(bookie_id), info) and not known.reachable():
                # Restarted in place while our connection waits out its backoff (or holds a name resolved to the
                # old pod): a new connection tries at once (gRPC offers no way to reset a channel's backoff).
                # What is queued on the old one fails over as from any unreachable bookie.
                self._replace_connection(bookie_id, known, "restarted")

    @staticmethod
    def _restarted(before: BookieInfo | None, now: BookieInfo) -> bool:
        return before is not None and now.started_unix_ms != before.started_unix_ms and now.started_unix_ms > 0

    def _replace_connection(self, bookie_id: str, known: BookieClient, why: str) -> None:
        log.info("bookie %s %s: new connection to %s", bookie_id, why, self.registrations[bookie_id].address)
        self._bookie_clients.pop(bookie_id)
        self._closing.add(task := asyncio.get_running_loop().create_task(known.close()))
        task.add_done_callback(self._closing.discard)

    @property
    def registrations(self) -> dict[str, BookieInfo]:
        """The registrations as last known (watched, or read from etcd; no etcd call)."""
        return self._registration_view.current

    async def writable_bookies(self) -> list[str]:
        return sorted(b for b, info in (await self.bookies(refresh=True)).items() if not info.readonly)

    async def moved(self, bookie_id: str) -> bool:
        """After a call to a bookie failed: whether it has another address (bookie_client() gives the new one). Read
        from etcd unless the watched view shows a move: its events may lag a restart that just happened."""
        old, info = self._bookie_clients.get(bookie_id), (await self.bookies(refresh=True)).get(bookie_id)
        if info is None or (old is not None and old.address == info.address):
            info = (await self._registration_view.read()).get(bookie_id)
        return info is not None and (old is None or old.address != info.address)

    def bookie_client(self, bookie_id: str) -> BookieClient:
        client = self._bookie_clients.get(bookie_id)
        if client is None:
            info = None if self.closed else self.registrations.get(bookie_id)  # closed: a new channel would leak
            if info is None:
                raise BookieUnavailableError(f"bookie {bookie_id} " + ("cannot be reached: the client is closed"
                                             if self.closed else "is not registered (down, or unknown)"))
            client = self._bookie_clients[bookie_id] = BookieClient(
                bookie_id, info.address, self.options.add_timeout_s, self.options.tls,
                request_entries_max=min(REQUEST_ENTRIES_MAX, info.batch_entries_max or REQUEST_ENTRIES_MAX),
                request_bytes_max=min(REQUEST_BYTES_MAX, info.batch_bytes_max or REQUEST_BYTES_MAX))
            client.on_draining = self._bookie_draining
        return client

    def _bookie_draining(self, bookie_id: str) -> None:
        """An add response said the bookie is stopping (controlled shutdown): at most once per
        DRAIN_CHECK_INTERVAL_S, look at the registrations as they are now (bookies(refresh=True)) and ask each
        write handle with the bookie in its last ensemble to move off it (WriteHandle.bookie_draining)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self.closed or now - self._drain_checked.get(bookie_id, -DRAIN_CHECK_INTERVAL_S) < DRAIN_CHECK_INTERVAL_S:
            return
        self._drain_checked[bookie_id] = now
        log.info("bookie %s is draining (stopping): moving write handles off it", bookie_id)
        task = loop.create_task(self._move_off(bookie_id), name=f"octavo-drain-{bookie_id}")
        self._drain_tasks.add(task)
        task.add_done_callback(self._drain_tasks.discard)

    async def _move_off(self, bookie_id: str) -> None:
        try:
            await self.bookies(refresh=True)
        except OctavoError as e:  # the handles decide from the registrations known
            log.info("moving off draining bookie %s with the registrations known: %s", bookie_id, e)
        for writer in list(self._writers):
            writer.bookie_draining(bookie_id)

    # -- ledgers ---------------------------------------------------------------------------------------
    async def create_ledger(self, ensemble_size: int = 3, write_quorum: int = 3, ack_quorum: int = 2,
                            password: bytes = b"", metadata: dict[str, str] | None = None) -> WriteHandle:
        """Create a ledger on `ensemble_size` writable bookies; returns its write handle."""
        with self.tracing.operation("octavo.create_ledger") as span:
            writer = await self._create_ledger(ensemble_size, write_quorum, ack_quorum, password, metadata)
            if span is not None:
                span.set_attribute("octavo.ledger_id", writer.ledger_id)
            return writer

    async def _create_ledger(self, ensemble_size: int, write_quorum: int, ack_quorum: int, password: bytes,
                             metadata: dict[str, str] | None) -> WriteHandle:
        ensemble_size = check_int("ensemble_size", ensemble_size)
        write_quorum = check_int("write_quorum", write_quorum)
        ack_quorum = check_int("ack_quorum", ack_quorum)
        try:
            check_quorums(ensemble_size, write_quorum, ack_quorum)
        except MetadataError as e:
            raise ValueError(str(e)) from None
        password = _check_password(password)
        custom = check_str_map("metadata", metadata)
        return await self._create_keyed_ledger(ensemble_size, write_quorum, ack_quorum, password_digest(password),
                                               master_key(password), custom)

    async def _cluster_hint(self, any_writable: bool) -> str:
        """" in cluster 'x'", and when etcd holds nothing at all for it, that it may be misspelled: the cluster a
        client names is only a key prefix, so a typo looks like an empty cluster."""
        layout = self.metadata_store.layout
        text = f" in cluster {layout.cluster!r}"
        if not any_writable and not await self.etcd.get_prefix(layout.root, limit=1, keys_only=True):
            text += (f", which has nothing in etcd (no bookie, ledger or dataset ever): a misspelled cluster name? "
                     f"It is the bookies' --cluster (default {DEFAULT_CLUSTER!r})")
        return text

    async def _create_keyed_ledger(self, ensemble_size: int, write_quorum: int, ack_quorum: int, digest: str,
                                   key: bytes, custom: dict[str, str]) -> WriteHandle:
        """Create a ledger given its password's digest and master key instead of the password (a merge of a
        dataset's ledgers writes a ledger with its sources' password without knowing it). Quorums checked."""
        if sum(len(k) + len(v) for k, v in custom.items()) > CUSTOM_METADATA_BYTES_MAX:
            raise ValueError(f"custom metadata is over {CUSTOM_METADATA_BYTES_MAX} bytes")
        if len(key) != MASTER_KEY_BYTES or not digest:
            raise ValueError(f"a master key is {MASTER_KEY_BYTES} bytes (got {len(key)}) and a password digest is "
                             f"not empty (got {digest!r})")
        writable = await self.writable_bookies()
        if len(writable) < ensemble_size:
            raise NotEnoughBookiesError(f"an ensemble of {ensemble_size} needs {ensemble_size} writable bookies; "
                                        f"{len(writable)} are registered ({', '.join(writable) or 'none'})"
                                        + await self._cluster_hint(bool(writable)))
        ensemble = tuple(random.sample(writable, ensemble_size))
        meta, revision = await self.metadata_store.create_ledger(
            ensemble_size=ensemble_size, write_quorum=write_quorum, ack_quorum=ack_quorum,
            ensembles=((0, ensemble),), password_digest=digest, custom_metadata=custom, master_key_hex=key.hex())
        writer = WriteHandle(self, meta, revision, key)
        self._writers.add(writer)
        return writer

    async def open_ledger(self, ledger_id: int, password: bytes = b"", recovery: bool = True) -> ReadHandle:
        """Open a ledger to read it. With recovery (the default), a ledger that is not closed is fenced,
        its last entry found and re-replicated, and it is closed: its writer can never add to it again.
        Without recovery an open ledger is read up to its last-add-confirmed (the LAC its bookies report: every
        entry up to it was acknowledged), and the writer goes on; entries past the LAC only with
        `read(..., unconfirmed=True)`, which may return entries a later recovery open drops."""
        ledger_id = _check_ledger_id(ledger_id)
        password = check_bytes("password", password)
        check_bool("recovery", recovery)
        meta, _ = await self.metadata_store.read_ledger(ledger_id)
        if meta.password_digest != password_digest(password):
            raise WrongPasswordError(f"wrong password for ledger {ledger_id}")
        await self.bookies(refresh=True)
        if meta.closed:
            return ReadHandle(self, meta, meta.last_entry_id)
        if recovery:
            self.metrics.recovery_opens.add(1)
            with self.tracing.operation("octavo.recovery_open", **{"octavo.ledger_id": ledger_id}) as span:
                meta = await recover_ledger(self, ledger_id, master_key(password))
                if span is not None:
                    span.set_attribute("octavo.last_entry_id", meta.last_entry_id)
            return ReadHandle(self, meta, meta.last_entry_id)
        handle = ReadHandle(self, meta, -1)
        await handle.read_last_add_confirmed()
        return handle

    async def read_last_add_confirmed(self, ledger_id: int) -> int:
        """A ledger's last readable entry: a closed ledger's last entry, or an open one's LAC as its bookies
        report it (see ReadHandle.read_last_add_confirmed). Needs no password: it tells a number, not data."""
        meta, _ = await self.metadata_store.read_ledger(_check_ledger_id(ledger_id))
        if meta.closed:
            return meta.last_entry_id
        await self.bookies(refresh=True)
        return await ReadHandle(self, meta, -1).read_last_add_confirmed()

    async def read_unconfirmed_last_entry(self, ledger_id: int) -> int:
        """The last entry an open ledger's bookies hold on an ack quorum, past its LAC: UNCONFIRMED, a recovery
        open may close the ledger before it (see ReadHandle.read_unconfirmed_last_entry). A closed ledger's
        last entry. Needs no password."""
        meta, _ = await self.metadata_store.read_ledger(_check_ledger_id(ledger_id))
        if meta.closed:
            return meta.last_entry_id
        await self.bookies(refresh=True)
        return await ReadHandle(self, meta, -1).read_unconfirmed_last_entry()

    async def delete_ledger(self, ledger_id: int, password: bytes | None = None) -> None:
        """Delete a ledger's metadata; its bookies drop it when they learn of it. With a password, the
        ledger's must match (WrongPasswordError otherwise)."""
        ledger_id = _check_ledger_id(ledger_id)
        if password is not None:
            password = check_bytes("password", password)
            meta, _ = await self.metadata_store.read_ledger(ledger_id)
            if meta.password_digest != password_digest(password):
                raise WrongPasswordError(f"wrong password for ledger {ledger_id}")
        await self.metadata_store.delete_ledger(ledger_id)

    async def all_ledger_metadata(self) -> list[LedgerMetadata]:
        """Every ledger's metadata (one etcd range read): for tools and orphan collection."""
        return await self.metadata_store.all_ledgers()

    def iter_ledger_metadata(self) -> AsyncIterator[LedgerMetadata]:
        """Every ledger's metadata in id order, read from etcd a page at a time (memory stays one page)."""
        return self.metadata_store.iter_ledgers()

    async def list_ledgers(self) -> list[int]:
        return await self.metadata_store.list_ledgers()

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return (await self.metadata_store.read_ledger(_check_ledger_id(ledger_id)))[0]


def _check_ledger_id(ledger_id: Any) -> int:
    return check_int("ledger_id", ledger_id, minimum=0, maximum=LEDGER_ID_MAX)


def _check_password(password: Any) -> bytes:
    checked = check_bytes("password", password)
    if len(checked) > PASSWORD_BYTES_MAX:
        raise ValueError(f"password is over {PASSWORD_BYTES_MAX} bytes")
    return checked


# -- the synchronous facade ----------------------------------------------------------------------------
class _Loop:
    """An event loop in a daemon thread; the facade runs the async client on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="octavo-client", daemon=True)
        self.thread.start()

    def run(self, awaitable: Awaitable[T]) -> T:
        async def wrapper() -> T:
            return await awaitable
        return asyncio.run_coroutine_threadsafe(wrapper(), self.loop).result()

    def stop(self) -> None:
        async def cancel_leftovers() -> None:
            """What asyncio.run does at its end: tasks still running (gRPC's own, for calls that ended as the
            client closed) are cancelled and awaited, not destroyed pending."""
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self.thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(cancel_leftovers(), self.loop).result(timeout=10)
            except Exception:  # shutting down: a task that will not end is left to the loop's close
                log.debug("leftover tasks at close", exc_info=True)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


class _SyncHandle:
    """What both synchronous handles share: the loop, the async handle, its ids and metadata, close."""

    def __init__(self, loop: _Loop, handle: WriteHandle | ReadHandle) -> None:
        self._loop = loop
        self._async = handle

    @property
    def ledger_id(self) -> int:
        return self._async.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._async.metadata

    def close(self) -> None:
        self._loop.run(self._async.close())

    def __enter__(self) -> _SyncHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EntryFuture(concurrent.futures.Future[int]):
    """The concurrent.futures.Future of one appended entry, made cheap for the producer path: a Future makes a
    threading.Condition when it is created (about 1.7 us, as much as the rest of an append); this one makes it
    only when someone waits on it or adds a callback, and is resolved without it otherwise. A lock shared by the
    handle's futures orders the two: a result set while no Condition exists is seen by any later waiter."""

    def __init__(self, shared: threading.Lock) -> None:
        self._shared = shared
        self._cond: threading.Condition | None = None
        self._state = _PENDING
        self._result: int | None = None
        self._exception: BaseException | None = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Any] = []

    @property  # type: ignore[override]
    def _condition(self) -> threading.Condition:
        with self._shared:
            if self._cond is None:
                self._cond = threading.Condition()
            return self._cond

    @_condition.setter
    def _condition(self, value: threading.Condition) -> None:
        self._cond = value

    def done(self) -> bool:
        return self._state in _DONE_STATES

    def result(self, timeout: float | None = None) -> int:
        if self._state == _FINISHED and self._exception is None:  # final: no lock needed to read it
            return self._result  # type: ignore[return-value]
        return super().result(timeout)

    def set_result(self, result: int) -> None:
        with self._shared:
            fast = self._cond is None and self._state not in _DONE_STATES
            if fast:  # nobody waits and no callback: no Condition needed
                self._result = result
                self._state = _FINISHED
        if not fast:  # (the base raises InvalidStateError for a done future, outside our lock: its repr takes it)
            super().set_result(result)


_DONE_STATES = frozenset({_CANCELLED, _CANCELLED_AND_NOTIFIED, _FINISHED})


class SyncWriteHandle(_SyncHandle):
    """The blocking write handle. `append_async` is the producer path: thread-safe (many threads may append to
    one handle), it returns a concurrent.futures.Future of the entry id at once; the records of every thread
    are queued here and handed to the event loop in batches (one wake-up per batch, not per record)."""

    def __init__(self, loop: _Loop, handle: WriteHandle) -> None:
        super().__init__(loop, handle)
        self._handle = handle
        self._lock = threading.Lock()  # the queue
        self._cond = threading.Condition(self._lock)  # producers blocked for room wait on it
        self._future_lock = threading.Lock()  # shared by this handle's EntryFutures
        self._queue: list[bytes] = []
        self._futures: list[EntryFuture] = []
        self._queued_bytes = 0
        self._drain_scheduled = False
        self._blocked = 0  # producer threads waiting for room
        handle._room_hook = self._room_freed

    def append_async(self, data: bytes, block: bool = True, timeout_s: float | None = None
                     ) -> concurrent.futures.Future[int]:
        """Append one entry without waiting for its acknowledgement: a future of its entry id (entries are
        acknowledged in the order they were appended, across threads). When the in-flight budget
        (inflight_bytes_max, counting what is queued here) is full, blocks until there is room (up to
        `timeout_s`, then BufferFullError), or with block=False raises BufferFullError at once. A bad entry
        (not bytes, too large) or a failed or closing handle raises here, with nothing appended."""
        handle = self._handle
        datas = [data]
        future = EntryFuture(self._future_lock)
        with self._lock:
            size, room = handle.admit(datas, True, self._queued_bytes)  # the refusals, and the budget with the queue
            if not room:
                limit = handle._options.inflight_bytes_max
                if not block:
                    raise BufferFullError(f"ledger {handle.ledger_id}: {self._queued_bytes + handle._inflight_bytes} "
                                          f"bytes in flight or queued, the budget is inflight_bytes_max={limit}")
                deadline = None if timeout_s is None else time.monotonic() + timeout_s
                self._blocked += 1
                try:
                    while not room:
                        remaining = None if deadline is None else deadline - time.monotonic()
                        if remaining is not None and remaining <= 0:
                            raise BufferFullError(f"ledger {handle.ledger_id}: no room in the in-flight budget "
                                                  f"(inflight_bytes_max={limit}) within {timeout_s} s")
                        self._cond.wait(remaining)
                        size, room = handle.admit(datas, True, self._queued_bytes)  # raises if the handle failed
                finally:
                    self._blocked -= 1
            data = datas[0]
            self._queue.append(data)
            self._futures.append(future)
            self._queued_bytes += size
            if not self._drain_scheduled:
                self._drain_scheduled = True
                self._loop.loop.call_soon_threadsafe(self._drain)
        return future

    def _drain(self) -> None:
        """In the loop: hand everything queued to the async handle."""
        with self._lock:
            datas, futures, size = self._queue, self._futures, self._queued_bytes
            self._queue, self._futures, self._queued_bytes = [], [], 0
            self._drain_scheduled = False
        if datas:
            self._handle._submit(datas, futures, size)

    def _room_freed(self) -> None:
        """In the loop, after acknowledgements (or a failure): wake blocked producers, if any."""
        if self._blocked:
            with self._cond:
                self._cond.notify_all()

    def flush(self) -> None:
        """Wait until every entry appended so far (by any thread) is acknowledged; raises the handle's error."""
        async def drained() -> None:
            self._drain()
            await self._handle.flush()
        self._loop.run(drained())

    @property
    def last_add_confirmed(self) -> int:
        return self._handle.last_add_confirmed

    def append(self, data: bytes) -> int:
        return self._loop.run(self._handle.append(data))

    def append_many(self, entries: list[bytes]) -> list[int]:
        """Append entries pipelined (all in flight at once); returns their ids in order."""
        return self._loop.run(self._handle.append_many(entries))

    def close(self) -> None:
        """Wait for every append (queued here or in flight), then close the ledger."""
        async def drained_close() -> None:
            self._drain()
            await self._handle.close()
        self._loop.run(drained_close())

    def __enter__(self) -> SyncWriteHandle:
        return self


class SyncReadHandle(_SyncHandle):
    def __init__(self, loop: _Loop, handle: ReadHandle) -> None:
        super().__init__(loop, handle)
        self._handle = handle

    @property
    def last_entry_id(self) -> int:
        return self._handle.last_entry_id

    def read(self, first: int, last: int, *, unconfirmed: bool = False) -> Iterator[Entry]:
        """Entries first..last in order (ReadHandle.read_batches underneath: one hop to the loop per chunk)."""
        for batch in self.read_batches(first, last, unconfirmed=unconfirmed):
            yield from batch

    def read_batches(self, first: int, last: int, *, unconfirmed: bool = False) -> Iterator[list[Entry]]:
        return self._iterate(self._handle.read_batches(first, last, unconfirmed=unconfirmed))

    def tail(self, from_entry: int = 0) -> Iterator[Entry]:
        """Follow the ledger (ReadHandle.tail): blocks until the next entry is acknowledged; ends at the close."""
        for batch in self.tail_batches(from_entry):
            yield from batch

    def tail_batches(self, from_entry: int = 0) -> Iterator[list[Entry]]:
        return self._iterate(self._handle.tail_batches(from_entry))

    def _iterate(self, batches: AsyncIterator[list[Entry]]) -> Iterator[list[Entry]]:
        iterator = batches.__aiter__()
        try:
            while True:
                try:
                    yield self._loop.run(iterator.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            # Stopped early (a break, an error): close the async generator on its loop, cancelling its reads.
            with contextlib.suppress(Exception):
                self._loop.run(iterator.aclose())  # type: ignore[attr-defined]

    def read_last_add_confirmed(self) -> int:
        return self._loop.run(self._handle.read_last_add_confirmed())

    def read_unconfirmed_last_entry(self) -> int:
        return self._loop.run(self._handle.read_unconfirmed_last_entry())

    def __enter__(self) -> SyncReadHandle:
        return self


class SyncClient:
    """The blocking facade of Client: same methods, same arguments."""

    def __init__(self, etcd: str, cluster: str = DEFAULT_CLUSTER, options: ClientOptions | None = None, *,
                 meter_provider: MeterProvider | None = None, tracer_provider: TracerProvider | None = None) -> None:
        self._loop = _Loop()
        self._client: Client = self._loop.run(_make_client(etcd, cluster, options, meter_provider=meter_provider,
                                                           tracer_provider=tracer_provider))

    def close(self) -> None:
        self._loop.run(self._client.close())
        self._loop.stop()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_ledger(self, ensemble_size: int = 3, write_quorum: int = 3, ack_quorum: int = 2,
                      password: bytes = b"", metadata: dict[str, str] | None = None) -> SyncWriteHandle:
        return SyncWriteHandle(self._loop, self._loop.run(self._client.create_ledger(
            ensemble_size, write_quorum, ack_quorum, password, metadata)))

    def open_ledger(self, ledger_id: int, password: bytes = b"", recovery: bool = True) -> SyncReadHandle:
        return SyncReadHandle(self._loop, self._loop.run(self._client.open_ledger(ledger_id, password, recovery)))

    def delete_ledger(self, ledger_id: int, password: bytes | None = None) -> None:
        self._loop.run(self._client.delete_ledger(ledger_id, password))

    def read_last_add_confirmed(self, ledger_id: int) -> int:
        return self._loop.run(self._client.read_last_add_confirmed(ledger_id))

    def read_unconfirmed_last_entry(self, ledger_id: int) -> int:
        return self._loop.run(self._client.read_unconfirmed_last_entry(ledger_id))

    def list_ledgers(self) -> list[int]:
        return self._loop.run(self._client.list_ledgers())

    def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return self._loop.run(self._client.ledger_metadata(ledger_id))

    def bookies(self) -> dict[str, BookieInfo]:
        return self._loop.run(self._client.bookies(refresh=True))


async def _make_client(etcd: str, cluster: str, options: ClientOptions | None, **providers: Any) -> Client:
    return Client(etcd, cluster, options, **providers)

