"""Read repair, the client's part: a read that got CORRUPT from one replica while another gave the entry reports
the damaged copy as a damage mark in etcd (octavo.meta.damage). The damaged bookie checks the report itself and
repairs its copy from a good replica (node/octavo/node/damagerepair.py); the reader is never slowed by it.

Reports go out in the background, at most REPORTS_IN_FLIGHT_MAX at once per process; past that a report is
dropped and counted (the bookie's scrub finds the damage anyway), as is one that etcd refuses.
"""

from __future__ import annotations

import asyncio
import logging

from octavo.meta.damage import Damage
from octavo.meta.errors import OctavoError
from octavo.meta.etcd import EtcdClient
from octavo.meta.layout import Layout

log = logging.getLogger(__name__)

REPORTS_IN_FLIGHT_MAX = 64
READER = "reader"

_in_flight: set[asyncio.Task[None]] = set()
reports_dropped = 0


def report_damage(etcd: EtcdClient, layout: Layout, ledger_id: int, damaged: dict[str, list[int]],
                  reason: str) -> None:
    """Report copies that answered CORRUPT while another replica gave the entry: bookie id -> entry ids."""
    global reports_dropped
    for bookie_id, entries in damaged.items():
        if len(_in_flight) >= REPORTS_IN_FLIGHT_MAX:
            reports_dropped += 1
            continue
        task = asyncio.create_task(_report(Damage(etcd, layout), ledger_id, bookie_id, entries, reason))
        _in_flight.add(task)
        task.add_done_callback(_in_flight.discard)


async def _report(damage: Damage, ledger_id: int, bookie_id: str, entries: list[int], reason: str) -> None:
    global reports_dropped
    try:
        if await damage.report(ledger_id, bookie_id, entries, reason, READER):
            log.warning("ledger %d: %d entries read CORRUPT from bookie %s and good from another replica; "
                        "reported for repair", ledger_id, len(entries), bookie_id)
    except OctavoError as e:
        reports_dropped += 1
        log.warning("ledger %d: could not report damaged copies on %s (%s)", ledger_id, bookie_id, e)


async def settled() -> None:
    """Wait for the reports in flight (tests, and a client closing)."""
    if _in_flight:
        await asyncio.gather(*list(_in_flight), return_exceptions=True)
