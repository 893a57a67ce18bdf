"""A model of one etcd server: keys with create/mod revisions and versions, one revision per write
transaction, compare-and-swap transactions, leases that expire on the loop's (virtual) clock and take their
keys with them, watches that replay history from a revision, and compaction of that history.

It answers the etcd v3 protocol's own messages (aetcd.rpc) as method handlers served on the simulated network
(EtcdModel.handlers), so the real EtcdClient talks to it unchanged. Not modelled: a cluster of members (one
linearizable server), authentication, the space quota and its alarm, ranges at an older revision.
"""

from __future__ import annotations

import asyncio
import bisect
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from aetcd import rpc

from octavo.meta.etcd import COMPACTED
from octavo.sim.network import Aborted, Direct
from octavo.v1.wire import varint

LEASE_NOT_FOUND = "etcdserver: requested lease not found"
FUTURE_REVISION = "etcdserver: mvcc: required revision is a future revision"
_PUT = rpc.Event.PUT
# Keys per range answer when the request sets no limit (etcd has none; a bound keeps a run's memory in check).
RANGE_KEYS_MAX = 100_000


@dataclass
class _Key:
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int
    # The key's KeyValue as serialized in a range answer, made at its first read (a put makes a new _Key).
    encoded: bytes = b""


def _field(tag: bytes, data: bytes) -> bytes:
    """A length-delimited protobuf field (a message) with its tag."""
    return tag + varint(len(data)) + data


# RangeResponse's fields (etcd's rpc.proto): header = 1, kvs = 2 (messages), more = 3, count = 4 (varints).
_RANGE_HEADER, _RANGE_KV, _RANGE_MORE, _RANGE_COUNT = b"\x0a", b"\x12", b"\x18", b"\x20"


@dataclass
class _Lease:
    ttl_s: int
    expires_at: float
    keys: set[bytes] = field(default_factory=set)


@dataclass
class _Watcher:
    start: bytes
    end: bytes  # b"": the one key `start`
    no_put: bool
    no_delete: bool
    watch_id: int
    send: Callable[[Any], None]

    def covers(self, key: bytes) -> bool:
        return _in_range(key, self.start, self.end)


