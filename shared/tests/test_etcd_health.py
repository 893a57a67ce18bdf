"""etcd's health from its status (pure): the quota etcd reports wins over the setting, the alarms and a database
near its quota become problems an operator can act on, and the recovery steps they point to exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from aetcd import rpc

from octavo.meta.etcd import STATUS_DB_SIZE_QUOTA_FIELD, EtcdStatus, reported_quota_bytes
from octavo.meta.etcdhealth import (
    ETCD_QUOTA_BYTES_DEFAULT,
    ETCD_RECOVERY_DOC,
    QUOTA_FROM_ETCD,
    QUOTA_FROM_SETTING,
    etcd_health,
)

MiB = 1 << 20


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def test_the_quota_etcd_3_6_reports_is_read_from_its_status_answer() -> None:
    """aetcd's stubs predate StatusResponse.dbSizeQuota: it is read from the answer's unknown fields."""
    plain = rpc.StatusResponse(dbSize=5 * MiB, dbSizeInUse=MiB).SerializeToString()
    assert reported_quota_bytes(rpc.StatusResponse.FromString(plain)) == 0  # etcd 3.5
    tag = varint(STATUS_DB_SIZE_QUOTA_FIELD << 3)  # wire type 0: varint
    for quota in (8 << 30, 1, ETCD_QUOTA_BYTES_DEFAULT):
        resp = rpc.StatusResponse.FromString(plain + tag + varint(quota))
        assert resp.dbSize == 5 * MiB and reported_quota_bytes(resp) == quota


def test_the_quota_etcd_reports_wins_over_the_setting() -> None:
    st = EtcdStatus(revision=7, db_size_bytes=50 * MiB, db_size_in_use_bytes=20 * MiB, alarms=())
    by_setting = etcd_health(st, 100 * MiB)
    assert (by_setting.quota_bytes, by_setting.quota_source, by_setting.db_size_ratio) == (
        100 * MiB, QUOTA_FROM_SETTING, 0.5)
    assert etcd_health(st).quota_bytes == ETCD_QUOTA_BYTES_DEFAULT == 2 << 30
    reported = etcd_health(EtcdStatus(7, 50 * MiB, 20 * MiB, (), db_size_quota_bytes=60 * MiB), 100 * MiB)
    assert (reported.quota_bytes, reported.quota_source) == (60 * MiB, QUOTA_FROM_ETCD)
    with pytest.raises(ValueError):
        etcd_health(st, 0)


def test_alarms_and_a_nearly_full_database_are_problems_most_serious_first() -> None:
    healthy = etcd_health(EtcdStatus(1, 79 * MiB, 10 * MiB, ()), 100 * MiB)
    assert healthy.problems() == [] and not healthy.refuses_writes
    assert healthy.summary() == ("database 79.0 MiB of a 100.0 MiB quota (79%; quota from setting), 10.0 MiB in "
                                 "use; revision 1; alarms: none")
    near = etcd_health(EtcdStatus(1, 80 * MiB, 10 * MiB, ()), 100 * MiB)
    assert not near.refuses_writes and len(near.problems()) == 1
    assert near.problems()[0].startswith("etcd's database is at 80% of its quota") and ETCD_RECOVERY_DOC in \
        near.problems()[0]
    full = etcd_health(EtcdStatus(1, 100 * MiB, 99 * MiB, ("CORRUPT", "NOSPACE")), 100 * MiB)
    assert full.refuses_writes and full.to_json()["refuses_writes"] is True
    problems = full.problems()
    assert len(problems) == 2  # the near-quota warning says nothing NOSPACE does not
    assert problems[0].startswith("etcd REFUSES WRITES: its NOSPACE alarm") and ETCD_RECOVERY_DOC in problems[0]
    assert problems[1].startswith("etcd REFUSES READS AND WRITES: its CORRUPT alarm")
    assert etcd_health(EtcdStatus(1, MiB, MiB, ("CORRUPT",)), 100 * MiB).refuses_writes


def test_the_recovery_steps_the_status_points_to_exist() -> None:
    path, anchor = ETCD_RECOVERY_DOC.split("#")
    text = (Path(__file__).resolve().parents[2] / path).read_text()
    headings = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in
                re.findall(r"^#+ (.+)$", text, re.MULTILINE)}
    assert anchor in headings
    section = text.split("Recovering a full etcd", 1)[1]
    assert "etcdctl --endpoints \"$ETCD\" alarm disarm" in section
