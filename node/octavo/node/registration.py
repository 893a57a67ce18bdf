"""A bookie's membership in a cluster: cookie check, registration on a lease, keepalive, ledger lookups.

Start (before serving): the cookie in etcd must name this data directory's instance id. A missing cookie is
created; a different one means the directory was wiped or swapped, and the bookie refuses to start (serving
an empty or foreign disk under this identity would silently lose acknowledged entries).

Running: the registration key lives on a lease refreshed every third of its TTL by our own loop. A lease
that is gone (etcd restarted, a long pause) is replaced and the bookie registers again without exiting; an
etcd outage is logged and retried. Stop: the lease is revoked, which removes the registration at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from octavo.meta.errors import CookieMismatchError, MetadataUnavailableError, NoSuchLedgerError
from octavo.meta.etcd import EtcdAuth, EtcdClient
from octavo.meta.layout import Layout
from octavo.meta.ledger_metadata import LedgerMetadata
from octavo.meta.metadata import DECOMMISSIONED_PREFIX, BookieInfo, Cookie, MetadataStore
from octavo.node.storage import Storage

log = logging.getLogger(__name__)

REVOKE_TIMEOUT_S = 1.0


class Registration:
    def __init__(self, storage: Storage, bookie_id: str, address: str) -> None:
        cfg = storage.config
        self.storage = storage
        self.bookie_id = bookie_id
        self.address = address
        self.ttl_s = cfg.registration_ttl_s
        self.etcd = EtcdClient(cfg.etcd, auth=EtcdAuth.from_settings(
            cfg.etcd_tls_ca_file, cfg.etcd_tls_cert_file, cfg.etcd_tls_key_file, cfg.etcd_username,
            cfg.etcd_password_file))
        self.store = MetadataStore(self.etcd, Layout(cfg.cluster))
        self.lease_id = 0
        self.retired = ""  # why this bookie may not register again (it was decommissioned), once it knows
        self.registrations = 0
        # When the lease was last granted or refreshed (time.time()), and why the last attempt failed, if it did:
        # `octavo bookie status` says what is known while etcd is away.
        self.refreshed_unix_s = 0.0
        self.last_error = ""
        self.failing_since_unix_s = 0.0
        self.disk_usage_ratio = 0.0
        # Stopping (drain.py): registered in the read-only set, so no writer chooses this bookie any more.
        self.draining = False
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._cookie_checked = False  # check_cookie passed: start() need not read the cookie again

    async def check_cookie(self) -> None:
        """Raise CookieMismatchError unless this data directory and this bookie id are bound to each other,
        both ways: the bookie id's cookie names this directory's instance id (a wiped or swapped directory is
        refused), and the instance id is bound to this bookie id (a copied directory started under a new id is
        refused: it would serve the original's ledgers twice and count as a second replica)."""
        state = self.storage.node_state
        assert state is not None
        layout = self.store.layout
        cookie = await self.store.read_cookie(self.bookie_id)
        if cookie is None:
            await self._check_instance_owner(state.instance_id)
            mine = Cookie(self.bookie_id, state.instance_id, self.storage.data_dir, state.created_unix_ms)
            if await self.store.create_cookie(mine):
                log.info("bookie %s: cookie created for instance %s", self.bookie_id, state.instance_id)
                self._cookie_checked = True
                return
            cookie = await self.store.read_cookie(self.bookie_id)
        if cookie is not None and cookie.instance_id != state.instance_id:
            why = ("it is a fresh, empty directory: was it wiped?" if self.storage.fresh_instance
                   else "it belongs to another bookie instance: was it swapped?")
            raise CookieMismatchError(
                f"bookie {self.bookie_id} is registered with the data directory instance {cookie.instance_id} "
                f"(at {cookie.data_dir}), but {self.storage.data_dir} holds instance {state.instance_id}; {why} "
                "Refusing to start: serving this disk as that bookie would lose acknowledged entries. To replace "
                f"the bookie on purpose, delete the key {layout.cookie(self.bookie_id).decode()} in etcd first.")
        if await self._check_instance_owner(state.instance_id) is None:  # a cookie from before instance keys
            await self.store.bind_instance(state.instance_id, self.bookie_id)
            await self._check_instance_owner(state.instance_id)
        self._cookie_checked = True

    async def _check_instance_owner(self, instance_id: str) -> str | None:
        """The bookie id the instance is bound to (None: to none yet), unless it is another's: then refuse."""
        owner = await self.store.instance_owner(instance_id)
        if owner is not None and owner.startswith(DECOMMISSIONED_PREFIX):
            raise CookieMismatchError(
                f"{self.storage.data_dir} holds the data directory instance {instance_id} of bookie "
                f"{owner.removeprefix(DECOMMISSIONED_PREFIX)}, which was decommissioned: its copies were moved to "
                "other bookies and it cannot join the cluster again. Stop this process; to run a bookie here, "
                "start it on a new, empty data directory.")
        if owner is not None and owner != self.bookie_id:
            layout = self.store.layout
            raise CookieMismatchError(
                f"{self.storage.data_dir} holds the data directory instance {instance_id}, which is bookie "
                f"{owner}'s; it cannot join as bookie {self.bookie_id}: was it copied? Refusing to start: a copy "
                f"serving {owner}'s ledgers under another id would count as a replica it is not. To move {owner}'s "
                f"disk to the id {self.bookie_id} on purpose, stop {owner} for good and delete the keys "
                f"{layout.instance(instance_id).decode()} and {layout.cookie(owner).decode()} in etcd first.")
        return owner

    def info(self) -> BookieInfo:
        return BookieInfo(self.bookie_id, self.address, readonly=bool(self.storage.read_only_reason) or self.draining,
                          disk_usage_ratio=self.disk_usage_ratio, registered_unix_ms=int(time.time() * 1000),
                          entry_size_bytes_max=self.storage.config.entry_size_bytes_max,
                          batch_entries_max=self.storage.config.batch_entries_max,
                          batch_bytes_max=self.storage.config.batch_bytes_max,
                          started_unix_ms=self.storage.started_unix_ms)

    async def update_mode(self) -> None:
        """Move the registration to the set the bookie's mode says (writable or read-only)."""
        if self.lease_id:
            await self.store.register_bookie(self.info(), self.lease_id)
            log.info("bookie %s registered as %s", self.bookie_id,
                     "read-only" if self.info().readonly else "writable")

    async def register(self) -> None:
        lease_id = await self.etcd.grant_lease(self.ttl_s)
        # The lease is the bookie's only once its registration is on it. Kept from the grant, a put that failed
        # (etcd went away between the two calls) left a lease that the keepalive refreshed for ever with no key on
        # it: a running bookie that no client and no auditor saw again (found by the simulation, seed 1700344). A
        # lease that carries nothing expires by itself, and the next attempt grants another.
        await self.store.register_bookie(self.info(), lease_id)
        self.lease_id = lease_id
        self._refreshed()
        self.registrations += 1
        log.info("bookie %s registered at %s (lease %x, ttl %ds)", self.bookie_id, self.address, self.lease_id,
                 self.ttl_s)

    async def start(self) -> None:
        """Register, after the cookie check (unless it already passed: the server checks before it serves)."""
        if not self._cookie_checked:
            await self.check_cookie()
        await self.register()
        self._task = asyncio.create_task(self._keepalive(), name="octavo-registration")

    async def _keepalive(self) -> None:
        interval = max(self.ttl_s / 3, 0.5)
        while not self._stopping:
            await asyncio.sleep(interval)
            try:
                if self.lease_id and await self.etcd.keep_alive_once(self.lease_id) > 0:
                    self._refreshed()
                    continue
                log.warning("bookie %s: registration lease lost; registering again", self.bookie_id)
                state = self.storage.node_state
                if state is not None:
                    await self._check_instance_owner(state.instance_id)  # decommissioned: never again
                await self.register()
            except CookieMismatchError as e:
                self.retired = str(e)
                self.lease_id = 0
                log.error("bookie %s: not registering again: %s", self.bookie_id, e)
                return
            except MetadataUnavailableError as e:
                if not self.last_error:
                    self.failing_since_unix_s = time.time()
                self.last_error = str(e)
                log.warning("bookie %s: cannot refresh the registration (%s); retrying", self.bookie_id, e)

    def _refreshed(self) -> None:
        self.refreshed_unix_s = time.time()
        self.last_error = ""
        self.failing_since_unix_s = 0.0

    @property
    def registered(self) -> bool:
        """The registration is known to be in etcd: its lease was refreshed less than a TTL ago."""
        return bool(self.lease_id) and time.time() - self.refreshed_unix_s < self.ttl_s

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        # Leave at once if etcd answers; a lease that cannot be revoked quickly (etcd down) expires by itself,
        # so stopping never waits out the etcd timeout.
        if self.lease_id and not self.last_error and not await self.etcd.revoke_lease(self.lease_id,
                                                                                      REVOKE_TIMEOUT_S):
            log.info("bookie %s: could not revoke the registration lease; it expires within %ds", self.bookie_id,
                     self.ttl_s)
        await self.etcd.close()

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata | None:
        """The ledger's metadata in etcd, None if it does not exist."""
        try:
            meta, _ = await self.store.read_ledger(ledger_id)
        except NoSuchLedgerError:
            return None
        return meta
