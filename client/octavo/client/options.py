"""The client's settings, with their units in their names."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClientOptions:
    entry_size_bytes_max: int = 4 * 1024 * 1024
    # Bytes of appended but not yet acknowledged entries per write handle; append() waits beyond this.
    inflight_bytes_max: int = 64 * 1024 * 1024
    add_timeout_s: float = 10.0
    read_timeout_s: float = 10.0
    speculative_read_delay_s: float = 0.2
    # How long the client trusts its list of bookie registrations before asking etcd again.
    bookie_list_ttl_s: float = 2.0
    # How long one etcd call may wait (for etcd to be reachable, and for its answer).
    metadata_timeout_s: float = 5.0
