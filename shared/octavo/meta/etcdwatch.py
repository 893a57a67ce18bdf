"""etcd watch streams, apart from the connection they run on: what a watch asks etcd for, what its responses
mean, and the events they carry (EtcdClient._watch in etcd.py runs the stream on its channel, with its token).

What etcd promises and the callers build on: a watch created at revision R reports every change after R, in
revision order, while its stream lasts; the events of one revision (one transaction, one lease's expiry) come in
one response, never split across two (etcd splits a revision only for a watch created with `fragment`, which
these never set). A broken stream is not resumed: the caller watches again and, since changes in the gap are not
replayed, looks afresh at what it watches (or, with a start revision, etcd replays them unless it compacted them).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from aetcd import rpc

from octavo.meta.errors import EtcdCompactedError, MetadataUnavailableError
from octavo.meta.keyrange import WatchRange


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change etcd reported: a put (the key's new value) or a delete (`value` empty). `mod_revision` is the
    revision of the change (of the delete, for a delete)."""

    key: bytes
    value: bytes
    mod_revision: int
    deleted: bool


class WatchCanceledError(MetadataUnavailableError):
    """etcd cancelled the watch; `reason` is etcd's (an expired token says so)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"etcd cancelled the watch: {reason}")
        self.reason = reason


def create_requests(ranges: Sequence[WatchRange]) -> list[rpc.WatchCreateRequest]:
    """One watch per range, from etcd's current revision on, with the changes the range does not want filtered
    out by etcd."""
    return [rpc.WatchCreateRequest(key=r.start, range_end=r.end,
                                   filters=([rpc.WatchCreateRequest.NOPUT] if not r.puts else [])
                                   + ([rpc.WatchCreateRequest.NODELETE] if not r.deletes else []))
            for r in ranges]


def event_of(raw: Any) -> WatchEvent:
    """A watch response's event (rpc.Event) as a WatchEvent."""
    deleted = raw.type == rpc.Event.DELETE
    return WatchEvent(bytes(raw.kv.key), b"" if deleted else bytes(raw.kv.value), int(raw.kv.mod_revision), deleted)


async def requests(creates: list[rpc.WatchCreateRequest]) -> AsyncIterator[rpc.WatchRequest]:
    """The request side of a Watch stream: the creates, then nothing more for as long as the stream lasts."""
    for create in creates:
        yield rpc.WatchRequest(create_request=create)
    await asyncio.get_running_loop().create_future()  # never done: the stream ends from the response side


def created(resp: Any) -> bool:
    """Whether a Watch stream's response says a watch was created. Raises EtcdCompactedError (its start revision
    was compacted away) and WatchCanceledError."""
    if resp.compact_revision:
        raise EtcdCompactedError(
            f"etcd compacted its history past this watch's start (the oldest revision it keeps is "
            f"{resp.compact_revision}): changes in between are not replayed", int(resp.compact_revision))
    if resp.canceled:
        raise WatchCanceledError(resp.cancel_reason)
    return bool(resp.created)
