"""Named crash points of a client's process, seen from the simulated network: mid close and mid recovery.

The client names one point itself (octavo.client.faults: mid ensemble change). A close and a recovery are
recognised here by the messages they send, so the product needs no hook for them:
- close.before_metadata_cas: a writer sends the etcd transaction that puts its ledger's metadata CLOSED, and
  dies as it sends it (the transaction is never sent: the ledger stays open, its entries written);
- close.after_metadata_cas: ... etcd applies it, and the writer dies before it hears so;
- recovery.after_fence: a recovering client's fencing LAC read is answered, and it dies (the ledger is fenced
  on that bookie, IN_RECOVERY in etcd, nothing closed);
- recovery.before_close_cas: a recovering client dies as it sends the transaction that closes the ledger
  (after its recovery adds: the entries it copied stay copied, the ledger stays IN_RECOVERY).
Each fires at its N-th hit (the spec `name@N`) and crashes the node that sent the message.
"""

from __future__ import annotations

from collections.abc import Callable

from octavo.v1 import bookie_pb2

ETCD_TXN = "/etcdserverpb.KV/Txn"
READ_LAC = "/octavo.v1.Bookie/ReadLastAddConfirmed"
CLOSE_BEFORE_CAS = "close.before_metadata_cas"
CLOSE_AFTER_CAS = "close.after_metadata_cas"
RECOVERY_AFTER_FENCE = "recovery.after_fence"
RECOVERY_BEFORE_CLOSE = "recovery.before_close_cas"
# name: (the nodes it applies to, by name prefix; the method; whether it fires before the message is sent)
POINTS: dict[str, tuple[str, str, bool]] = {
    CLOSE_BEFORE_CAS: ("writer-", ETCD_TXN, True),
    CLOSE_AFTER_CAS: ("writer-", ETCD_TXN, False),
    RECOVERY_AFTER_FENCE: ("recoverer-", READ_LAC, False),
    RECOVERY_BEFORE_CLOSE: ("recoverer-", ETCD_TXN, True),
}


def _closes_a_ledger(request: bytes) -> bool:
    """An etcd transaction that writes ledger metadata in state CLOSED (ledger_metadata.encode: sorted JSON)."""
    return b"/ledgers/" in request and b'"state": "CLOSED"' in request


def _fences(request: bytes) -> bool:
    return bookie_pb2.ReadLacRequest.FromString(request).fence


class CrashPoint:
    """One armed point: `crash(node, name)` is called when it fires (it crashes the node and raises)."""

    def __init__(self, spec: str, crash: Callable[[str, str], None]) -> None:
        name, _, nth = spec.partition("@")
        if name not in POINTS:
            raise ValueError(f"unknown crash point {name!r} (known: {', '.join(sorted(POINTS))})")
        self.name = name
        self.nth = int(nth or 1)
        self.hits = 0
        self.crash = crash
        self.prefix, self.method, self.before = POINTS[name]

    def matches(self, src: str, method: str, request: bytes) -> bool:
        """Whether this message, sent by `src`, is a hit that fires (counting hits)."""
        if self.hits >= self.nth or method != self.method or not src.startswith(self.prefix):
            return False
        if not (_fences(request) if method == READ_LAC else _closes_a_ledger(request)):
            return False
        self.hits += 1
        return self.hits == self.nth

    def fire(self, src: str) -> None:
        self.crash(src, self.name)
