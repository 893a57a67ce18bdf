"""The Octavo client library: `Client` (asyncio) and `SyncClient` (blocking), and the errors users see."""

from octavo.client.client import Client, SyncClient
from octavo.client.options import ClientOptions
from octavo.client.reader import Entry, ReadHandle
from octavo.client.writer import WriteHandle
from octavo.meta.errors import (
    BookieUnavailableError,
    BufferFullError,
    EntryRefusedError,
    EntryTooLargeError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataUnavailableError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    OctavoError,
    PermissionDeniedError,
    ReadError,
    RecoveryError,
    WrongPasswordError,
)

__all__ = [
    "BookieUnavailableError",
    "BufferFullError",
    "Client",
    "ClientOptions",
    "Entry",
    "EntryRefusedError",
    "EntryTooLargeError",
    "LedgerClosedError",
    "LedgerFencedError",
    "MetadataUnavailableError",
    "NoSuchLedgerError",
    "NotEnoughBookiesError",
    "OctavoError",
    "PermissionDeniedError",
    "ReadError",
    "ReadHandle",
    "RecoveryError",
    "SyncClient",
    "WriteHandle",
    "WrongPasswordError",
]
