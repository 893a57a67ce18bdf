"""Tail repair (BookKeeper's BP-46): after an unclean stop across a reboot, copy back from the peers every
acknowledged entry this bookie should hold but may have lost, then stop answering UNKNOWN.

Which entries: for every ledger in etcd whose ensemble segments include this bookie, the entries of each such
segment whose write set includes this bookie's position, up to the segment's end (the next segment's first
entry - 1; for the last segment, the closed ledger's last entry or the highest LAC its bookies report).
Entries covered by the durable index (at or below the ledger's durable last entry at startup) survived the
crash and are skipped. Missing ones are read from the other replicas and stored with recovery adds (they pass
a fence: the bookie only restores what the cluster acknowledged).

Until the repair has gone through every ledger, the bookie keeps answering UNKNOWN for what it lacks and says
tail_maybe_lost, so recovery never takes its word that an entry does not exist. A repair that fails (etcd or
peers unreachable) is retried with backoff.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from itertools import pairwise

from octavo.client.client import Client
from octavo.client.options import ClientOptions
from octavo.client.reader import ReadHandle
from octavo.meta.errors import OctavoError
from octavo.meta.ledger_metadata import LedgerMetadata, write_set
from octavo.node.config import NodeConfig
from octavo.node.engine import Engine
from octavo.node.errors import StorageError, WriteCacheFull
from octavo.node.startup import tail_repair_done
from octavo.v1 import bookie_pb2 as pb

log = logging.getLogger(__name__)

REPAIR_RETRY_DELAY_S_MAX = 30.0


def peer_client(cfg: NodeConfig) -> Client:
    """A client on this bookie's settings (etcd, TLS), to read from its peers."""
    options = ClientOptions(tls_cert_file=cfg.tls_cert_file, tls_key_file=cfg.tls_key_file,
                            tls_ca_file=cfg.tls_ca_file,
                            etcd_tls_ca_file=cfg.etcd_tls_ca_file, etcd_tls_cert_file=cfg.etcd_tls_cert_file,
                            etcd_tls_key_file=cfg.etcd_tls_key_file, etcd_username=cfg.etcd_username,
                            etcd_password_file=cfg.etcd_password_file)
    return Client(cfg.etcd, cfg.cluster, options)


