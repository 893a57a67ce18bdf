"""etcd's health as Octavo's operators need to see it: its alarms, and its database against its quota. Pure: it
reads an EtcdStatus (what `EtcdClient.status()` returns) and the configured quota, and says what is wrong.

etcd counts its database *file* (`db_size_bytes`) against its `--quota-backend-bytes`; the part in use is
smaller after a compaction, but the file only shrinks by a defragmentation. When the file reaches the quota,
etcd raises the cluster-wide NOSPACE alarm and refuses every write that adds data until an operator disarms
it: no ledger can be created, closed or deleted anywhere. A CORRUPT alarm (a member's data differs from the
others') makes etcd refuse reads and writes alike. etcd 3.6 reports its quota in its Status answer
(`dbSizeQuota`); 3.5 does not, so the quota comes from a setting that defaults to etcd's own default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# etcd's own default --quota-backend-bytes (2 GiB): what a quota that is neither reported nor configured is.
ETCD_QUOTA_BYTES_DEFAULT = 2 << 30
# A database file this full of its quota is worth a warning: compact and defragment before etcd fills
# (docs/operations.md suggests alerting on etcd's own metrics at the same ratio).
ETCD_QUOTA_WARN_RATIO = 0.8
# Where the recovery steps for a full etcd are written (a heading of docs/operations.md; a test checks it).
ETCD_RECOVERY_DOC = "docs/operations.md#recovering-a-full-etcd-nospace"
NOSPACE = "NOSPACE"
CORRUPT = "CORRUPT"
# Where the quota came from: etcd's Status answer (3.6 and later), or the setting.
QUOTA_FROM_ETCD = "etcd"
QUOTA_FROM_SETTING = "setting"


@dataclass(frozen=True)
class EtcdStatus:
    """One etcd member's status: its revision, its database file (db_size_bytes, what the quota counts) and
    the part of it in use (the rest is free pages that only a defragmentation gives back), the quota etcd
    reports (db_size_quota_bytes, its --quota-backend-bytes: etcd 3.6 and later; 0 when it does not say), and
    the alarms raised in the cluster (NOSPACE: the quota was reached and every write is refused)."""

    revision: int
    db_size_bytes: int
    db_size_in_use_bytes: int
    alarms: tuple[str, ...]
    db_size_quota_bytes: int = 0


@dataclass(frozen=True)
class EtcdHealth:
    """etcd's database against its quota, and its alarms. `refuses_writes`: a NOSPACE or CORRUPT alarm is
    raised, so no ledger can be created, closed or deleted anywhere in the cluster."""

    revision: int
    db_size_bytes: int
    db_size_in_use_bytes: int
    quota_bytes: int
    quota_source: str
    alarms: tuple[str, ...]

    @property
    def db_size_ratio(self) -> float:
        """The database file's size over the quota (1.0 and above: full)."""
        return self.db_size_bytes / self.quota_bytes

    @property
    def refuses_writes(self) -> bool:
        return NOSPACE in self.alarms or CORRUPT in self.alarms

    @property
    def near_quota(self) -> bool:
        return self.db_size_ratio >= ETCD_QUOTA_WARN_RATIO

    def problems(self) -> list[str]:
        """What is wrong, most serious first, each a sentence an operator can act on (empty: healthy)."""
        out = []
        if NOSPACE in self.alarms:
            out.append(f"etcd REFUSES WRITES: its {NOSPACE} alarm is raised (its database reached its quota), so no "
                       "ledger can be created, closed or deleted anywhere in the cluster until an operator "
                       "compacts etcd, defragments every member and disarms the alarm (etcdctl compact, etcdctl "
                       f"defrag, etcdctl alarm disarm: {ETCD_RECOVERY_DOC})")
        if CORRUPT in self.alarms:
            out.append(f"etcd REFUSES READS AND WRITES: its {CORRUPT} alarm is raised (a member's data differs from "
                       "the others'): replace the corrupt member (etcd's disaster recovery docs), then disarm "
                       "the alarm")
        unknown = [a for a in self.alarms if a not in (NOSPACE, CORRUPT)]
        if unknown:
            out.append(f"etcd reports alarms Octavo does not know: {', '.join(unknown)}")
        if NOSPACE not in self.alarms and self.near_quota:
            out.append(f"etcd's database is at {self.db_size_ratio:.0%} of its quota (warning at "
                       f"{ETCD_QUOTA_WARN_RATIO:.0%}): compact and defragment it before it fills and refuses "
                       f"writes: {ETCD_RECOVERY_DOC}")
        return out

    def summary(self) -> str:
        """One line: the database and its quota, and the alarms."""
        return (f"database {self.db_size_bytes / 2**20:.1f} MiB of a {self.quota_bytes / 2**20:.1f} MiB quota "
                f"({self.db_size_ratio:.0%}; quota from {self.quota_source}), "
                f"{self.db_size_in_use_bytes / 2**20:.1f} MiB in use; revision {self.revision}; "
                f"alarms: {', '.join(self.alarms) or 'none'}")

    def to_json(self) -> dict[str, Any]:
        return {"revision": self.revision, "db_size_bytes": self.db_size_bytes,
                "db_size_in_use_bytes": self.db_size_in_use_bytes, "quota_bytes": self.quota_bytes,
                "quota_source": self.quota_source, "db_size_ratio": round(self.db_size_ratio, 4),
                "alarms": list(self.alarms), "refuses_writes": self.refuses_writes, "problems": self.problems(),
                "recovery": ETCD_RECOVERY_DOC}


def etcd_health(status: EtcdStatus, quota_bytes_setting: int = ETCD_QUOTA_BYTES_DEFAULT) -> EtcdHealth:
    """etcd's health from its status; the quota is the one etcd reports when it does (3.6 and later), else
    `quota_bytes_setting` (the --quota-backend-bytes the etcd was started with)."""
    if quota_bytes_setting < 1:
        raise ValueError(f"the etcd quota setting must be >= 1 byte, got {quota_bytes_setting}")
    if status.db_size_quota_bytes > 0:
        quota_bytes, source = status.db_size_quota_bytes, QUOTA_FROM_ETCD
    else:
        quota_bytes, source = quota_bytes_setting, QUOTA_FROM_SETTING
    return EtcdHealth(revision=status.revision, db_size_bytes=status.db_size_bytes,
                      db_size_in_use_bytes=status.db_size_in_use_bytes, quota_bytes=quota_bytes,
                      quota_source=source, alarms=status.alarms)
