"""The errors a client user sees. Each says what happened in words; the types let programs react."""

from __future__ import annotations


class OctavoError(Exception):
    """Base of every Octavo client error."""


class MetadataUnavailableError(OctavoError):
    """etcd could not be reached (every endpoint tried) or refused the call."""


class EtcdSpaceExceededError(MetadataUnavailableError):
    """etcd refused a write because its database reached its quota (--quota-backend-bytes) and it raised its
    NOSPACE alarm: no write succeeds (no ledger can be created, closed or deleted) until an operator compacts,
    defragments and disarms the alarm (docs/operations.md, "What an etcd for Octavo needs"). Never retried:
    the answer stays the same until then."""


class EtcdCompactedError(MetadataUnavailableError):
    """What was asked for is older than etcd's history: a watch's or a read's start revision was compacted
    away. The caller starts again from the current revision (and finds what it missed by a full scan)."""

    def __init__(self, message: str, compact_revision: int) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision  # the oldest revision etcd still has (0: not said)


class NoSuchLedgerError(OctavoError):
    pass


class WrongPasswordError(OctavoError):
    pass


class PermissionDeniedError(OctavoError):
    """This client's identity may not use the ledger (the bookies' tenant_prefixes): the message says what its
    certificate is limited to."""


class LedgerFencedError(OctavoError):
    """A recovery open took the ledger over: this writer can never get another entry acknowledged."""


class LedgerClosedError(OctavoError):
    """The ledger is closed (or closing): no more appends."""


class BufferFullError(OctavoError):
    """A non-blocking append found the write handle's in-flight byte budget (ClientOptions.inflight_bytes_max)
    full: wait for acknowledgements (`await handle.send(...)`, `handle.flush()`) or append with blocking."""


class NotEnoughBookiesError(OctavoError):
    """Fewer writable bookies than the ensemble (or a replacement) needs."""


class EntryRefusedError(OctavoError):
    """An entry was refused for what it is (over a limit, malformed), not because a bookie failed: the
    message names the bookie and its limit. No ensemble change follows a refusal."""


class EntryTooLargeError(EntryRefusedError):
    """An entry is over the client's entry_size_bytes_max or a bookie's own limit (the message says which)."""


class BookieUnavailableError(OctavoError):
    """A bookie could not be reached or failed a call."""


class ReadError(OctavoError):
    """An entry could not be read from any replica."""


class RecoveryError(OctavoError):
    """Recovery could not safely decide the ledger's last entry (not enough bookies answered)."""


class CookieMismatchError(OctavoError):
    """A bookie's data directory does not match its registered identity (wiped or swapped)."""
