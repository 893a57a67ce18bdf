"""When the auditor's loops on intervals of their own (dataset maintenance, the replicas check; etcd compaction's
is in test_etcdcompaction.py) have work due: AutoRecovery sleeps until then instead of looking every tick, so
next_due must name the first time a tick would act, and None while there is nothing to do until the auditor role
changes."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from octavo.node.datasetmaintenance import DatasetMaintenance, DatasetMaintenanceSettings, due
from octavo.node.replicascheck import ReplicasCheck

lasts = st.one_of(st.none(), st.integers(0, 10_000))


@given(lasts, lasts, st.integers(0, 600), st.integers(0, 600), st.integers(0, 20_000))
def test_dataset_maintenance_is_due_at_the_first_of_its_two_steps(
        last_maintenance: int | None, last_orphans: int | None, interval_s: int, orphan_interval_s: int,
        now_s: int) -> None:
    maintenance = DatasetMaintenance(DatasetMaintenanceSettings(interval_s, 1, 1, orphan_interval_s, 1))
    maintenance.last_maintenance_s, maintenance.last_orphans_s = last_maintenance, last_orphans
    assert maintenance.next_due(False) is None
    acts = due(now_s, last_maintenance, interval_s) or due(now_s, last_orphans, orphan_interval_s)
    at = maintenance.next_due(True)
    assert (at is not None and now_s >= at) == acts


def test_the_replicas_check_is_due_an_interval_after_its_bookie_became_the_auditor() -> None:
    async def scenario() -> None:
        check = ReplicasCheck(interval_s=60.0, rate_bytes_per_s=1)
        assert check.next_due(True) == 0.0  # never ticked: a tick at once starts its clock
        # Ticks that are not due never reach etcd: no client is needed for them.
        await check.tick(None, True, 100.0)  # type: ignore[arg-type]
        assert check.next_due(True) == 160.0
        await check.tick(None, True, 159.0)  # type: ignore[arg-type]
        assert check.next_due(True) == 160.0
        await check.tick(None, False, 170.0)  # type: ignore[arg-type]  # no longer the auditor: the clock resets
        assert check.next_due(False) is None
        assert check.next_due(True) == 0.0
        assert ReplicasCheck(interval_s=0.0, rate_bytes_per_s=1).next_due(True) is None  # off

    asyncio.run(scenario())
