"""What a write handle, a read handle and recovery open need of the client: a narrow interface, so they
depend on these few calls and not on the whole Client (which implements it)."""

from __future__ import annotations

from typing import Protocol

from octavo.client.bookie_client import BookieClient
from octavo.client.instruments import ClientMetrics, ClientTracing
from octavo.client.options import ClientOptions
from octavo.client.scheduler import WriteScheduler
from octavo.meta.metadata import BookieInfo, MetadataStore


class ClientContext(Protocol):
    options: ClientOptions
    metadata_store: MetadataStore
    write_scheduler: WriteScheduler
    closed: bool
    metrics: ClientMetrics
    tracing: ClientTracing

    @property
    def registrations(self) -> dict[str, BookieInfo]:
        """The bookie registrations as last read from etcd (no etcd call)."""

    async def bookies(self, refresh: bool = False) -> dict[str, BookieInfo]:
        """The registrations, read again from etcd when refresh is set or the cached list is old."""

    def bookie_client(self, bookie_id: str) -> BookieClient:
        """The connection to a registered bookie (BookieUnavailableError if it is not registered)."""

    async def moved(self, bookie_id: str) -> bool:
        """After a failed call: whether the bookie now has another address (then bookie_client gives it)."""
