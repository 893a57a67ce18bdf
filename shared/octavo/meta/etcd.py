"""A small etcd v3 client: key-value with compare-and-swap, transactions, leases with our own keepalive,
and failover across several endpoints.

Built on the etcd protocol stubs that `aetcd` ships (`aetcd.rpc`), over our own grpc.aio channel, so
timeouts, retries and failover are ours. (The older `etcd3` package fails on current protobuf.)

Every call waits for its channel to be ready, up to its timeout: a call made while etcd restarts succeeds once
it is back instead of failing at once. Failover: on UNAVAILABLE or a deadline the client moves to the next
endpoint and, for reads, retries there (a pass over the endpoints; BROKEN_READ_PAUSE_S). A failed write is not:
whether it applied is unknown, so the caller re-reads and decides (every metadata update is a CAS, so a
repeated one cannot overwrite anything).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from aetcd import rpc

from octavo.meta import etcdwatch, transport
from octavo.meta.errors import EtcdCompactedError, EtcdSpaceExceededError, MetadataUnavailableError
from octavo.meta.etcdhealth import EtcdStatus
from octavo.meta.etcdwatch import WatchEvent

# Re-exported: these lived here before keyrange.py, and callers still import them from here.
from octavo.meta.keyrange import WatchPosition as WatchPosition
from octavo.meta.keyrange import WatchRange as WatchRange
from octavo.meta.keyrange import prefix_end as prefix_end
from octavo.meta.retry import backoff_s
from octavo.meta.tls import TlsFiles

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 5.0
# A restarted server (a bookie, etcd) must be reachable again within a fraction of a second: gRPC's default
# reconnect backoff grows to minutes and, through the process-wide subchannel pool, is shared even by a freshly
# created channel. Reconnect attempts start RECONNECT_BACKOFF_MS_INITIAL after a failure and grow by 1.6 up to
# RECONNECT_BACKOFF_MS_MAX, each with gRPC's +-20% jitter (so clients that lost one server do not retry in
# step). A refused connection costs the server nothing, so a small cap is cheap. min_reconnect_backoff_ms is,
# despite its name, the deadline of one connection attempt (a host that drops SYNs): it stays at 2 s.
RECONNECT_BACKOFF_MS_INITIAL = 50
RECONNECT_BACKOFF_MS_MAX = 250
CONNECT_ATTEMPT_MS_MIN = 2000
DNS_RESOLUTION_INTERVAL_MS_MIN = 1000
CHANNEL_OPTIONS = [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS_INITIAL),
    ("grpc.min_reconnect_backoff_ms", CONNECT_ATTEMPT_MS_MIN),
    ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS_MAX),
    # A name re-resolved after a failed connect at most this often (gRPC's default is 30 s): a bookie pod that
    # restarted under the same DNS name with another address is reached within a second.
    ("grpc.dns_min_time_between_resolutions_ms", DNS_RESOLUTION_INTERVAL_MS_MIN),
]
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
BROKEN_READ_PAUSE_S, BROKEN_READ_PAUSE_S_MAX = 0.05, 1.0  # a read resent while its timeout lasts (_call)
# Before the first call succeeds, every endpoint gets a plain TCP connect of at most this long: if each one is
# refused or cannot be resolved, the call fails at once with that reason instead of waiting out its timeout.
PROBE_TIMEOUT_S = 1.0
# Keys per etcd range response (get_prefix pages through larger ranges): ~1,000 ledgers' metadata is ~0.5 MB.
RANGE_PAGE_KEYS = 1_000
# Operations in one transaction: etcd's default --max-txn-ops (a larger transaction is refused).
TXN_OPS_MAX = 128


# What etcd answers a write that adds data once its database reached --quota-backend-bytes (gRPC
# RESOURCE_EXHAUSTED, until the NOSPACE alarm is disarmed), and a read or watch of a revision it compacted away
# (OUT_OF_RANGE).
SPACE_EXCEEDED = "database space exceeded"
SPACE_EXCEEDED_HINT = (
    "etcd's database is full (it reached its --quota-backend-bytes and raised the NOSPACE alarm): it refuses "
    "every write that adds data, so no ledger can be created, closed or deleted until an operator compacts "
    "its history, defragments every member and disarms the alarm (etcdctl compact, etcdctl defrag, etcdctl "
    "alarm disarm: docs/operations.md, \"What an etcd for Octavo needs\")")
COMPACTED = "required revision has been compacted"

# Refusals that credentials would change: said as such, never retried.
AUTH_CODES = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
AUTH_HINT = ("etcd refuses this client: give it credentials (etcd_username with etcd_password_file, or a client "
             "certificate whose common name is an etcd user with a role on the cluster's prefix)")


@dataclass(frozen=True)
class EtcdAuth:
    """How to reach etcd securely: TLS files (a client certificate also authenticates as the user named by its
    CN when etcd runs --client-cert-auth) and/or a user name and password for etcd's own authentication. The
    password is never logged."""

    tls: TlsFiles = field(default_factory=TlsFiles)
    username: str = ""
    password: str = ""

    def __repr__(self) -> str:  # the password must not reach a log through a repr
        return f"EtcdAuth(tls={self.tls!r}, username={self.username!r}, password={'***' if self.password else ''!r})"

    @staticmethod
    def from_settings(ca_file: str = "", cert_file: str = "", key_file: str = "", username: str = "",
                      password_file: str = "") -> EtcdAuth:
        """From the settings' names (etcd_tls_*, etcd_username, etcd_password_file); ValueError naming the
        setting when one cannot be used."""
        tls = TlsFiles(cert_file, key_file, ca_file)
        if tls.enabled:
            tls.check("etcd_tls")
        if bool(username) != bool(password_file):
            raise ValueError("etcd_username and etcd_password_file go together: set both or neither")
        password = ""
        if password_file:
            try:
                with open(password_file, "rb") as f:
                    password = f.read().strip().decode()
            except (OSError, UnicodeDecodeError) as e:
                raise ValueError(f"etcd_password_file: cannot read {password_file}: {e}") from e
            if not password:
                raise ValueError(f"etcd_password_file: {password_file} is empty")
        return EtcdAuth(tls, username, password)


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    mod_revision: int
    create_revision: int
    lease: int


def parse_endpoints(spec: str) -> list[str]:
    """'host:port[,host:port...]' (an optional http:// prefix is dropped) -> ['host:port', ...]."""
    endpoints = []
    for item in spec.split(","):
        item = item.strip().removeprefix("http://")
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"etcd endpoint {item!r} is not host:port")
        endpoints.append(item)
    if not endpoints:
        raise ValueError(f"no etcd endpoint in {spec!r}")
    return endpoints


