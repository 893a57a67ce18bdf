"""The read handle: reads entries from their write quorum, in batches, with failover and speculative reads.

Entries are read in chunks. Each entry's replicas are its write set, in order; a chunk's entries are grouped
by their first untried replica and read with one request per bookie. A bookie that has not answered after
speculative_read_delay_s gets a second request to the next replica for the same entries, and the first good
answer wins. Entries a replica could not give (missing, UNKNOWN, corrupt, unreachable) are tried on the next
replica; an entry no replica can give is a ReadError.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from octavo.client.context import ClientContext
from octavo.meta.errors import BookieUnavailableError, ReadError
from octavo.meta.ledger_metadata import LedgerMetadata
from octavo.v1 import bookie_pb2 as pb

READ_CHUNK_ENTRIES = 1000


@dataclass(frozen=True, slots=True)
class Entry:
    ledger_id: int
    entry_id: int
    data: bytes


class ReadHandle:
    def __init__(self, client: ClientContext, metadata: LedgerMetadata, last_add_confirmed: int) -> None:
        self._client = client
        self.metadata = metadata
        self._lac = last_add_confirmed

    @property
    def ledger_id(self) -> int:
        return self.metadata.ledger_id

    @property
    def last_entry_id(self) -> int:
        """The last entry readers may read: the closed ledger's last entry, or the LAC of an open one."""
        return self.metadata.last_entry_id if self.metadata.closed else self._lac

    async def read_last_add_confirmed(self) -> int:
        """The last entry of an open ledger that readers may safely read, and remember it.

        The bookies' LACs come first (the highest answer). They lag the writer by one batch (a LAC rides on
        the next add), and a writer that died right after its last batch leaves them behind for good; so
        entries past that LAC are then checked on their write sets: every entry in a row that Qa bookies of
        its write set hold is as good as acknowledged, because a recovery open can never close the ledger
        short of it ((Qw - Qa) + 1 bookies must deny an entry before recovery ends there)."""
        if self.metadata.closed:
            return self.metadata.last_entry_id
        answers = await asyncio.gather(*(self._client.bookie_client(b).read_lac(self.ledger_id)
                                         for b in self.metadata.last_ensemble), return_exceptions=True)
        ok = [a for a in answers if not isinstance(a, BaseException) and a.code == pb.OK]
        # Entries before the last segment were acknowledged before it began.
        floor = self.metadata.ensembles[-1][0] - 1
        lac: int = max([self._lac, floor, *(int(a.last_add_confirmed) for a in ok)])
        stored = max((int(a.last_entry_id) for a in ok), default=-1)
        if stored > lac:
            lac = await self._held_by_ack_quorum(lac, stored)
        self._lac = lac
        return lac

    async def _held_by_ack_quorum(self, lac: int, last: int) -> int:
        """The highest entry id in (lac, last] such that it and every entry before it past `lac` is held by
        Qa bookies of its write set (one read per bookie per window of entries); `lac` if none is."""
        meta = self.metadata
        for start in range(lac + 1, last + 1, READ_CHUNK_ENTRIES):
            ids = list(range(start, min(last, start + READ_CHUNK_ENTRIES - 1) + 1))
            per_bookie: dict[str, list[int]] = {}
            for e in ids:
                for bookie in meta.write_set_bookies(e):
                    per_bookie.setdefault(bookie, []).append(e)
            held: dict[int, int] = {}
            for entries in await asyncio.gather(*(self._held_on(b, es) for b, es in per_bookie.items())):
                for e in entries:
                    held[e] = held.get(e, 0) + 1
            for e in ids:
                if held.get(e, 0) < meta.ack_quorum:
                    return e - 1
        return last

    async def _held_on(self, bookie_id: str, entries: list[int]) -> list[int]:
        """The entries of `entries` that the bookie returns (a read limit may cut the answer: fewer, never more)."""
        try:
            response = await self._client.bookie_client(bookie_id).read(
                self.ledger_id, entries, timeout_s=self._client.options.read_timeout_s)
        except BookieUnavailableError:
            return []
        if response.error:
            return []
        return [item.entry_id for item in response.entries if item.code == pb.OK]

    async def read(self, first: int, last: int) -> AsyncIterator[Entry]:
        """Entries first..last inclusive, in order. `last` may not pass last_entry_id."""
        if first < 0 or last < first:
            raise ValueError(f"invalid range [{first}, {last}]: need 0 <= first <= last")
        if last > self.last_entry_id:
            raise ReadError(f"ledger {self.ledger_id}: entry {last} is past the last readable entry "
                            f"{self.last_entry_id}")
        for start in range(first, last + 1, READ_CHUNK_ENTRIES):
            ids = list(range(start, min(last, start + READ_CHUNK_ENTRIES - 1) + 1))
            found = await self._read_chunk(ids)
            for entry_id in ids:
                yield Entry(self.ledger_id, entry_id, found[entry_id])

    async def read_entries(self, ids: list[int]) -> dict[int, bytes]:
        """The payloads of the given entries, each from its write set (failover and speculation as read());
        ReadError if one cannot be read from any replica."""
        found: dict[int, bytes] = {}
        for start in range(0, len(ids), READ_CHUNK_ENTRIES):
            found.update(await self._read_chunk(ids[start:start + READ_CHUNK_ENTRIES]))
        return found

    async def _read_chunk(self, ids: list[int]) -> dict[int, bytes]:
        found, errors = await self.read_available(ids)
        missing = next((e for e in ids if e not in found), None)
        if missing is not None:
            raise ReadError(f"ledger {self.ledger_id}: entry {missing} could not be read from any replica "
                            f"({errors.get(missing, 'no replica left')})")
        return found

    async def read_available(self, ids: list[int], exclude: set[str] | frozenset[str] = frozenset()
                             ) -> tuple[dict[int, bytes], dict[int, str]]:
        """Every entry of `ids` that some replica gives (bookies in `exclude` are not asked), and for each
        other entry the last error seen: re-replication copies what exists and reports the rest as lost."""
        found: dict[int, bytes] = {}
        tried: dict[int, set[str]] = {e: set(exclude) for e in ids}
        errors: dict[int, str] = {}
        while True:
            remaining = [e for e in ids if e not in found]
            if not remaining:
                return found, {}
            groups = self._group(remaining, tried)
            if not groups:
                return found, {e: errors.get(e, "no replica left") for e in remaining}
            await self._read_groups(groups, tried, found, errors)

    def _group(self, entries: list[int], tried: dict[int, set[str]]) -> dict[str, list[int]]:
        groups: dict[str, list[int]] = {}
        for e in entries:
            for bookie in self.metadata.write_set_bookies(e):
                if bookie not in tried[e]:
                    groups.setdefault(bookie, []).append(e)
                    break
        return groups

    async def _read_groups(self, groups: dict[str, list[int]], tried: dict[int, set[str]], found: dict[int, bytes],
                           errors: dict[int, str]) -> None:
        tasks: dict[asyncio.Task[None], str] = {}
        for bookie, entries in groups.items():
            for e in entries:
                tried[e].add(bookie)
            tasks[asyncio.create_task(self._read_from(bookie, entries, found, errors))] = bookie
        _, pending = await asyncio.wait(tasks, timeout=self._client.options.speculative_read_delay_s)
        if pending:
            # Speculative reads: the slow bookies' entries go to their next replica too.
            slow = [e for task in pending for e in groups[tasks[task]] if e not in found]
            for bookie, entries in self._group(slow, tried).items():
                for e in entries:
                    tried[e].add(bookie)
                tasks[asyncio.create_task(self._read_from(bookie, entries, found, errors))] = bookie
            await asyncio.wait(tasks)

    async def _read_from(self, bookie_id: str, entries: list[int], found: dict[int, bytes],
                         errors: dict[int, str]) -> None:
        try:
            try:
                response = await self._client.bookie_client(bookie_id).read(
                    self.ledger_id, entries, timeout_s=self._client.options.read_timeout_s)
            except BookieUnavailableError:
                if not await self._client.moved(bookie_id):
                    raise
                response = await self._client.bookie_client(bookie_id).read(
                    self.ledger_id, entries, timeout_s=self._client.options.read_timeout_s)
        except BookieUnavailableError as e:
            for entry in entries:
                errors[entry] = str(e)
            return
        if response.error:
            for entry in entries:
                errors[entry] = f"bookie {bookie_id}: {response.error_message}"
            return
        for item in response.entries:
            if item.code == pb.OK:
                found.setdefault(item.entry_id, item.payload)
            else:
                errors[item.entry_id] = f"bookie {bookie_id}: {item.message}"

    async def close(self) -> None:
        """Nothing to release today; kept so read and write handles are used the same way."""

    async def __aenter__(self) -> ReadHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
