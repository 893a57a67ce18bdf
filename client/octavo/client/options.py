"""The client's settings, with their units in their names."""

from __future__ import annotations

from dataclasses import dataclass

from octavo.meta.etcd import EtcdAuth
from octavo.meta.tls import TlsFiles


@dataclass(frozen=True)
class ClientOptions:
    entry_size_bytes_max: int = 4 * 1024 * 1024
    # Bytes of appended but not yet acknowledged entries per write handle; append() waits beyond this.
    inflight_bytes_max: int = 64 * 1024 * 1024
    add_timeout_s: float = 10.0
    read_timeout_s: float = 10.0
    speculative_read_delay_s: float = 0.2
    # How long the client trusts its view of the bookie registrations (kept by an etcd watch) without a confirmation
    # (a read, or a watch response) before it reads them again: a watch can go silent without breaking.
    bookie_list_ttl_s: float = 2.0
    # How long one etcd call may wait (for etcd to be reachable, and for its answer).
    metadata_timeout_s: float = 5.0
    # How long an ensemble change may wait for a bookie to replace the failed one when none is usable now (all
    # registered ones in the ensemble, read-only, quarantined and unreachable, or reconnecting): a bookie that
    # restarts or comes back within this time is taken instead of failing the ledger.
    ensemble_change_wait_s: float = 10.0
    # A bookie that failed a write handle is not chosen again by that handle for this long (BookKeeper's
    # bookie quarantine), unless no other bookie is usable and it is reachable again. After it, the bookie is a
    # candidate like any other, so a long-lived ledger survives any number of failures over its life.
    bookie_quarantine_s: float = 60.0
    # The producer path (WriteHandle.append_nowait / send, SyncWriteHandle.append_async): appends wait up to this
    # long to go out together with later ones (Kafka's linger.ms); 0 sends at the end of the event-loop turn
    # they were made in, which already batches every append of that turn.
    linger_ms: float = 0.0
    # A lingering batch goes out at once when it holds this many bytes (Kafka's batch.size).
    linger_bytes_max: int = 1024 * 1024
    # Catch-up reads (ReadHandle.read / read_batches): batches of about read_batch_bytes are read from the
    # bookies in parallel, at most read_ahead_bytes_max ahead of the consumer (the memory a read holds).
    read_batch_bytes: int = 4 * 1024 * 1024
    read_ahead_bytes_max: int = 64 * 1024 * 1024
    # Tailing reads (ReadHandle.tail): how long a long poll asks a bookie to hold it (the bookie caps it by its
    # long_poll_wait_ms_max); after a wait with no progress the reader looks at the ledger's metadata again.
    tail_wait_ms: int = 5000
    # Tracing: the share of root operations (create, append_many, recovery open, read, and the ensemble
    # changes they cause) that get a span on the tracer provider (the global one unless the Client was given
    # one). 0, the default, makes no span at all; an operation inside a recording span of the application
    # always gets one. The spans' context reaches the bookies, whose request spans join the trace.
    trace_sample_ratio: float = 0.0
    # TLS to the bookies (docs/security.md): the CA bundle the bookies' certificates must chain to, and this
    # client's own certificate chain and key when the bookies require client certificates. Any of them set
    # turns TLS on; empty (the default) connects in plaintext.
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    # etcd over TLS and with authentication (docs/security.md): the CA of etcd's certificate, this client's
    # certificate and key (with etcd's --client-cert-auth its common name is the etcd user), and/or a user name
    # with a file holding its password.
    etcd_tls_ca_file: str = ""
    etcd_tls_cert_file: str = ""
    etcd_tls_key_file: str = ""
    etcd_username: str = ""
    etcd_password_file: str = ""

    def etcd_auth(self) -> EtcdAuth:
        """The etcd credentials (the password file read now); ValueError naming the option if unusable."""
        return EtcdAuth.from_settings(self.etcd_tls_ca_file, self.etcd_tls_cert_file, self.etcd_tls_key_file,
                                      self.etcd_username, self.etcd_password_file)

    @property
    def tls(self) -> TlsFiles:
        return TlsFiles(self.tls_cert_file, self.tls_key_file, self.tls_ca_file)

    def __post_init__(self) -> None:
        for name in ("entry_size_bytes_max", "inflight_bytes_max", "add_timeout_s", "read_timeout_s",
                     "metadata_timeout_s", "linger_bytes_max", "read_batch_bytes", "read_ahead_bytes_max",
                     "tail_wait_ms"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ClientOptions.{name} must be positive, got {getattr(self, name)!r}")
        for name in ("speculative_read_delay_s", "bookie_list_ttl_s", "ensemble_change_wait_s",
                     "bookie_quarantine_s", "linger_ms"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"ClientOptions.{name} must be zero or more, got {getattr(self, name)!r}")
        if not 0.0 <= self.trace_sample_ratio <= 1.0:
            raise ValueError(f"ClientOptions.trace_sample_ratio must be in [0, 1], got {self.trace_sample_ratio!r}")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("ClientOptions.tls_cert_file and tls_key_file go together: set both or neither")
        if self.read_ahead_bytes_max < self.read_batch_bytes:
            raise ValueError(f"ClientOptions.read_ahead_bytes_max ({self.read_ahead_bytes_max}) must be at least "
                             f"read_batch_bytes ({self.read_batch_bytes})")
