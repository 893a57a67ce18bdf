"""The bookie's settings and limits. Every limit has its unit last in its name and is checked at startup."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

FSYNC_POLICY_NONE = "none"    # the default: durability from replication and background flushes of rolled logs
FSYNC_POLICY_BATCH = "batch"  # paranoid: fdatasync the active log before acknowledging each batch of adds
FSYNC_POLICIES = (FSYNC_POLICY_NONE, FSYNC_POLICY_BATCH)

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB


class ConfigError(ValueError):
    """A setting out of its range; the message names the setting and the range."""


@dataclass(frozen=True)
class NodeConfig:
    data_dir: str
    host: str = "127.0.0.1"
    port: int = 3181
    # The address other processes use to reach this bookie; defaults to host:port.
    advertised_address: str = ""

    # Cluster membership: etcd endpoints (host:port[,host:port...]); empty runs the bookie standalone.
    etcd: str = ""
    cluster: str = "default"
    # The bookie's identity in the cluster; defaults to its advertised address. It must stay the same across
    # restarts: the cookie in etcd binds it to this data directory.
    bookie_id: str = ""
    # The registration lease: a bookie that stops refreshing it drops out of the cluster after this long.
    registration_ttl_s: int = 10
    # After an unclean stop across a reboot, copy back from the peers the entries this bookie should hold
    # but lost (BP-46). Off only for tests of what happens before the repair.
    tail_repair: bool = True
    # How often a bookie in a cluster looks for ledgers deleted from etcd and deletes logs with nothing alive.
    gc_interval_ms: int = 60_000

    # Self-healing (autorecovery.py), cluster mode only. One bookie at a time is the auditor: a bookie whose
    # registration has been gone for lost_bookie_delay_s (a restart within it is not re-replicated) gets every
    # ledger naming it marked under-replicated; every audit_interval_s it also checks every ledger's ensembles
    # for bookies that have neither a registration nor a cookie. Writable bookies run replication workers
    # (at most replication_workers_max ledgers at once each) that copy the missing copies at most
    # replication_rate_bytes_per_s, in adds of at most replication_batch_bytes_max. An open ledger's last
    # segment is left to its writer for open_ledger_grace_s after the mark; then it is recovery-opened.
    autorecovery_enabled: bool = True
    # The auditor's and the workers' passes read etcd when a registration, cookie, mark or lock changes there
    # (an etcd watch), when work of theirs falls due, and otherwise at least every autorecovery_idle_interval_s
    # (wakeups.py): an idle bookie then makes about 0.35 etcd requests a second, not six.
    autorecovery_idle_interval_s: float = 30.0
    lost_bookie_delay_s: float = 60.0
    audit_interval_s: float = 600.0
    # Every replicas_check_interval_s (0: off) the auditor also checks that every entry of every sealed segment
    # is on each bookie of its write set, and marks the copies missing on live bookies for the workers to
    # restore (replicascheck.py; BookKeeper's auditorReplicasCheckInterval).
    replicas_check_interval_s: float = 86_400.0
    open_ledger_grace_s: float = 300.0
    # 4 MiB/s per bookie: the rate at which a writer on a 2-core machine kept 70% of its throughput while a
    # lost bookie's gigabyte was re-replicated (docs/benchmarks.md, "Re-replication"); raise it on machines
    # with cores to spare to heal faster.
    replication_rate_bytes_per_s: int = 4 * MIB
    replication_batch_bytes_max: int = 4 * MIB
    replication_workers_max: int = 2
    # Bit rot (scrub.py, damagerepair.py). Every scrub_interval_s (0: only when asked, `octavo bookie scrub`)
    # a scrub pass re-reads every flushed record and checks its checksum, at most scrub_rate_bytes_per_s (8 MiB/s:
    # a 100 GiB bookie is scrubbed in about 3.5 hours); what fails is marked damaged in etcd. Every
    # damage_check_interval_s the bookie checks the damage marks naming it and repairs its damaged copies in place
    # from the other replicas (docs/durability.md, "Bit rot").
    scrub_interval_s: int = 86_400
    scrub_rate_bytes_per_s: int = 8 * MIB
    damage_check_interval_s: float = 10.0
    # The auditor also keeps etcd's history bounded (etcdcompaction.py): every etcd_compaction_interval_s it
    # notes etcd's revision and compacts etcd to the revision it noted one interval before (so at least one
    # interval of history stays for watches to resume from). 0: Octavo never compacts, for an etcd that its
    # owner compacts (auto-compaction, or another program's compaction).
    etcd_compaction_interval_s: int = 300
    # The auditor also maintains datasets (datasetmaintenance.py): every dataset_maintenance_interval_s it folds
    # each dataset's commit log into a checkpoint once the log is long, then merges runs of small ledgers into
    # ledgers of dataset_merge_target_bytes, copying at most dataset_merge_budget_bytes per interval over all
    # datasets (0 interval: off). Every dataset_orphan_interval_s it deletes the ledgers written for datasets that
    # no version needs and that are older than dataset_orphan_grace_s (failed tasks', abandoned writes', merged
    # or overwritten ledgers past their retention), in one pass over the cluster's ledgers (0 interval: off).
    dataset_maintenance_interval_s: int = 60
    dataset_merge_target_bytes: int = 128 * MIB
    dataset_merge_budget_bytes: int = 256 * MIB
    dataset_orphan_interval_s: int = 600
    dataset_orphan_grace_s: int = 3600

    # Compaction (compaction.py): a flushed log whose live share is below a threshold is rewritten. Minor
    # passes (small threshold, cheap) run more often than major ones. The rate limit bounds the bytes copied
    # per second (0: unlimited); a pass stops at a safe point after its maximum run time.
    compaction_enabled: bool = True
    compaction_minor_threshold: float = 0.2
    compaction_major_threshold: float = 0.8
    compaction_minor_interval_ms: int = 3_600_000
    compaction_major_interval_ms: int = 86_400_000
    compaction_rate_bytes_per_s: int = 32 * MIB
    compaction_run_time_ms_max: int = 3_600_000

    # Disk watermarks (disk.py), as shares of each data directory's filesystem: past `warn` a warning is
    # logged, past `readonly` the bookie refuses new adds, and it turns writable again only below `writable`.
    disk_check_interval_ms: int = 2_000
    disk_warn_ratio: float = 0.90
    disk_readonly_ratio: float = 0.95
    disk_writable_ratio: float = 0.85
    # Use this capacity instead of the filesystem's (0: the filesystem's): for a bookie given a quota on a
    # shared filesystem. Usage is then the bytes under the data directory.
    disk_capacity_bytes: int = 0

    # Entry logs: rolled when they reach this size (KAFKA-615's segment size).
    log_size_bytes_max: int = 1 * GIB
    # A log with unsynced data older than this is rolled, so a quiet bookie still moves its recovery point.
    log_roll_interval_ms: int = 60_000
    # A fence or write-close rolls the active log only if it holds at least this much (seed 003), so a burst
    # of closing ledgers does not make a burst of tiny logs; smaller logs roll with the interval above.
    log_rotate_on_close_bytes_min: int = 1 * MIB
    fsync_policy: str = FSYNC_POLICY_NONE

    # The write cache indexes entries in logs not yet flushed; at this many entries adds wait for the flusher.
    # A log is rolled when it alone holds half of this, so flushing and appending overlap.
    write_cache_entries_max: int = 1_000_000
    # How long an add waits for room in the write cache before it fails with INTERNAL "write cache full".
    add_wait_ms_max: int = 30_000

    entry_size_bytes_max: int = 4 * MIB
    batch_entries_max: int = 10_000
    batch_bytes_max: int = 16 * MIB
    read_entries_max: int = 10_000
    read_bytes_max: int = 16 * MIB
    # Tailing reads (ReadTail): the longest a long poll is held, and how many may be held at once (more are
    # answered BUSY at once).
    long_poll_wait_ms_max: int = 30_000
    long_poll_waiters_max: int = 10_000
    open_log_files_max: int = 256
    index_map_size_bytes: int = 64 * GIB

    # Observability (octavo.telemetry, node/octavo/node/bookiemetrics.py). Prometheus text on
    # http://host:metrics_port/metrics (-1: no endpoint; 0: a free port, written to the ready file). With an
    # otlp_endpoint (host:port of an OpenTelemetry collector's gRPC receiver, https:// for TLS) metrics are
    # also pushed and sampled spans exported. A request carrying a sampled trace context always gets a span;
    # other requests get one at trace_sample_ratio (0: none).
    metrics_port: int = -1
    otlp_endpoint: str = ""
    trace_sample_ratio: float = 0.0

    # TLS on the gRPC port (both planes; docs/security.md): this bookie's certificate chain and key (PEM), and
    # the CA bundle its peers' certificates must chain to. With a certificate the port serves TLS only;
    # tls_client_auth "require" (the default) refuses clients without a certificate of tls_ca_file, "none"
    # serves server-side TLS. The files are read again when they change (renewal without a restart). The same
    # files are this bookie's identity when it calls other bookies (re-replication, tail repair).
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""
    tls_client_auth: str = "require"
    # Tenants (docs/security.md, node/octavo/node/tenants.py): "IDENTITY=PREFIX[,PREFIX...][;...]" limits each
    # listed client certificate (CN or SAN) to ledgers whose dataset starts with one of its prefixes. Needs
    # client certificates (TLS with tls_client_auth require) and etcd.
    tenant_prefixes: str = ""
    # Serve the metrics endpoint (/metrics, /healthz) over TLS with the same certificate (server-side only:
    # Prometheus checks the bookie, the bookie does not ask Prometheus for a certificate).
    metrics_tls: bool = False
    # etcd over TLS and with authentication (docs/security.md): the CA of etcd's certificate, a client
    # certificate and key (with etcd's --client-cert-auth its common name is the etcd user), and/or a user
    # name with a file holding its password (never a flag: it would show in the process list).
    etcd_tls_ca_file: str = ""
    etcd_tls_cert_file: str = ""
    etcd_tls_key_file: str = ""
    etcd_username: str = ""
    etcd_password_file: str = ""
    # Who may call the admin plane (status, read-only, GC, compaction): client certificates whose common name
    # or a subject alternative name is in admin_identities (comma-separated), and callers with the bearer token
    # of admin_token_file. Both empty: any client the transport accepts (adminauth.py, docs/security.md).
    admin_identities: str = ""
    admin_token_file: str = ""

    def validate(self) -> NodeConfig:
        """Self, or ConfigError naming every setting out of its range (all of them, "; "-separated)."""
        # A start validates the same settings in each part it builds (the server, the storage); they are frozen,
        # so the checks (pure, over every field) run once per instance.
        if self.__dict__.get("_validated"):
            return self
        problems = self.problems()
        if problems:
            raise ConfigError("; ".join(problems))
        object.__setattr__(self, "_validated", True)
        return self

    def problems(self) -> list[str]:
        """Every setting out of its range or at odds with another, one message each naming the setting."""
        found: list[str] = []

        def need(ok: bool, msg: str) -> None:
            if not ok:
                found.append(msg)

        need(bool(self.data_dir), "data_dir must be set")
        need(0 <= self.port <= 65535, f"port must be in [0, 65535], got {self.port}")
        need(self.fsync_policy in FSYNC_POLICIES,
             f"fsync_policy must be one of {', '.join(FSYNC_POLICIES)}, got {self.fsync_policy!r}")
        need(64 * KIB <= self.log_size_bytes_max <= 64 * GIB,
             f"log_size_bytes_max must be in [64 KiB, 64 GiB], got {self.log_size_bytes_max}")
        need(self.log_rotate_on_close_bytes_min >= 0, "log_rotate_on_close_bytes_min must be >= 0")
        need(self.write_cache_entries_max >= 2 * self.batch_entries_max,
             f"write_cache_entries_max ({self.write_cache_entries_max}) must be at least twice "
             f"batch_entries_max ({self.batch_entries_max})")
        need(1 <= self.entry_size_bytes_max <= 32 * MIB,
             f"entry_size_bytes_max must be in [1, 32 MiB], got {self.entry_size_bytes_max}")
        need(self.entry_size_bytes_max <= self.batch_bytes_max <= 1 * GIB,
             "batch_bytes_max must be in [entry_size_bytes_max, 1 GiB]")
        need(self.batch_bytes_max < self.log_size_bytes_max,
             f"batch_bytes_max ({self.batch_bytes_max}) must be below log_size_bytes_max ({self.log_size_bytes_max})")
        need(1 <= self.batch_entries_max <= 1_000_000, "batch_entries_max must be in [1, 1000000]")
        need(1 <= self.read_entries_max <= 1_000_000, "read_entries_max must be in [1, 1000000]")
        need(self.entry_size_bytes_max <= self.read_bytes_max <= 1 * GIB,
             "read_bytes_max must be in [entry_size_bytes_max, 1 GiB]")
        need(0 <= self.long_poll_wait_ms_max <= 600_000, "long_poll_wait_ms_max must be in [0, 600000]")
        need(1 <= self.long_poll_waiters_max <= 1_000_000, "long_poll_waiters_max must be in [1, 1000000]")
        need(8 <= self.open_log_files_max <= 65536, "open_log_files_max must be in [8, 65536]")
        need(2 <= self.registration_ttl_s <= 300, "registration_ttl_s must be in [2, 300]")
        need(bool(self.cluster) and "/" not in self.cluster, "cluster must be non-empty without '/'")
        need("/" not in self.bookie_id, "bookie_id must not contain '/'")
        need(0.0 < self.compaction_minor_threshold < self.compaction_major_threshold <= 1.0,
             f"compaction thresholds must satisfy 0 < minor < major <= 1, got minor "
             f"{self.compaction_minor_threshold} and major {self.compaction_major_threshold}")
        need(self.compaction_rate_bytes_per_s >= 0, "compaction_rate_bytes_per_s must be >= 0 (0: unlimited)")
        need(0.0 < self.disk_writable_ratio < self.disk_readonly_ratio <= 1.0,
             f"disk watermarks must satisfy 0 < disk_writable_ratio < disk_readonly_ratio <= 1, got "
             f"{self.disk_writable_ratio} and {self.disk_readonly_ratio}")
        need(0.0 < self.disk_warn_ratio <= self.disk_readonly_ratio,
             f"disk_warn_ratio must be in (0, disk_readonly_ratio], got {self.disk_warn_ratio}")
        need(self.disk_capacity_bytes >= 0, "disk_capacity_bytes must be >= 0 (0: the filesystem's capacity)")
        need(0 <= self.lost_bookie_delay_s <= 7 * 86400, "lost_bookie_delay_s must be in [0, 604800]")
        need(1 <= self.audit_interval_s <= 7 * 86400, "audit_interval_s must be in [1, 604800]")
        need(0 <= self.open_ledger_grace_s <= 7 * 86400, "open_ledger_grace_s must be in [0, 604800]")
        need(self.replication_rate_bytes_per_s >= 0, "replication_rate_bytes_per_s must be >= 0 (0: unlimited)")
        need(64 * KIB <= self.replication_batch_bytes_max <= 1 * GIB,
             f"replication_batch_bytes_max must be in [64 KiB, 1 GiB], got {self.replication_batch_bytes_max}")
        need(1 <= self.replication_workers_max <= 64, "replication_workers_max must be in [1, 64]")
        need(0 <= self.etcd_compaction_interval_s <= 7 * 86400,
             f"etcd_compaction_interval_s must be in [0, 604800] (0: off), got {self.etcd_compaction_interval_s}")
        need(0 <= self.dataset_maintenance_interval_s <= 7 * 86400,
             "dataset_maintenance_interval_s must be in [0, 604800] (0: off), got "
             f"{self.dataset_maintenance_interval_s}")
        need(64 * KIB <= self.dataset_merge_target_bytes <= 4 * GIB,
             f"dataset_merge_target_bytes must be in [64 KiB, 4 GiB], got {self.dataset_merge_target_bytes}")
        need(0 <= self.dataset_merge_budget_bytes <= 64 * GIB,
             "dataset_merge_budget_bytes must be in [0, 64 GiB] (0: no merging), got "
             f"{self.dataset_merge_budget_bytes}")
        need(0 <= self.dataset_orphan_interval_s <= 7 * 86400,
             f"dataset_orphan_interval_s must be in [0, 604800] (0: off), got {self.dataset_orphan_interval_s}")
        need(0 <= self.dataset_orphan_grace_s <= 30 * 86400,
             f"dataset_orphan_grace_s must be in [0, 2592000], got {self.dataset_orphan_grace_s}")
        need(-1 <= self.metrics_port <= 65535,
             f"metrics_port must be in [-1, 65535] (-1: off), got {self.metrics_port}")
        need(self.metrics_port <= 0 or self.metrics_port != self.port,
             f"metrics_port must differ from port ({self.port})")
        need(bool(self.tls_cert_file) == bool(self.tls_key_file),
             "tls_cert_file and tls_key_file go together: set both or neither")
        need(self.tls_client_auth in ("require", "none"),
             f"tls_client_auth must be require or none, got {self.tls_client_auth!r}")
        need(not (self.tls_cert_file and self.tls_client_auth == "require" and not self.tls_ca_file),
             "tls_client_auth=require needs tls_ca_file (the CA whose client certificates are accepted)")
        if self.tenant_prefixes:
            try:
                parse_tenants(self.tenant_prefixes)
            except TenantSettingError as e:
                need(False, str(e))
            need(bool(self.tls_cert_file) and self.tls_client_auth == "require",
                 "tenant_prefixes needs client certificates: tls_cert_file, tls_key_file, tls_ca_file with "
                 "tls_client_auth require (a tenant is the identity of its certificate)")
            need(bool(self.etcd), "tenant_prefixes needs etcd (a ledger's dataset is in its metadata there)")
        need(not self.metrics_tls or bool(self.tls_cert_file),
             "metrics_tls needs tls_cert_file and tls_key_file (the endpoint serves that certificate)")
        need(bool(self.etcd_tls_cert_file) == bool(self.etcd_tls_key_file),
             "etcd_tls_cert_file and etcd_tls_key_file go together: set both or neither")
        need(bool(self.etcd_username) == bool(self.etcd_password_file),
             "etcd_username and etcd_password_file go together: set both or neither")
        need(0.0 <= self.trace_sample_ratio <= 1.0,
             f"trace_sample_ratio must be in [0, 1], got {self.trace_sample_ratio}")
        named = {p.split(" ", 1)[0] for p in found}
        for name, (low, high) in BOUNDS.items():
            value = getattr(self, name)
            if name not in named and not low <= value <= high:
                found.append(f"{name} must be in [{_bound(name, low)}, {_bound(name, high)}], got {value}")
        return found

    def address(self) -> str:
        return self.advertised_address or f"{self.host}:{self.port}"

    @staticmethod
    def field_names() -> list[str]:
        return [f.name for f in dataclasses.fields(NodeConfig)]


DAY_S = 86_400
DAY_MS = DAY_S * 1000
TIB = 1024 * GIB
# [lowest, highest] of every numeric setting, checked at startup (and by the operator before a roll, so a value
# no bookie can run with never restarts one). The highest values are far beyond any sensible setting; they are
# there so that a typo (an extra three zeros) fails here, naming the setting, instead of as a failed allocation
# or a timer that never fires. A test keeps every numeric field of NodeConfig in this table.
BOUNDS: dict[str, tuple[float, float]] = {
    "port": (0, 65535),
    "registration_ttl_s": (2, 300),
    "gc_interval_ms": (100, DAY_MS),
    "autorecovery_idle_interval_s": (1, DAY_S),
    "lost_bookie_delay_s": (0, 7 * DAY_S),
    "audit_interval_s": (1, 7 * DAY_S),
    "replicas_check_interval_s": (0, 30 * DAY_S),
    "open_ledger_grace_s": (0, 7 * DAY_S),
    "replication_rate_bytes_per_s": (0, 64 * GIB),
    "replication_batch_bytes_max": (64 * KIB, 1 * GIB),
    "replication_workers_max": (1, 64),
    "scrub_interval_s": (0, 30 * DAY_S),
    "scrub_rate_bytes_per_s": (64 * KIB, 64 * GIB),
    "damage_check_interval_s": (0.1, DAY_S),
    "etcd_compaction_interval_s": (0, 7 * DAY_S),
    "dataset_maintenance_interval_s": (0, 7 * DAY_S),
    "dataset_merge_target_bytes": (64 * KIB, 4 * GIB),
    "dataset_merge_budget_bytes": (0, 64 * GIB),
    "dataset_orphan_interval_s": (0, 7 * DAY_S),
    "dataset_orphan_grace_s": (0, 30 * DAY_S),
    "compaction_minor_threshold": (0.0, 1.0),
    "compaction_major_threshold": (0.0, 1.0),
    "compaction_minor_interval_ms": (100, 30 * DAY_MS),
    "compaction_major_interval_ms": (100, 30 * DAY_MS),
    "compaction_rate_bytes_per_s": (0, 64 * GIB),
    "compaction_run_time_ms_max": (100, 7 * DAY_MS),
    "disk_check_interval_ms": (10, 3_600_000),
    "disk_warn_ratio": (0.0, 1.0),
    "disk_readonly_ratio": (0.0, 1.0),
    "disk_writable_ratio": (0.0, 1.0),
    "disk_capacity_bytes": (0, 1024 * TIB),
    "log_size_bytes_max": (64 * KIB, 64 * GIB),
    "log_roll_interval_ms": (10, DAY_MS),
    "log_rotate_on_close_bytes_min": (0, 64 * GIB),
    "write_cache_entries_max": (2, 100_000_000),
    "add_wait_ms_max": (1, 3_600_000),
    "entry_size_bytes_max": (1, 32 * MIB),
    "batch_entries_max": (1, 1_000_000),
    "batch_bytes_max": (1, 1 * GIB),
    "read_entries_max": (1, 1_000_000),
    "read_bytes_max": (1, 1 * GIB),
    "long_poll_wait_ms_max": (0, 600_000),
    "long_poll_waiters_max": (1, 1_000_000),
    "open_log_files_max": (8, 65536),
    # The index is a sparse file mapped whole: past the address space (128 TiB on x86-64) mmap fails with
    # ENOMEM, which the bookie would report as an unreadable index.
    "index_map_size_bytes": (64 * MIB, 16 * TIB),
    "metrics_port": (-1, 65535),
    "trace_sample_ratio": (0.0, 1.0),
}
SIZE_UNITS = ((TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB"))


def _bound(name: str, value: float) -> str:
    """A bound as a person reads it: sizes in binary units when exact."""
    if "bytes" in name and value:
        for unit, label in SIZE_UNITS:
            if value >= unit and value % unit == 0:
                return f"{int(value // unit)} {label}"
    return f"{value:g}" if isinstance(value, float) else str(value)


TENANT_IDENTITY = re.compile(r"^[^,;=\s]+$")


class TenantSettingError(ValueError):
    """A tenant_prefixes value that cannot be parsed; the message says why."""


def parse_tenants(setting: str) -> dict[str, tuple[str, ...]]:
    """`id=prefix[,prefix...][;id=...]` -> {identity: prefixes}; raises TenantSettingError naming the fault."""
    out: dict[str, tuple[str, ...]] = {}
    for part in (p.strip() for p in setting.split(";")):
        if not part:
            continue
        identity, sep, prefixes = part.partition("=")
        identity = identity.strip()
        if not sep or not TENANT_IDENTITY.match(identity):
            raise TenantSettingError(f"tenant_prefixes: {part!r} is not IDENTITY=PREFIX[,PREFIX...] (an identity "
                                     "is a certificate CN or SAN without , ; = or spaces)")
        if identity in out:
            raise TenantSettingError(f"tenant_prefixes: {identity} is listed twice")
        values = tuple(p.strip() for p in prefixes.split(",") if p.strip())
        if not values:
            raise TenantSettingError(f"tenant_prefixes: {identity} has no dataset prefix")
        out[identity] = values
    return out
