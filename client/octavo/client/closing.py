"""A writer's close in etcd: the CAS of its ledger's metadata to CLOSED with the last entry and length."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from octavo.client.ensemble_change import ENSEMBLE_CHANGE_ATTEMPTS_MAX
from octavo.meta.errors import LedgerFencedError
from octavo.meta.ledger_metadata import CLOSED, OPEN, LedgerMetadata
from octavo.meta.metadata import MetadataStore
from octavo.meta.retry import CasRetry


async def close_in_etcd(store: MetadataStore, metadata: LedgerMetadata, revision: int, last_entry_id: int,
                        length: int, custom_metadata: dict[str, str] | None,
                        adopt: Callable[[LedgerMetadata, int], None]) -> None:
    """CAS `metadata` (at `revision`) to CLOSED with `last_entry_id` and `length` (and `custom_metadata` when
    given); `adopt` gets each newer metadata and revision read, and the closed one. Called with the handle's
    changes' lock held, so no change of the writer's moves the revision under it: a lost CAS means another party
    wrote the ledger (a recovery open: LedgerFencedError; anything else that left it OPEN: close on top of what
    it wrote)."""
    retry = CasRetry(f"ledger {metadata.ledger_id}: the close", ENSEMBLE_CHANGE_ATTEMPTS_MAX)
    while True:
        closed = metadata.with_state(CLOSED, last_entry_id=last_entry_id, length=length)
        if custom_metadata is not None:
            closed = dataclasses.replace(closed, custom_metadata=custom_metadata)
        closed_revision = await store.update_ledger(closed, revision)
        if closed_revision is not None:
            adopt(closed, closed_revision)
            return
        metadata, revision = await store.read_ledger(metadata.ledger_id)
        if metadata.state == CLOSED and metadata.last_entry_id == last_entry_id:
            adopt(metadata, revision)
            return
        if metadata.state != OPEN:
            raise LedgerFencedError(f"ledger {metadata.ledger_id} is {metadata.state} in etcd (last entry "
                                    f"{metadata.last_entry_id}): a recovery open took it over")
        adopt(metadata, revision)
        await retry.lost(f"revision {revision} ({metadata.state}, {len(metadata.ensembles)} segments)")
