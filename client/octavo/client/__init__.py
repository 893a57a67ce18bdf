"""The Octavo client library: `Client` (asyncio) and `SyncClient` (blocking), and the errors users see."""

from octavo.client.client import Client, ClientOptions, SyncClient
from octavo.client.errors import (
    BookieUnavailableError,
    EntryRefusedError,
    EntryTooLargeError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataUnavailableError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    OctavoError,
    ReadError,
    RecoveryError,
    WrongPasswordError,
)
from octavo.client.reader import Entry, ReadHandle
from octavo.client.writer import WriteHandle

__all__ = [
    "BookieUnavailableError", "Client", "ClientOptions", "Entry", "EntryRefusedError", "EntryTooLargeError",
    "LedgerClosedError", "LedgerFencedError", "MetadataUnavailableError", "NoSuchLedgerError",
    "NotEnoughBookiesError", "OctavoError", "ReadError", "ReadHandle", "RecoveryError", "SyncClient", "WriteHandle",
    "WrongPasswordError",
]