# StatusResponse.dbSizeQuota (int64), added in etcd 3.6: the stubs `aetcd` ships predate it, so the field
# arrives as an unknown field of the parsed answer.
STATUS_DB_SIZE_QUOTA_FIELD = 12


def reported_quota_bytes(resp: Any) -> int:
    """The quota an etcd Status answer reports (dbSizeQuota), or 0 when it has none (etcd 3.5 and older)."""
    from google.protobuf.unknown_fields import UnknownFieldSet

    unknown = UnknownFieldSet(resp)
    for i in range(len(unknown)):
        f = unknown[i]
        if f.field_number == STATUS_DB_SIZE_QUOTA_FIELD and isinstance(f.data, int):
            return max(0, f.data - (1 << 64) if f.data >= 1 << 63 else f.data)  # int64 as a varint
    return 0


class Txn:
    """Builder for one etcd transaction: compares, then ops on success (and on failure)."""

    def __init__(self) -> None:
        self.compare: list[Any] = []
        self.success: list[Any] = []
        self.failure: list[Any] = []

    def mod_revision_is(self, key: bytes, revision: int) -> Txn:
        """The key's last modification is `revision`; 0 means the key must not exist."""
        self.compare.append(rpc.Compare(key=key, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL,
                                        mod_revision=revision))
        return self

    def put(self, key: bytes, value: bytes, lease: int = 0) -> Txn:
        self.success.append(rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease)))
        return self

    def delete(self, key: bytes) -> Txn:
        self.success.append(rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key)))
        return self

    def delete_range(self, start: bytes, end: bytes) -> Txn:
        """Delete every key in [start, end) on success."""
        self.success.append(rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=start, range_end=end)))
        return self

    def get(self, key: bytes, keys_only: bool = False) -> Txn:
        """Read the key on success too (its answer is in the response's success results, in op order)."""
        self.success.append(rpc.RequestOp(request_range=rpc.RangeRequest(key=key, keys_only=keys_only)))
        return self

    def delete_on_failure(self, key: bytes) -> Txn:
        self.failure.append(rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key)))
        return self

    def get_on_failure(self, key: bytes) -> Txn:
        self.failure.append(rpc.RequestOp(request_range=rpc.RangeRequest(key=key)))
        return self

    @property
    def reads_only(self) -> bool:  # every op reads: the transaction changes nothing, sending it again is safe
        return all(op.WhichOneof("request") == "request_range" for op in (*self.success, *self.failure))


