"""Controlled shutdown (Kafka's): a stopping bookie tells its writers first and stops once they have moved.

On SIGTERM the bookie drains before anything else stops:
1. `begin()`: every add response carries `draining` from now on, and the registration moves to the read-only
   set (server.py), so no writer picks this bookie for a new ledger or as a replacement. Adds are still stored:
   a writer that moves starts its new segment at its first unacknowledged entry and sends those entries to the
   replacement, while the requests already on their way here still land here (an entry acknowledged by the
   other bookies of its write set is then on this one too).
2. An add stream ends once it has been idle for STREAM_IDLE_S while draining: nothing is in flight on it, and
   a writer still using this bookie would have sent something by then. A writer with no spare bookie (its
   ensemble is the whole cluster) keeps writing here, so its stream stays busy until the grace period ends.
3. The drain is over when no add stream is left, or at the deadline (the grace period: an older client that
   ignores the flag keeps its stream busy); then the server stops as before, cancelling what is left.

The stream bookkeeping is per request (two attribute writes), never per entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc

log = logging.getLogger(__name__)

# A draining bookie ends an add stream that has had nothing in flight for this long (seconds). Longer than a
# busy writer's gap between requests; short beside the grace period (server.SHUTDOWN_GRACE_S).
STREAM_IDLE_S = 1.0
# How often the drain looks at its streams.
DRAIN_POLL_S = 0.05


class AddStream:
    """One open AddEntries call: whether a request is being handled, and since when it has been idle."""

    __slots__ = ("busy", "context", "ending", "idle_since")

    def __init__(self, context: Any, now: float) -> None:
        self.context = context
        self.busy = False
        self.idle_since = now
        self.ending = False


class Drain:
    """The add streams of one bookie and its draining state (see the module docstring)."""

    def __init__(self) -> None:
        self.draining = False
        self.streams: set[AddStream] = set()
        self.streams_ended = 0  # ended by the drain because idle
        self._tasks: set[asyncio.Task[None]] = set()

    def opened(self, context: Any) -> AddStream:
        stream = AddStream(context, asyncio.get_running_loop().time())
        self.streams.add(stream)
        return stream

    def closed(self, stream: AddStream) -> None:
        self.streams.discard(stream)

    def begin(self) -> None:
        """From now on add responses say `draining`; streams idle now count as idle from now."""
        if self.draining:
            return
        self.draining = True
        now = asyncio.get_running_loop().time()
        for stream in self.streams:
            if not stream.busy:
                stream.idle_since = now

    async def wait(self, deadline: float) -> bool:
        """End idle add streams until none is left (True) or the loop time reaches `deadline` (False)."""
        loop = asyncio.get_running_loop()
        while self.streams:
            now = loop.time()
            if now >= deadline:
                return False
            for stream in list(self.streams):
                if not stream.busy and not stream.ending and now - stream.idle_since >= STREAM_IDLE_S:
                    stream.ending = True
                    task = loop.create_task(self._end(stream))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
            await asyncio.sleep(min(DRAIN_POLL_S, max(0.0, deadline - now)))
        return True

    async def _end(self, stream: AddStream) -> None:
        """End an idle stream: its handler waits for a request that will not come, so the status is sent from
        here. The client sees UNAVAILABLE with nothing in flight and opens a new stream for its next add."""
        self.streams_ended += 1
        with contextlib.suppress(Exception):  # abort raises to end the call; a call already over is as good
            await stream.context.abort(grpc.StatusCode.UNAVAILABLE, "the bookie is stopping (draining): this add "
                                                                     "stream was idle")
        self.streams.discard(stream)
