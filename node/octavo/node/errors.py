"""Storage errors carry the wire result code, so the server maps them to the protocol without guessing."""

from __future__ import annotations

from typing import TypeAlias

from octavo.v1 import bookie_pb2 as pb

# A wire ResultCode (an int at run time).
Code: TypeAlias = pb.ResultCode.ValueType


class StorageError(Exception):
    """A failure a client caused or must handle; `code` is a ResultCode of the wire protocol."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def no_such_ledger(ledger_id: int) -> StorageError:
    return StorageError(pb.NO_SUCH_LEDGER, f"ledger {ledger_id} is not known to this bookie")


def no_such_entry(ledger_id: int, entry_id: int) -> StorageError:
    return StorageError(pb.NO_SUCH_ENTRY, f"entry {entry_id} of ledger {ledger_id} is not stored on this bookie")


def unauthorized(ledger_id: int) -> StorageError:
    return StorageError(pb.UNAUTHORIZED, f"wrong master key for ledger {ledger_id}")


def fenced(ledger_id: int) -> StorageError:
    return StorageError(pb.FENCED, f"ledger {ledger_id} is fenced: a recovery open has taken it over")


class WriteCacheFull(Exception):
    """The write cache has no room for this batch: the caller waits (wait_for_room) and retries."""