class EtcdClient:
    """Use as an async context manager, or call close()."""

    def __init__(self, endpoints: str | Sequence[str], timeout_s: float = CALL_TIMEOUT_S,
                 range_page_keys: int = RANGE_PAGE_KEYS, auth: EtcdAuth | None = None) -> None:
        self.auth = auth or EtcdAuth()
        self._token = ""
        self._auth_lock = asyncio.Lock()
        if range_page_keys < 1:
            raise ValueError(f"range_page_keys must be >= 1, got {range_page_keys}")
        self.range_page_keys = range_page_keys
        self.endpoints = parse_endpoints(endpoints) if isinstance(endpoints, str) else list(endpoints)
        self.timeout_s = timeout_s
        self._index = 0
        self._channel: grpc.aio.Channel | None = None
        self._kv: Any = None
        self._lease: Any = None
        self._closing: set[asyncio.Task[None]] = set()
        # Every call waits for its channel to be ready (etcd restarting) up to the timeout.
        self._opts: dict[str, Any] = {"timeout": timeout_s, "wait_for_ready": True}
        self._contacted = False  # a call has succeeded: from then on an outage is waited out, not probed
        # Keys etcd counted to answer this client's range reads (the `count` of each answer): what a listing
        # costs etcd, whatever it returned.
        self.range_keys_counted = 0

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    @property
    def endpoint(self) -> str:
        return self.endpoints[self._index]

    def _stubs(self) -> tuple[Any, Any]:
        if self._channel is None:
            self._channel = transport.current().channel(self.endpoint, self.auth.tls, options=CHANNEL_OPTIONS)
            self._kv = rpc.KVStub(self._channel)
            self._lease = rpc.LeaseStub(self._channel)
        return self._kv, self._lease

    async def _fail_over(self) -> None:
        """Move to the next endpoint. The old channel may still carry other calls: it is closed only after
        the call timeout, never under them (closing it would cancel them). With one endpoint the channel
        stays: it reconnects by itself, with the short backoff of CHANNEL_OPTIONS."""
        if len(self.endpoints) == 1:
            return
        old_endpoint, old_channel = self.endpoint, self._channel
        self._channel = None
        self._index = (self._index + 1) % len(self.endpoints)
        log.warning("etcd endpoint %s failed; switching to %s", old_endpoint, self.endpoint)
        if old_channel is not None:
            loop = asyncio.get_running_loop()
            loop.call_later(self.timeout_s + 1, self._close_later, old_channel)

    def _close_later(self, channel: grpc.aio.Channel) -> None:
        task = asyncio.ensure_future(channel.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _probe(self) -> None:
        """Fail at once when no endpoint can be connected to for a reason that waiting will not change soon
        (refused, unresolvable, unreachable); move to the first endpoint that accepts a connection."""
        results = await asyncio.gather(*(transport.current().probe(e, min(PROBE_TIMEOUT_S, self.timeout_s))
                                         for e in self.endpoints))
        if any(r is None for r in results):
            first = results.index(None)
            if first != self._index and self._channel is not None:
                await self._fail_over()
            self._index = first
            return
        if all(r is not None and not r.startswith("no answer") for r in results):
            raise MetadataUnavailableError("etcd unavailable: " + "; ".join(
                f"{e}: {r}" for e, r in zip(self.endpoints, results, strict=True)))

    async def _call(self, what: str, fn: Any, retry: bool) -> Any:
        if not self._contacted:
            await self._probe()
        if self.auth.username and not self._token:
            await self._authenticate()
        attempts = len(self.endpoints) if retry else 1
        now = asyncio.get_running_loop().time
        resend_until = now() + self.timeout_s if retry else 0.0  # UNAVAILABLE though waiting for ready: broken
        last: grpc.aio.AioRpcError | None = None
        reauthenticated = False
        attempt = 0
        while attempt < attempts:
            kv, lease = self._stubs()
            try:
                result = await fn(kv, lease)
                self._contacted = True
                return result
            except grpc.aio.AioRpcError as e:
                if _refused_for_credentials(e):
                    # etcd's simple tokens expire (after --auth-token-ttl idle): take a new one, once.
                    if self.auth.username and not reauthenticated and "token" in (e.details() or ""):
                        reauthenticated = True
                        await self._authenticate()
                        continue
                    raise MetadataUnavailableError(
                        f"etcd {what} refused: {e.code().name}: {e.details()}: {AUTH_HINT}") from e
                if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and SPACE_EXCEEDED in (e.details() or ""):
                    raise EtcdSpaceExceededError(
                        f"etcd refused the {what}: {e.details()}: {SPACE_EXCEEDED_HINT}") from e
                if e.code() == grpc.StatusCode.OUT_OF_RANGE and COMPACTED in (e.details() or ""):
                    raise EtcdCompactedError(f"etcd {what}: {e.details()}", 0) from e
                if e.code() not in RETRYABLE:
                    raise MetadataUnavailableError(f"etcd {what} failed: {e.code().name}: {e.details()}") from e
                last = e
                attempt += 1
                await self._fail_over()
                pause = backoff_s(attempt - len(self.endpoints), BROKEN_READ_PAUSE_S, BROKEN_READ_PAUSE_S_MAX)
                if attempt == attempts and e.code() == grpc.StatusCode.UNAVAILABLE and now() + pause < resend_until:
                    attempts += 1
                    await asyncio.sleep(pause)
        assert last is not None
        raise MetadataUnavailableError(
            f"etcd unavailable ({', '.join(self.endpoints)}) for {what}: {last.code().name}: {last.details()}"
        ) from last

    async def _authenticate(self) -> None:
        """Trade the user name and password for a token, sent as metadata with every later call."""
        async with self._auth_lock:
            self._stubs()
            assert self._channel is not None
            try:
                resp = await rpc.AuthStub(self._channel).Authenticate(
                    rpc.AuthenticateRequest(name=self.auth.username, password=self.auth.password),
                    timeout=self.timeout_s, wait_for_ready=True)
            except grpc.aio.AioRpcError as e:
                raise MetadataUnavailableError(
                    f"etcd authentication of user {self.auth.username!r} failed: {e.code().name}: "
                    f"{e.details()}") from e
            self._token = resp.token
            self._opts["metadata"] = (("token", resp.token),)

    # -- key-value -----------------------------------------------------------------------------------
    async def get(self, key: bytes) -> KeyValue | None:
        resp = await self._call("get", lambda kv, _: kv.Range(rpc.RangeRequest(key=key), **self._opts), retry=True)
        if not resp.kvs:
            return None
        return _kv(resp.kvs[0])

    async def get_prefix(self, prefix: bytes, limit: int = 0, keys_only: bool = False,
                         position: WatchPosition | None = None) -> list[KeyValue]:
        """Every key under `prefix` (at most `limit`, 0 for all), in key order. Read in pages of at most
        `range_page_keys` keys, so no single etcd response grows with the cluster: one response over the
        client's 4 MiB message limit would fail the whole read (about 10,000 ledgers' metadata). With a
        `position`, as iter_prefix."""
        out: list[KeyValue] = []
        async for page in self.iter_prefix(prefix, keys_only=keys_only, limit=limit, position=position):
            out.extend(page)
        return out

    async def iter_prefix(self, prefix: bytes, keys_only: bool = False, limit: int = 0,
                          position: WatchPosition | None = None) -> AsyncIterator[list[KeyValue]]:
        """The keys under `prefix` in key order, one page (at most `range_page_keys` keys) at a time: a caller
        that handles each page and lets it go holds one page, however many keys there are. With a `position`
        the pages are one snapshot: position.revision is set to the first page's revision and the later pages
        are read at it (a watch's events up to it are in the pages, the later ones are not)."""
        start, end = prefix, prefix_end(prefix)
        read = 0
        while True:
            page = self.range_page_keys if not limit else min(self.range_page_keys, limit - read)
            at = position.revision if position is not None and read else 0  # 0: the current revision
            request = rpc.RangeRequest(key=start, range_end=end, limit=page, keys_only=keys_only, revision=at,
                                       sort_order=rpc.RangeRequest.ASCEND, sort_target=rpc.RangeRequest.KEY)
            resp = await self._call("get prefix", lambda kv, _, r=request: kv.Range(r, **self._opts), retry=True)
            if position is not None and not read:
                position.revision = int(resp.header.revision)
            self.range_keys_counted += int(resp.count)
            kvs = [_kv(item) for item in resp.kvs]
            read += len(kvs)
            if kvs:
                yield kvs
            if not resp.more or not kvs or (limit and read >= limit):
                return
            start = kvs[-1].key + b"\0"  # the next key after the last one read

    async def range_page(self, start: bytes, end: bytes, limit: int, keys_only: bool = False) -> list[KeyValue]:
        """The keys in [start, end) in key order, at most `limit`, in one request. etcd (3.5) counts every key
        of [start, end) to answer, whatever the limit: a caller paging through many keys keeps each range small
        (an open-ended range per page makes a listing quadratic in the keys)."""
        request = rpc.RangeRequest(key=start, range_end=end, limit=limit, keys_only=keys_only,
                                   sort_order=rpc.RangeRequest.ASCEND, sort_target=rpc.RangeRequest.KEY)
        resp = await self._call("range", lambda kv, _: kv.Range(request, **self._opts), retry=True)
        self.range_keys_counted += int(resp.count)
        return [_kv(item) for item in resp.kvs]

    async def last_key(self, prefix: bytes) -> bytes | None:
        """The largest key under `prefix`, None if there is none (one request, keys only)."""
        request = rpc.RangeRequest(key=prefix, range_end=prefix_end(prefix), limit=1, keys_only=True,
                                   sort_order=rpc.RangeRequest.DESCEND, sort_target=rpc.RangeRequest.KEY)
        resp = await self._call("range", lambda kv, _: kv.Range(request, **self._opts), retry=True)
        self.range_keys_counted += int(resp.count)
        return bytes(resp.kvs[0].key) if resp.kvs else None

    async def range_from(self, start: bytes, end: bytes) -> bytes | None:
        """The first key in [start, end), None if there is none (one key, keys only)."""
        request = rpc.RangeRequest(key=start, range_end=end, limit=1, keys_only=True,
                                   sort_order=rpc.RangeRequest.ASCEND, sort_target=rpc.RangeRequest.KEY)
        resp = await self._call("range", lambda kv, _: kv.Range(request, **self._opts), retry=True)
        return bytes(resp.kvs[0].key) if resp.kvs else None

    async def watch_deletes(self, prefix: bytes, position: WatchPosition | None = None) -> AsyncIterator[list[bytes]]:
        """Yield the keys under `prefix` as they are deleted (one list per etcd response), until the stream
        fails (MetadataUnavailableError: the caller watches again). With a `position` the watch starts right
        after position.revision (0: after the current revision) and moves it past each list as it hands it
        over, so a watch started again with the same position misses nothing in between, unless etcd
        compacted that history meanwhile: then EtcdCompactedError, and the caller starts from now
        (position.revision = 0) and finds the deletes it missed by a full scan."""
        position = position if position is not None else WatchPosition()
        if position.revision == 0:
            position.revision = await self.revision()
        create = rpc.WatchCreateRequest(key=prefix, range_end=prefix_end(prefix),
                                        filters=[rpc.WatchCreateRequest.NOPUT], start_revision=position.revision + 1)
        async for events in self._watch([create]):
            if events:  # handed over below: delivered
                position.revision = max(position.revision, max(int(ev.kv.mod_revision) for ev in events))
            keys = [ev.kv.key for ev in events if ev.type == rpc.Event.DELETE]
            if keys:
                yield keys

    async def watch_changes(self, ranges: Sequence[WatchRange]) -> AsyncIterator[list[bytes]]:
        """Watch several ranges on one stream, from now on: first an empty list once etcd has created every
        watch (from then on no change is missed while the stream lasts), then the keys of each response's
        changes. Ends with MetadataUnavailableError when the stream fails (the caller watches again and, since
        changes in the gap are not replayed, looks at what it watches afresh)."""
        async for events in self._watch(etcdwatch.create_requests(ranges), announce_created=True):
            yield [ev.kv.key for ev in events]

    async def watch_events(self, ranges: Sequence[WatchRange]) -> AsyncIterator[list[WatchEvent]]:
        """As watch_changes, with the changes themselves: each response's events in revision order, all the
        events of one revision (one transaction) in one list (etcdwatch.py)."""
        async for events in self._watch(etcdwatch.create_requests(ranges), announce_created=True):
            yield [etcdwatch.event_of(ev) for ev in events]

    async def _watch(self, creates: list[Any], announce_created: bool = False) -> AsyncIterator[list[Any]]:
        """The events of a Watch stream carrying `creates` on this client's channel, with its token
        (announce_created: an empty list first, once every watch is created). Ends with MetadataUnavailableError
        (EtcdCompactedError: a start revision compacted)."""
        self._stubs()
        assert self._channel is not None
        if self.auth.username and not self._token:
            await self._authenticate()
        # hasleader: a member cut off from its cluster's leader cancels the watch instead of keeping it silent.
        metadata = (*self._opts.get("metadata", ()), ("hasleader", "true"))
        call = rpc.WatchStub(self._channel).Watch(etcdwatch.requests(creates), wait_for_ready=True, metadata=metadata)
        created = 0
        try:
            async for resp in call:
                if etcdwatch.created(resp):
                    created += 1
                    if announce_created and created == len(creates):
                        yield []
                if resp.events:
                    yield list(resp.events)
        except etcdwatch.WatchCanceledError as e:
            if self.auth.username and ("auth" in e.reason or "permission" in e.reason):
                self._token = ""  # an expired token: the next watch (or call) takes a new one
            raise
        except grpc.aio.AioRpcError as e:
            if _refused_for_credentials(e) and self.auth.username:
                self._token = ""  # the next watch (or call) takes a new token
            raise MetadataUnavailableError(f"etcd watch failed: {e.code().name}: {e.details()}") from e
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our caller cancels us
            # grpc.aio cancels the call itself when its channel is closed (a failover to another endpoint)
            raise MetadataUnavailableError("etcd watch ended: its channel was closed") from None
        finally:
            call.cancel()
        raise MetadataUnavailableError("etcd ended the watch")

    async def txn(self, txn: Txn, read_only: bool = False) -> tuple[bool, Any]:
        """Run a transaction; returns (succeeded, raw response). A transaction that writes is not retried (its
        answer may be lost after it was applied: the caller decides); one that only reads is, like a get."""
        request = rpc.TxnRequest(compare=txn.compare, success=txn.success, failure=txn.failure)
        retry = read_only or txn.reads_only
        resp = await self._call("transaction", lambda kv, _: kv.Txn(request, **self._opts), retry=retry)
        return bool(resp.succeeded), resp

    async def cas_put(self, key: bytes, value: bytes, expected_mod_revision: int, lease: int = 0) -> bool:
        """Put if the key's mod revision is the expected one (0: create only). False if another won."""
        ok, _ = await self.txn(Txn().mod_revision_is(key, expected_mod_revision).put(key, value, lease))
        return ok

    async def cas_delete(self, key: bytes, expected_mod_revision: int) -> bool:
        ok, _ = await self.txn(Txn().mod_revision_is(key, expected_mod_revision).delete(key))
        return ok

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> None:
        """An unconditional put: only for keys a single owner writes (a bookie's own registration)."""
        await self._call("put", lambda kv, _: kv.Put(rpc.PutRequest(key=key, value=value, lease=lease),
                                                     **self._opts), retry=True)

    async def delete(self, key: bytes) -> None:
        await self._call("delete", lambda kv, _: kv.DeleteRange(rpc.DeleteRangeRequest(key=key),
                                                                **self._opts), retry=True)

    # -- history and space ---------------------------------------------------------------------------
    async def revision(self) -> int:
        """etcd's current revision, as the member this client talks to knows it (its Status: a read of a key
        would need a permission on that key when etcd authenticates). A member behind the leader answers an
        older revision: a watch started after it sees some events twice (never fewer), a compaction to it keeps
        more history."""
        def call(_kv: Any, _lease: Any) -> Any:
            return rpc.MaintenanceStub(self._channel).Status(rpc.StatusRequest(), **self._opts)

        resp = await self._call("revision", call, retry=True)
        return int(resp.header.revision)

    async def compact(self, revision: int) -> bool:
        """Drop etcd's history before `revision` (every key keeps its value as of `revision`). False if it was
        compacted that far already (by another compactor, or etcd's own auto-compaction): nothing to do."""
        if revision < 1:
            raise ValueError(f"compaction revision must be >= 1, got {revision}")
        request = rpc.CompactionRequest(revision=revision)
        try:
            await self._call("compaction", lambda kv, _: kv.Compact(request, **self._opts), retry=False)
        except EtcdCompactedError:
            return False
        return True

    async def status(self) -> EtcdStatus:
        """The status of the member this client talks to: revision, database sizes, alarms it reports."""
        def call(_kv: Any, _lease: Any) -> Any:
            return rpc.MaintenanceStub(self._channel).Status(rpc.StatusRequest(), **self._opts)

        resp = await self._call("status", call, retry=True)
        alarms = await self._call("alarm list", lambda _kv, _lease: rpc.MaintenanceStub(self._channel).Alarm(
            rpc.AlarmRequest(action=rpc.AlarmRequest.GET), **self._opts), retry=True)
        return EtcdStatus(revision=int(resp.header.revision), db_size_bytes=int(resp.dbSize),
                          db_size_in_use_bytes=int(resp.dbSizeInUse),
                          alarms=tuple(sorted({rpc.AlarmType.Name(a.alarm) for a in alarms.alarms})),
                          db_size_quota_bytes=reported_quota_bytes(resp))

    # -- leases --------------------------------------------------------------------------------------
    async def grant_lease(self, ttl_s: int) -> int:
        resp = await self._call("lease grant", lambda _, lease: lease.LeaseGrant(
            rpc.LeaseGrantRequest(TTL=ttl_s), **self._opts), retry=True)
        if resp.error:
            raise MetadataUnavailableError(f"etcd lease grant failed: {resp.error}")
        return int(resp.ID)

    async def keep_alive_once(self, lease_id: int) -> int:
        """Refresh a lease; returns its new TTL in seconds, 0 if the lease is gone (expired or revoked)."""
        async def refresh(_: Any, lease: Any) -> Any:
            call = lease.LeaseKeepAlive(**self._opts)
            await call.write(rpc.LeaseKeepAliveRequest(ID=lease_id))
            await call.done_writing()
            async for reply in call:
                return reply
            return None

        reply = await self._call("lease keepalive", refresh, retry=True)
        return int(reply.TTL) if reply is not None else 0

    async def revoke_lease(self, lease_id: int, timeout_s: float | None = None) -> bool:
        """Revoke a lease (its keys go at once); False if etcd could not be reached within the timeout (the
        lease then expires by itself)."""
        opts = {**self._opts, "timeout": timeout_s or self.timeout_s}
        try:
            await self._call("lease revoke", lambda _, lease: lease.LeaseRevoke(
                rpc.LeaseRevokeRequest(ID=lease_id), **opts), retry=False)
        except MetadataUnavailableError:
            return False
        return True


def _refused_for_credentials(error: grpc.aio.AioRpcError) -> bool:
    """etcd says a call needs (other) credentials: UNAUTHENTICATED / PERMISSION_DENIED, or INVALID_ARGUMENT
    "user name is empty" (what etcd answers a call without a token once auth is enabled)."""
    details = error.details() or ""
    return error.code() in AUTH_CODES or (
        error.code() == grpc.StatusCode.INVALID_ARGUMENT and ("user name is empty" in details
                                                              or "invalid auth token" in details))


def _kv(item: Any) -> KeyValue:
    return KeyValue(bytes(item.key), bytes(item.value), int(item.mod_revision), int(item.create_revision),
                    int(item.lease))

