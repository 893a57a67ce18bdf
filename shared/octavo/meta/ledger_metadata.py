"""Ledger metadata: what etcd holds about a ledger, its legal state changes, and quorum arithmetic. Pure.

States: OPEN -> IN_RECOVERY -> CLOSED, or OPEN -> CLOSED (a writer's own close). Anything else raises.
Ensemble segments: (first entry id, bookie ids); segment k covers entries from its first entry up to the next
segment's first entry. Entry e goes to the write quorum of Qw bookies starting at position e mod E.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any

OPEN = "OPEN"
IN_RECOVERY = "IN_RECOVERY"
CLOSED = "CLOSED"
STATES = (OPEN, IN_RECOVERY, CLOSED)
METADATA_FORMAT_VERSION = 1
ENSEMBLE_SIZE_MAX = 64
CUSTOM_METADATA_BYTES_MAX = 64 * 1024
PASSWORD_BYTES_MAX = 1024
# The custom-metadata key naming a ledger's dataset (octavo.client.dataset writes it; tenant_prefixes reads it).
META_DATASET = "octavo.dataset"

_TRANSITIONS = {(OPEN, IN_RECOVERY), (OPEN, CLOSED), (IN_RECOVERY, CLOSED), (IN_RECOVERY, IN_RECOVERY)}


class MetadataError(ValueError):
    """Metadata that breaks an invariant, or a state change that cannot happen."""


def master_key(password: bytes) -> bytes:
    """The key bookies check on every write and fence; derived, never the password itself."""
    return hashlib.sha256(b"octavo-master-key\0" + password).digest()


def password_digest(password: bytes) -> str:
    """What etcd stores to check a password on open: a different derivation than the master key."""
    return hashlib.sha256(b"octavo-password\0" + password).hexdigest()


def check_quorums(ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
    if not 1 <= ack_quorum <= write_quorum <= ensemble_size <= ENSEMBLE_SIZE_MAX:
        raise MetadataError(f"need 1 <= ack_quorum ({ack_quorum}) <= write_quorum ({write_quorum}) <= "
                            f"ensemble_size ({ensemble_size}) <= {ENSEMBLE_SIZE_MAX}")


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> list[int]:
    """Positions in the ensemble that store entry `entry_id` (striping: starting at e mod E)."""
    start = entry_id % ensemble_size
    return [(start + i) % ensemble_size for i in range(write_quorum)]


LENGTH_UNKNOWN = -1


@dataclass(frozen=True)
class LedgerMetadata:
    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    ensembles: tuple[tuple[int, tuple[str, ...]], ...]
    password_digest: str
    state: str = OPEN
    last_entry_id: int = -1
    # Payload bytes of a closed ledger; LENGTH_UNKNOWN when a recovery open closed it without reading every
    # entry (it reads only past the LAC). 0 while open.
    length: int = 0
    custom_metadata: dict[str, str] = field(default_factory=dict)
    created_unix_ms: int = 0
    # The bookies' master key (hex), so a bookie that lost a ledger's entries can take its copies back from
    # its peers (BP-46). etcd is the trusted authority of a ledger anyway; the password stays a digest.
    master_key_hex: str = ""

    def __post_init__(self) -> None:
        check_quorums(self.ensemble_size, self.write_quorum, self.ack_quorum)
        if self.state not in STATES:
            raise MetadataError(f"unknown ledger state {self.state!r}")
        if not self.ensembles or self.ensembles[0][0] != 0:
            raise MetadataError("the first ensemble segment must start at entry 0")
        for (first, bookies), nxt in zip(self.ensembles, [*self.ensembles[1:], None], strict=True):
            if len(bookies) != self.ensemble_size or len(set(bookies)) != len(bookies):
                raise MetadataError(f"segment at entry {first} must list {self.ensemble_size} distinct bookies")
            if nxt is not None and nxt[0] <= first:
                raise MetadataError("ensemble segments must start at increasing entry ids")
        if self.state == CLOSED and self.last_entry_id < -1:
            raise MetadataError("a closed ledger's last entry id must be >= -1")

    # -- queries -----------------------------------------------------------------------------------
    def ensemble_at(self, entry_id: int) -> tuple[str, ...]:
        """The bookies of the segment that covers `entry_id`."""
        chosen = self.ensembles[0][1]
        for first, bookies in self.ensembles:
            if first > entry_id:
                break
            chosen = bookies
        return chosen

    def write_set_bookies(self, entry_id: int) -> list[str]:
        ensemble = self.ensemble_at(entry_id)
        return [ensemble[i] for i in write_set(entry_id, self.ensemble_size, self.write_quorum)]

    @property
    def last_ensemble(self) -> tuple[str, ...]:
        return self.ensembles[-1][1]

    @property
    def closed(self) -> bool:
        return self.state == CLOSED

    # -- changes (each returns a new object, checked) --------------------------------------------------
    def with_segment(self, first_entry_id: int, bookies: tuple[str, ...]) -> LedgerMetadata:
        """A new ensemble segment from `first_entry_id` (replacing the last one if it starts there too)."""
        if self.state != OPEN:
            raise MetadataError(f"ledger {self.ledger_id} is {self.state}: its ensemble cannot change")
        last_first = self.ensembles[-1][0]
        if first_entry_id < last_first:
            raise MetadataError(f"new segment at {first_entry_id} starts before the last one at {last_first}")
        kept = self.ensembles[:-1] if first_entry_id == last_first else self.ensembles
        return replace(self, ensembles=(*kept, (first_entry_id, tuple(bookies))))

    def with_ensembles(self, ensembles: tuple[tuple[int, tuple[str, ...]], ...]) -> LedgerMetadata:
        """The same segments, boundaries unchanged, with bookies replaced (re-replication): allowed in any state,
        since it moves copies, not entries. Checked like any metadata (distinct bookies per segment)."""
        if [first for first, _ in ensembles] != [first for first, _ in self.ensembles]:
            raise MetadataError(f"ledger {self.ledger_id}: re-replication may replace bookies, not move segments")
        return replace(self, ensembles=tuple((first, tuple(bookies)) for first, bookies in ensembles))

    def with_state(self, state: str, last_entry_id: int | None = None, length: int | None = None) -> LedgerMetadata:
        if (self.state, state) not in _TRANSITIONS:
            raise MetadataError(f"ledger {self.ledger_id}: {self.state} -> {state} is not a legal change")
        changes: dict[str, Any] = {"state": state}
        if state == CLOSED:
            if last_entry_id is None or length is None:
                raise MetadataError("closing a ledger needs its last entry id and length")
            changes.update(last_entry_id=last_entry_id, length=length)
        return replace(self, **changes)

    # -- encoding ------------------------------------------------------------------------------------
    def encode(self) -> bytes:
        return json.dumps({
            "format_version": METADATA_FORMAT_VERSION, "ledger_id": self.ledger_id,
            "ensemble_size": self.ensemble_size, "write_quorum": self.write_quorum, "ack_quorum": self.ack_quorum,
            "state": self.state, "last_entry_id": self.last_entry_id, "length": self.length,
            "ensembles": [[first, list(bookies)] for first, bookies in self.ensembles],
            "password_digest": self.password_digest, "custom_metadata": self.custom_metadata,
            "created_unix_ms": self.created_unix_ms, "master_key_hex": self.master_key_hex,
        }, sort_keys=True).encode()

    @staticmethod
    def decode(data: bytes) -> LedgerMetadata:
        try:
            d = json.loads(data)
            if d.get("format_version") != METADATA_FORMAT_VERSION:
                raise MetadataError(f"unsupported ledger metadata version {d.get('format_version')!r}")
            return LedgerMetadata(
                ledger_id=int(d["ledger_id"]), ensemble_size=int(d["ensemble_size"]),
                write_quorum=int(d["write_quorum"]), ack_quorum=int(d["ack_quorum"]), state=d["state"],
                last_entry_id=int(d["last_entry_id"]), length=int(d["length"]),
                ensembles=tuple((int(first), tuple(bookies)) for first, bookies in d["ensembles"]),
                password_digest=d["password_digest"], custom_metadata=dict(d.get("custom_metadata") or {}),
                created_unix_ms=int(d.get("created_unix_ms", 0)), master_key_hex=str(d.get("master_key_hex", "")))
        except (ValueError, KeyError, TypeError) as e:
            raise MetadataError(f"ledger metadata is not valid: {e}") from e