class TailRepair:
    def __init__(self, engine: Engine, bookie_id: str) -> None:
        self.engine = engine
        self.bookie_id = bookie_id
        self.entries_restored = 0
        self.ledgers_checked = 0
        # Highest durable entry per ledger when the bookie started: everything up to it survived.
        self._durable = {lid: st.durable_last_entry_id for lid, st in engine.ledgers.items()}

    async def run(self) -> None:
        delay = 1.0
        while True:
            try:
                await self._run_once()
                return
            except (OctavoError, StorageError) as e:
                log.warning("tail repair failed (%s); retrying in %.0fs", e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, REPAIR_RETRY_DELAY_S_MAX)

    async def _run_once(self) -> None:
        async with peer_client(self.engine.config) as client:
            await client.bookies(refresh=True)
            for ledger_id in await client.list_ledgers():
                try:
                    meta = await client.ledger_metadata(ledger_id)
                except OctavoError:
                    continue  # deleted meanwhile
                if any(self.bookie_id in bookies for _, bookies in meta.ensembles):
                    await self._repair_ledger(client, meta)
                    self.ledgers_checked += 1
        try:  # persisted first: a crash before this line makes the next start repair again, which is harmless
            await asyncio.get_running_loop().run_in_executor(None, tail_repair_done, self.engine.io,
                                                             self.engine.data_dir, self.engine.node_state)
        except OSError as e:
            log.warning("tail repair done, but the node state could not say so (%s): the next start repairs again", e)
        self.engine.tail_repaired()
        log.info("tail repair done: %d ledgers checked, %d entries copied back from peers; this bookie is sure "
                 "of its contents again", self.ledgers_checked, self.entries_restored)

    async def _repair_ledger(self, client: Client, meta: LedgerMetadata) -> None:
        last = meta.last_entry_id if meta.closed else await self._peers_last_entry(client, meta)
        reader = ReadHandle(client, meta, last)
        durable = self._durable.get(meta.ledger_id, -1)
        missing: list[int] = []
        segments = [*meta.ensembles, (last + 1, ())]
        for (first, bookies), (next_first, _) in pairwise(segments):
            if self.bookie_id not in bookies:
                continue
            position = bookies.index(self.bookie_id)
            for entry in range(max(first, durable + 1), min(next_first - 1, last) + 1):
                if position in write_set(entry, meta.ensemble_size, meta.write_quorum) \
                        and not self._has(meta.ledger_id, entry):
                    missing.append(entry)
        if not missing:
            return
        if not meta.master_key_hex:
            log.error("ledger %d: %d entries lost here, but its metadata has no master key to restore them with",
                      meta.ledger_id, len(missing))
            return
        payloads = await reader.read_entries(missing)
        key = bytes.fromhex(meta.master_key_hex)
        for start in range(0, len(missing), self.engine.config.batch_entries_max):
            ids = missing[start:start + self.engine.config.batch_entries_max]
            codes, message = await self._add(meta.ledger_id, key, ids, [payloads[e] for e in ids])
            if any(codes):
                raise StorageError(pb.INTERNAL, f"restoring ledger {meta.ledger_id}: {message}")
        self.entries_restored += len(missing)
        log.info("ledger %d: copied %d lost entries back from peers", meta.ledger_id, len(missing))

    async def _add(self, ledger_id: int, key: bytes, ids: list[int], payloads: list[bytes]) -> tuple[list[int], str]:
        loop = asyncio.get_running_loop()
        while True:
            try:  # on a thread: under fsync_policy=batch the add waits for its fdatasync, never on the loop
                codes, message = await loop.run_in_executor(
                    None, functools.partial(self.engine.add_entries, ledger_id, key, ids, payloads, recovery=True))
                return list(codes), message
            except WriteCacheFull:
                await loop.run_in_executor(None, self.engine.wait_for_room, len(ids), 30.0)

    async def _peers_last_entry(self, client: Client, meta: LedgerMetadata) -> int:
        """For an open ledger: the highest entry any other bookie of the last ensemble holds (the LAC they
        know lags the writer's). Restoring an entry that was never acknowledged is harmless: a recovery
        open would re-replicate it anyway.

        Every peer must answer: one that is unreachable, unregistered or itself unsure (UNKNOWN) may hold the
        only other copy of an acknowledged entry this bookie lost (with Qw = 2, the peer it shared that entry's
        write set with), and a repair that went on without it would end short of that entry and stop answering
        UNKNOWN; a recovery open then took this bookie's "no such entry" as a denial and closed the ledger
        before an acknowledged entry (found by the simulation, seed 2600299). The repair is tried again later
        instead; once the ledger is closed its end comes from etcd."""
        async def one(bookie: str) -> int:
            try:
                answer = await client.bookie_client(bookie).read_lac(meta.ledger_id)
            except OctavoError as e:
                raise OctavoError(f"ledger {meta.ledger_id}: peer {bookie} did not answer ({e}); its last entry "
                                  "is not known") from e
            if answer.code == pb.NO_SUCH_LEDGER:  # it never got an entry of this ledger
                return -1
            if answer.code != pb.OK:
                raise OctavoError(f"ledger {meta.ledger_id}: peer {bookie} cannot tell its last entry "
                                  f"({pb.ResultCode.Name(answer.code)})")
            return int(max(answer.last_add_confirmed, answer.last_entry_id))

        peers = [b for b in meta.last_ensemble if b != self.bookie_id]
        return max([-1, *await asyncio.gather(*(one(b) for b in peers))])

    def _has(self, ledger_id: int, entry_id: int) -> bool:
        return self.engine.has_entry(ledger_id, entry_id)