class EtcdError(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


def _in_range(key: bytes, start: bytes, end: bytes) -> bool:
    if not end:
        return key == start
    if end == b"\0":
        return key >= start
    return start <= key < end


class EtcdModel:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.revision = 1  # etcd starts at revision 1 with no keys
        self.compacted = 0
        self.keys: dict[bytes, _Key] = {}
        self._sorted: list[bytes] = []
        self.leases: dict[int, _Lease] = {}
        # No lease expires before this time (a lower bound: a keep-alive only moves a lease's expiry later), so
        # the check every call makes (expire_due) looks at the leases only when one may have expired.
        self._expiry_floor = math.inf
        self._next_lease = 0x1000
        # Every event since the last compaction: (revision, type, key snapshot).
        self.events: list[tuple[int, int, rpc.KeyValue]] = []
        self.watchers: list[_Watcher] = []
        # The events of the write being applied, (type, key, key snapshot): sent once it is done, each watcher's in
        # one response (etcd never splits a revision's events, a transaction's or a lease's keys, across two).
        self._unsent: list[tuple[int, bytes, rpc.KeyValue]] = []
        self._next_watch = 1
        self.leases_expired = 0

    # -- reads ---------------------------------------------------------------------------------------
    def _header(self) -> rpc.ResponseHeader:
        return rpc.ResponseHeader(cluster_id=1, member_id=1, revision=self.revision, raft_term=1)

    def _kv(self, key: bytes, keys_only: bool = False) -> rpc.KeyValue:
        k = self.keys[key]
        return rpc.KeyValue(key=key, value=b"" if keys_only else k.value, create_revision=k.create_revision,
                            mod_revision=k.mod_revision, version=k.version, lease=k.lease)

    def _matching(self, start: bytes, end: bytes) -> list[bytes]:
        if not end:
            return [start] if start in self.keys else []
        lo = bisect.bisect_left(self._sorted, start)
        hi = len(self._sorted) if end == b"\0" else bisect.bisect_left(self._sorted, end)
        return self._sorted[lo:hi]

    def _range_keys(self, request: rpc.RangeRequest) -> tuple[list[bytes], bool, int]:
        """A range's keys (none when it counts only), whether more matched than its limit, and how many did."""
        self.expire_due()
        if request.revision:
            raise EtcdError(grpc.StatusCode.UNIMPLEMENTED, "the model reads only at the current revision")
        keys = self._matching(request.key, request.range_end)
        if request.sort_order == rpc.RangeRequest.DESCEND:
            keys = keys[::-1]
        page = keys[:request.limit or RANGE_KEYS_MAX]
        return [] if request.count_only else page, len(keys) > len(page), len(keys)

    def range(self, request: rpc.RangeRequest) -> rpc.RangeResponse:
        page, more, count = self._range_keys(request)
        return rpc.RangeResponse(header=self._header(), kvs=[self._kv(k, request.keys_only) for k in page],
                                 more=more, count=count)

    def range_encoded(self, request: rpc.RangeRequest) -> bytes:
        """range(request) serialized, built from each key's serialized KeyValue (made once per version of the
        key) rather than as a message: most of the model's calls are ranges, and most read keys that did not
        change since the last read. sim/tests checks it against range()."""
        page, more, count = self._range_keys(request)
        parts = [_field(_RANGE_HEADER, self._header().SerializeToString())]
        for key in page:
            if request.keys_only:
                parts.append(_field(_RANGE_KV, self._kv(key, True).SerializeToString()))
                continue
            k = self.keys[key]
            if not k.encoded:
                k.encoded = _field(_RANGE_KV, self._kv(key).SerializeToString())
            parts.append(k.encoded)
        if more:
            parts.append(_RANGE_MORE + b"\x01")
        if count:
            parts.append(_RANGE_COUNT + varint(count))
        return b"".join(parts)

    # -- writes --------------------------------------------------------------------------------------
    def _put(self, revision: int, key: bytes, value: bytes, lease: int) -> None:
        if lease and lease not in self.leases:
            raise EtcdError(grpc.StatusCode.NOT_FOUND, LEASE_NOT_FOUND)
        old = self.keys.get(key)
        if old is None:
            bisect.insort(self._sorted, key)
            new = _Key(value, revision, revision, 1, lease)
        else:
            if old.lease and old.lease in self.leases:
                self.leases[old.lease].keys.discard(key)
            new = _Key(value, old.create_revision, revision, old.version + 1, lease)
        self.keys[key] = new
        if lease:
            self.leases[lease].keys.add(key)
        self._event(revision, rpc.Event.PUT, self._kv(key))

    def _delete(self, revision: int, start: bytes, end: bytes) -> int:
        keys = self._matching(start, end)
        for key in keys:
            k = self.keys.pop(key)
            self._sorted.pop(bisect.bisect_left(self._sorted, key))
            if k.lease in self.leases:
                self.leases[k.lease].keys.discard(key)
            self._event(revision, rpc.Event.DELETE, rpc.KeyValue(key=key, mod_revision=revision))
        return len(keys)

    def _event(self, revision: int, kind: int, kv: rpc.KeyValue) -> None:
        self.events.append((revision, kind, kv))
        if self.watchers:
            self._unsent.append((kind, kv.key, kv))

    def _notify(self) -> None:
        """Send the events of the write just applied (one revision) to the watchers that cover them."""
        unsent, self._unsent = self._unsent, []
        for watcher in self.watchers if unsent else ():
            events = []
            for kind, key, kv in unsent:
                if watcher.covers(key) and not (watcher.no_put if kind == _PUT else watcher.no_delete):
                    events.append(rpc.Event(type=kind, kv=kv))
            if events:
                watcher.send(rpc.WatchResponse(header=self._header(), watch_id=watcher.watch_id, events=events))

    def put(self, request: rpc.PutRequest) -> rpc.PutResponse:
        self.expire_due()
        self._check_lease(request.lease)
        self.revision += 1
        self._put(self.revision, request.key, request.value, request.lease)
        self._notify()
        return rpc.PutResponse(header=self._header())

    def _check_lease(self, lease: int) -> None:
        if lease and lease not in self.leases:
            raise EtcdError(grpc.StatusCode.NOT_FOUND, LEASE_NOT_FOUND)

    def delete_range(self, request: rpc.DeleteRangeRequest) -> rpc.DeleteRangeResponse:
        self.expire_due()
        if not self._matching(request.key, request.range_end):
            return rpc.DeleteRangeResponse(header=self._header(), deleted=0)
        self.revision += 1
        deleted = self._delete(self.revision, request.key, request.range_end)
        self._notify()
        return rpc.DeleteRangeResponse(header=self._header(), deleted=deleted)

    def _compare(self, c: rpc.Compare) -> bool:
        keys = self._matching(c.key, c.range_end) if c.range_end else [c.key]
        for key in keys:
            k = self.keys.get(key)
            if c.target == rpc.Compare.MOD:
                have, want = (k.mod_revision if k else 0), c.mod_revision
            elif c.target == rpc.Compare.CREATE:
                have, want = (k.create_revision if k else 0), c.create_revision
            elif c.target == rpc.Compare.VERSION:
                have, want = (k.version if k else 0), c.version
            elif c.target == rpc.Compare.LEASE:
                have, want = (k.lease if k else 0), c.lease
            else:  # VALUE: a missing key fails any comparison of its value
                if k is None:
                    return False
                have, want = k.value, c.value  # type: ignore[assignment]
            ok = {rpc.Compare.EQUAL: have == want, rpc.Compare.NOT_EQUAL: have != want,
                  rpc.Compare.GREATER: have > want, rpc.Compare.LESS: have < want}[c.result]
            if not ok:
                return False
        return True

    def txn(self, request: rpc.TxnRequest) -> rpc.TxnResponse:
        self.expire_due()
        succeeded = all(self._compare(c) for c in request.compare)
        ops = request.success if succeeded else request.failure
        writes = any(op.WhichOneof("request") in ("request_put", "request_delete_range") for op in ops)
        for op in ops:  # a missing lease fails the whole transaction before anything is applied
            if op.WhichOneof("request") == "request_put":
                self._check_lease(op.request_put.lease)
        revision = self.revision + 1 if writes else self.revision
        responses = []
        for op in ops:
            kind = op.WhichOneof("request")
            if kind == "request_range":
                responses.append(rpc.ResponseOp(response_range=self.range(op.request_range)))
            elif kind == "request_put":
                self._put(revision, op.request_put.key, op.request_put.value, op.request_put.lease)
                responses.append(rpc.ResponseOp(response_put=rpc.PutResponse(header=self._header())))
            elif kind == "request_delete_range":
                deleted = self._delete(revision, op.request_delete_range.key, op.request_delete_range.range_end)
                responses.append(rpc.ResponseOp(response_delete_range=rpc.DeleteRangeResponse(deleted=deleted)))
            else:
                raise EtcdError(grpc.StatusCode.UNIMPLEMENTED, f"the model has no {kind} in a transaction")
        self.revision = revision
        self._notify()
        return rpc.TxnResponse(header=self._header(), succeeded=succeeded, responses=responses)

    def compact(self, request: rpc.CompactionRequest) -> rpc.CompactionResponse:
        if request.revision <= self.compacted:
            raise EtcdError(grpc.StatusCode.OUT_OF_RANGE, f"etcdserver: mvcc: {COMPACTED}")
        if request.revision > self.revision:
            raise EtcdError(grpc.StatusCode.OUT_OF_RANGE, FUTURE_REVISION)
        self.compacted = request.revision
        self.events = [e for e in self.events if e[0] > request.revision]
        return rpc.CompactionResponse(header=self._header())

    # -- leases --------------------------------------------------------------------------------------
    def grant(self, request: rpc.LeaseGrantRequest) -> rpc.LeaseGrantResponse:
        self.expire_due()
        self._next_lease += 1
        lease_id = request.ID or self._next_lease
        self.leases[lease_id] = _Lease(request.TTL, self.clock() + request.TTL)
        self._expiry_floor = min(self._expiry_floor, self.clock() + request.TTL)
        asyncio.get_running_loop().call_at(self.clock() + request.TTL, self.expire_due)
        return rpc.LeaseGrantResponse(header=self._header(), ID=lease_id, TTL=request.TTL)

    def keep_alive(self, lease_id: int) -> rpc.LeaseKeepAliveResponse:
        self.expire_due()
        lease = self.leases.get(lease_id)
        if lease is None:
            return rpc.LeaseKeepAliveResponse(header=self._header(), ID=lease_id, TTL=0)
        lease.expires_at = self.clock() + lease.ttl_s
        asyncio.get_running_loop().call_at(lease.expires_at, self.expire_due)
        return rpc.LeaseKeepAliveResponse(header=self._header(), ID=lease_id, TTL=lease.ttl_s)

    def revoke(self, lease_id: int) -> None:
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            raise EtcdError(grpc.StatusCode.NOT_FOUND, LEASE_NOT_FOUND)
        if lease.keys:
            self.revision += 1
            for key in sorted(lease.keys):
                self._delete(self.revision, key, b"")
            self._notify()

    def expire_due(self) -> None:
        now = self.clock()
        if now < self._expiry_floor:
            return
        for lease_id in sorted(i for i, lease in self.leases.items() if lease.expires_at <= now):
            self.leases_expired += 1
            self.revoke(lease_id)
        self._expiry_floor = min((lease.expires_at for lease in self.leases.values()), default=math.inf)

    def expire_all(self) -> None:
        """Every lease expires now (an etcd that lost its leader long enough: a fault the run injects)."""
        for lease in self.leases.values():
            lease.expires_at = self.clock()
        self._expiry_floor = self.clock()
        self.expire_due()

    # -- watches -------------------------------------------------------------------------------------
    def watch(self, create: rpc.WatchCreateRequest, send: Callable[[Any], None]) -> _Watcher | None:
        """Start a watch: history from its start revision first, then every new event. None when that history
        was compacted (the watch is then answered with compact_revision and cancelled)."""
        watch_id = self._next_watch
        self._next_watch += 1
        send(rpc.WatchResponse(header=self._header(), watch_id=watch_id, created=True))
        start_revision = create.start_revision or self.revision + 1
        if start_revision <= self.compacted:
            send(rpc.WatchResponse(header=self._header(), watch_id=watch_id, canceled=True,
                                   compact_revision=self.compacted, cancel_reason=COMPACTED))
            return None
        no_put = rpc.WatchCreateRequest.NOPUT in create.filters
        no_delete = rpc.WatchCreateRequest.NODELETE in create.filters
        watcher = _Watcher(create.key, create.range_end, no_put, no_delete, watch_id, send)
        past = [rpc.Event(type=kind, kv=kv) for revision, kind, kv in self.events
                if revision >= start_revision and watcher.covers(kv.key)
                and not (no_put if kind == rpc.Event.PUT else no_delete)]
        if past:
            send(rpc.WatchResponse(header=self._header(), watch_id=watch_id, events=past))
        self.watchers.append(watcher)
        return watcher

    # -- the service ---------------------------------------------------------------------------------
    def direct(self) -> dict[str, Direct]:
        """The etcd v3 unary methods the client uses, by full method name, answered at once as the request
        arrives (network.Direct: none of them waits)."""
        def unary(fn: Callable[[Any], Any], request_type: Any, serialized: bool = False) -> Direct:
            """`fn` answers a message (or, `serialized`, the answer's bytes)."""
            def handle(request: bytes) -> bytes:
                try:
                    answer = fn(request_type.FromString(request))
                except EtcdError as e:
                    raise Aborted(e.code, e.details) from e
                return answer if serialized else answer.SerializeToString()  # type: ignore[no-any-return]
            return handle

        def revoke(request: rpc.LeaseRevokeRequest) -> rpc.LeaseRevokeResponse:
            self.revoke(request.ID)
            return rpc.LeaseRevokeResponse(header=self._header())

        def status(_: rpc.StatusRequest) -> rpc.StatusResponse:
            return rpc.StatusResponse(header=self._header(), dbSize=len(self.keys) * 100,
                                      dbSizeInUse=len(self.keys) * 100)

        return {
            "/etcdserverpb.KV/Range": unary(self.range_encoded, rpc.RangeRequest, serialized=True),
            "/etcdserverpb.KV/Put": unary(self.put, rpc.PutRequest),
            "/etcdserverpb.KV/DeleteRange": unary(self.delete_range, rpc.DeleteRangeRequest),
            "/etcdserverpb.KV/Txn": unary(self.txn, rpc.TxnRequest),
            "/etcdserverpb.KV/Compact": unary(self.compact, rpc.CompactionRequest),
            "/etcdserverpb.Lease/LeaseGrant": unary(self.grant, rpc.LeaseGrantRequest),
            "/etcdserverpb.Lease/LeaseRevoke": unary(revoke, rpc.LeaseRevokeRequest),
            "/etcdserverpb.Maintenance/Status": unary(status, rpc.StatusRequest),
            "/etcdserverpb.Maintenance/Alarm": unary(lambda _: rpc.AlarmResponse(header=self._header()),
                                                     rpc.AlarmRequest),
        }

    def handlers(self) -> list[Any]:
        """The etcd v3 streams the client uses, as grpc generic handlers (served by network.Network.serve)."""
        def streaming(fn: Callable[[AsyncIterator[Any]], AsyncIterator[Any]], request_type: Any) -> Any:
            def handle(requests: AsyncIterator[Any], _context: Any) -> AsyncIterator[Any]:
                return fn(requests)
            return grpc.stream_stream_rpc_method_handler(handle, request_deserializer=request_type.FromString,
                                                         response_serializer=lambda m: m.SerializeToString())

        return [
            grpc.method_handlers_generic_handler("etcdserverpb.Lease", {
                "LeaseKeepAlive": streaming(self._keep_alive_stream, rpc.LeaseKeepAliveRequest)}),
            grpc.method_handlers_generic_handler("etcdserverpb.Watch", {
                "Watch": streaming(self._watch_stream, rpc.WatchRequest)}),
        ]

    async def _keep_alive_stream(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for request in requests:
            yield self.keep_alive(request.ID)

    async def _watch_stream(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        out: asyncio.Queue[Any] = asyncio.Queue()
        mine: list[_Watcher] = []

        async def take_requests() -> None:
            async for request in requests:
                if request.HasField("create_request"):
                    watcher = self.watch(request.create_request, out.put_nowait)
                    if watcher is not None:
                        mine.append(watcher)

        reader = asyncio.get_running_loop().create_task(take_requests())
        try:
            while True:
                yield await out.get()
        finally:
            reader.cancel()
            for watcher in mine:
                self.watchers.remove(watcher)
