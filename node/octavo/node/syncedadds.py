"""The AddEntries stream. Under the default policy (`answered_in_turn`) each request is handled and answered
before the next is read. Under fsync_policy = "batch" (`SyncedAdds`) answers wait for their group sync
(groupsync.py), while the stream's next requests are already written.

A reader task handles a stream's requests in order, as the default handler does (each written before the next is
read), and queues each answer with the point its log must be synced to; the handler's generator answers them in
order, each once its sync is done. So request N+1 is written while N waits, and one fdatasync covers both. At most
ADD_REQUESTS_AWAITING_SYNC_MAX answers wait per stream; then the reader stops reading (gRPC flow control slows
the client). The drain sees the stream busy from a request's arrival until no answer is left to send.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, StatusCode

from octavo.node.drain import AddStream, Drain
from octavo.node.errors import Code
from octavo.node.groupsync import ADD_REQUESTS_AWAITING_SYNC_MAX, GroupSync
from octavo.node.requeststats import RequestStats
from octavo.node.tenants import Tenant
from octavo.v1 import bookie_pb2 as pb


async def answered_in_turn(add: Callable[[pb.AddRequest, Tenant | None], Awaitable[pb.AddResponse]],
                           stats: RequestStats, drain: Drain, request_iterator: AsyncIterator[pb.AddRequest],
                           context: Any, tenant: Tenant | None) -> AsyncIterator[pb.AddResponse]:
    """The default policy's stream: each request handled (`add`, with its span if it gets one) and answered in
    turn; the drain sees the stream busy from a request's arrival to its answer."""
    stream = drain.opened(context)
    try:
        async for request in request_iterator:
            stream.busy = True
            t0 = time.perf_counter()
            response = await add(request, tenant)
            stats.add_requests += 1
            if stats.add_latency is not None:
                stats.add_latency.record(time.perf_counter() - t0)
            if drain.draining:
                response.draining = True
            yield response
            stream.busy = False
            if drain.draining:
                stream.idle_since = asyncio.get_running_loop().time()
    finally:
        drain.closed(stream)


@dataclass(slots=True)
class _Stream:
    """One add stream: requests read and not yet answered."""

    stream: AddStream
    pending: int = 0


@dataclass(slots=True)
class _Answer:
    """A written request's answer, waiting for its sync (`synced`; None: nothing to wait for)."""

    request: pb.AddRequest
    response: pb.AddResponse
    synced: asyncio.Future[OSError | None] | None
    t0: float
    span: Span | None


@dataclass
class SyncedAdds:
    """The data plane's parts a synced stream uses: how to handle one request (`add`), its span if it gets one
    (`span_for`), the code and message of adds whose sync failed (`sync_failure`)."""

    add: Callable[[pb.AddRequest, Tenant | None], Awaitable[pb.AddResponse]]
    span_for: Callable[[pb.AddRequest], Span | None]
    sync_failure: Callable[[OSError], tuple[Code, str]]
    group_sync: GroupSync
    stats: RequestStats
    drain: Drain

    async def stream(self, request_iterator: AsyncIterator[pb.AddRequest], context: Any,
                     tenant: Tenant | None) -> AsyncIterator[pb.AddResponse]:
        stats, drain = self.stats, self.drain
        state = _Stream(drain.opened(context))
        answers: asyncio.Queue[_Answer | Exception | None] = asyncio.Queue(ADD_REQUESTS_AWAITING_SYNC_MAX)
        reader = asyncio.create_task(self._read(request_iterator, tenant, answers, state))
        try:
            while (item := await answers.get()) is not None:
                if isinstance(item, Exception):
                    raise item
                if item.synced is not None:
                    error = await item.synced
                    if error is not None:
                        code, message = self.sync_failure(error)
                        stats.refused(code, fail_unsynced(item.request, item.response, code, message))
                response = item.response
                if item.span is not None:
                    if response.error or response.refused_groups:
                        item.span.set_status(StatusCode.ERROR, response.error_message or "some entries refused")
                    item.span.end()
                stats.add_requests += 1
                if stats.add_latency is not None:
                    stats.add_latency.record(time.perf_counter() - item.t0)
                if drain.draining:
                    response.draining = True
                yield response
                state.pending -= 1
                if state.pending == 0:
                    state.stream.busy = False
                    if drain.draining:
                        state.stream.idle_since = asyncio.get_running_loop().time()
        finally:
            reader.cancel()
            drain.closed(state.stream)

    async def _read(self, request_iterator: AsyncIterator[pb.AddRequest], tenant: Tenant | None,
                    answers: asyncio.Queue[_Answer | Exception | None], state: _Stream) -> None:
        """Write each request, queue its answer (None at the stream's end, the exception if reading failed)."""
        try:
            async for request in request_iterator:
                state.stream.busy = True
                state.pending += 1
                t0 = time.perf_counter()
                span = self.span_for(request)
                if span is None:
                    response = await self.add(request, tenant)
                else:  # the span ends once the answer is synced (in stream)
                    with trace.use_span(span, end_on_exit=False):
                        span.set_attribute("octavo.request_id", request.request_id)
                        response = await self.add(request, tenant)
                        span.set_attribute("octavo.entries", len(request.entry_ids) or sum(
                            len(a.entry_ids) for a in request.ledgers))
                # The point is taken after the write returned, so at or past the request's records (if a roll came
                # since, a round that covers the point syncs the rolled logs first); nothing was written for a
                # request refused whole.
                synced = None if response.error else self.group_sync.waiter(self.group_sync.point())
                await answers.put(_Answer(request, response, synced, t0, span))
            await answers.put(None)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the stream broke: the answerer raises it after the answers before it
            await answers.put(e)


def fail_unsynced(request: pb.AddRequest, response: pb.AddResponse, code: Code, message: str) -> int:
    """The sync of a request's adds failed: every entry `response` acknowledged fails with `code` instead.
    Returns how many did."""
    failed = 0
    if response.group_count:  # the flat form lists only the groups with a refused entry: list them all
        before = {r.group: r for r in response.refused_groups}
        groups = []
        for g, count in enumerate(request.group_entry_counts):
            old = before.get(g)
            codes = [pb.OK] * count if old is None else list(old.codes)
            failed += codes.count(pb.OK)
            groups.append(pb.GroupResult(group=g, codes=[c or code for c in codes],
                                         message=old.message if old is not None and old.message else message))
        del response.refused_groups[:]
        response.refused_groups.extend(groups)
        return failed
    for result in response.results:
        codes = list(result.codes)
        failed += codes.count(pb.OK)
        del result.codes[:]
        result.codes.extend(c or code for c in codes)
        result.message = result.message or message
    return failed
