"""The streams a dataset remembers for its exactly-once commits (stream id -> the last batch id committed), kept
bounded the way Kafka bounds its producer ids: a stream that has not committed for STREAM_IDLE_EXPIRY_S is
forgotten (Kafka's transactional.id.expiration.ms is 7 days too), and at most STREAMS_MAX are remembered. The
map lives in the dataset's head key, which every commit reads and writes: without a bound a dataset written by
a new stream id per job run would grow it for ever.

A forgotten stream that comes back starts afresh: a batch it replays after more than STREAM_IDLE_EXPIRY_S is
committed again, as a Kafka producer's retry after its id expired is. Heads written before the times were kept
(no `stream_seen`) count each stream as last seen at the head's last update, which is never earlier than its
real last commit: nothing is forgotten sooner than it would have been."""

from __future__ import annotations

from typing import Protocol


class DatasetHead(Protocol):
    """What this reads and writes of a dataset's head (dataset.DatasetHead)."""

    streams: dict[str, int]
    stream_seen: dict[str, int]
    updated_unix_ms: int

STREAM_IDLE_EXPIRY_S = 7 * 24 * 3600
STREAMS_MAX = 10_000


def remember_stream(head: DatasetHead, stream: tuple[str, int], now_ms: int, previous: DatasetHead | None) -> str:
    """Record `stream`'s batch in `head` (the head a commit at `now_ms` writes after `previous`) and forget the
    streams idle for longer than STREAM_IDLE_EXPIRY_S. Returns why the stream is refused ("" when it is not): a
    new stream beyond STREAMS_MAX."""
    stream_id, batch_id = stream
    last_update_ms = previous.updated_unix_ms if previous is not None else now_ms
    seen = {s: head.stream_seen.get(s, last_update_ms) for s in head.streams}
    oldest = now_ms - STREAM_IDLE_EXPIRY_S * 1000
    kept = {s: b for s, b in head.streams.items() if seen[s] >= oldest or s == stream_id}
    if stream_id not in kept and len(kept) >= STREAMS_MAX:
        return (f"it remembers {len(kept)} streams, the most it keeps (STREAMS_MAX); a stream is forgotten "
                f"{STREAM_IDLE_EXPIRY_S // 86400} days after its last commit: reuse a stream id (the Spark sink's "
                "stream_id option) rather than a new one per run")
    kept[stream_id] = batch_id
    head.streams = kept
    head.stream_seen = {s: now_ms if s == stream_id else seen[s] for s in kept}
    return ""
