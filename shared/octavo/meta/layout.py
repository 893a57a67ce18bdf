"""The etcd key layout of a cluster (docs/architecture.md, "Metadata in etcd"). Pure: names only.

    /octavo/<cluster>/ledgers/<ledger id, 20 digits>   ledger metadata (JSON)
    /octavo/<cluster>/idgen/ledger                     the next ledger id no client has reserved (integer)
    /octavo/<cluster>/bookies/writable/<bookie id>     registration of a writable bookie, on its lease
    /octavo/<cluster>/bookies/readonly/<bookie id>     registration of a read-only bookie, on its lease
    /octavo/<cluster>/cookies/<bookie id>              the bookie's identity, bound to its data directory
    /octavo/<cluster>/instances/<instance id>          the other way: which bookie id a data directory serves
    /octavo/<cluster>/underreplicated/<ledger id>      a ledger with copies missing: which bookies (JSON)
    /octavo/<cluster>/replication-locks/<ledger id>    the worker re-replicating it, on the worker's lease
    /octavo/<cluster>/damage/<ledger id>/<bookie id>    entries whose copies on that bookie fail their
                                                       checksum or are gone: ranges, reason, finder (JSON)
    /octavo/<cluster>/auditor                          the bookie id of the auditor, on its lease
    /octavo/<cluster>/datasets/<name>                  a dataset's head; its schema, commit log and checkpoints
                                                       under dataset-schemas/, dataset-log/, dataset-checkpoints/
                                                       (octavo.client.dataset)
    /octavo/<cluster>/replicas-missing/<ledger id>     copies the replicas check found missing on live bookies:
                                                       bookie -> entry ranges (JSON, replicascheck.py)

Ledger ids are zero-padded so keys sort in id order.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_CLUSTER = "default"
LEDGER_ID_DIGITS = 20
BOOKIE_ID_CHARS_MAX = 253


@dataclass(frozen=True)
class Layout:
    cluster: str = DEFAULT_CLUSTER

    def __post_init__(self) -> None:
        if not self.cluster or "/" in self.cluster:
            raise ValueError(f"cluster name must be non-empty and contain no '/', got {self.cluster!r}")

    @property
    def root(self) -> bytes:
        return f"/octavo/{self.cluster}/".encode()

    @property
    def ledgers(self) -> bytes:
        return self.root + b"ledgers/"

    def ledger(self, ledger_id: int) -> bytes:
        if ledger_id < 0:
            raise ValueError(f"ledger id must be non-negative, got {ledger_id}")
        return self.ledgers + str(ledger_id).zfill(LEDGER_ID_DIGITS).encode()

    def ledger_id_of(self, key: bytes) -> int:
        return int(key[len(self.ledgers):])

    @property
    def ledger_id_counter(self) -> bytes:
        return self.root + b"idgen/ledger"

    @property
    def registrations(self) -> bytes:
        """Both sets of registrations, writable and read-only."""
        return self.root + b"bookies/"

    def bookies(self, readonly: bool) -> bytes:
        return self.registrations + (b"readonly/" if readonly else b"writable/")

    def bookie(self, bookie_id: str, readonly: bool) -> bytes:
        check_bookie_id(bookie_id)
        return self.bookies(readonly) + bookie_id.encode()

    @property
    def cookies(self) -> bytes:
        return self.root + b"cookies/"

    def cookie(self, bookie_id: str) -> bytes:
        check_bookie_id(bookie_id)
        return self.cookies + bookie_id.encode()

    def instance(self, instance_id: str) -> bytes:
        """The bookie id a data directory's instance serves: a copied directory cannot join as a second bookie."""
        if not instance_id or "/" in instance_id or not instance_id.isprintable():
            raise ValueError(f"instance id must be printable, non-empty and without '/', got {instance_id!r}")
        return self.root + b"instances/" + instance_id.encode()

    @property
    def auditor(self) -> bytes:
        """The bookie that is the auditor now (on its registration lease: it goes when the bookie does)."""
        return self.root + b"auditor"

    @property
    def underreplicated(self) -> bytes:
        return self.root + b"underreplicated/"

    def underreplicated_ledger(self, ledger_id: int) -> bytes:
        return self.underreplicated + self.ledger(ledger_id)[len(self.ledgers):]

    @property
    def damage(self) -> bytes:
        return self.root + b"damage/"

    def damage_mark(self, ledger_id: int, bookie_id: str) -> bytes:
        return self.damage + self.ledger(ledger_id)[len(self.ledgers):] + b"/" + bookie_id.encode()

    @property
    def replication_locks(self) -> bytes:
        return self.root + b"replication-locks/"

    def replication_lock(self, ledger_id: int) -> bytes:
        return self.replication_locks + self.ledger(ledger_id)[len(self.ledgers):]

    def ledger_id_under(self, prefix: bytes, key: bytes) -> int:
        return int(key[len(prefix):])

    @property
    def replicas_missing(self) -> bytes:
        return self.root + b"replicas-missing/"

    def replicas_missing_ledger(self, ledger_id: int) -> bytes:
        return self.replicas_missing + self.ledger(ledger_id)[len(self.ledgers):]


def check_bookie_id(bookie_id: str) -> None:
    if not bookie_id or len(bookie_id) > BOOKIE_ID_CHARS_MAX or "/" in bookie_id or not bookie_id.isprintable():
        raise ValueError(f"bookie id must be 1 to {BOOKIE_ID_CHARS_MAX} printable characters without '/', "
                         f"got {bookie_id!r}")
