"""The storage engine as compaction, the flusher, the disk monitor and tail repair see it: a narrow interface
(`Engine`), so none of them reaches into the engine's private state and none imports storage.py. `Storage`
implements it; mypy checks that wherever a Storage is handed to one of them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from octavo.node.checkpoint import NodeState
from octavo.node.config import NodeConfig
from octavo.node.errors import Code
from octavo.node.fileio import FileIO
from octavo.node.index import Index, LogMeta
from octavo.node.ledgers import LedgerState
from octavo.node.readfds import ReadFds


class Engine(Protocol):
    config: NodeConfig
    io: FileIO
    data_dir: str
    logs_dir: str
    node_state: NodeState | None
    read_fds: ReadFds
    space_lock: threading.Lock  # GC and compaction passes never overlap
    fresh_instance: bool

    # The mode and health flags (engineflags.py): read here, changed only through the methods below.
    @property
    def read_only_reason(self) -> str: ...

    @property
    def tail_maybe_lost(self) -> bool: ...

    @property
    def last_flush_error(self) -> str: ...

    @property
    def sync_failed_reason(self) -> str: ...

    on_sync_lost: Callable[[str], None] | None  # what the process does once a sync failed (synclost.py)

    def set_read_only_reason(self, reason: str) -> None: ...

    def take_disk_full_seen(self) -> bool: ...

    def set_flush_error(self, error: str) -> None: ...

    def tail_repaired(self) -> None: ...

    @property
    def index(self) -> Index: ...

    @property
    def ledgers(self) -> Mapping[int, LedgerState]: ...

    def ledger_ids(self) -> set[int]: ...

    def ledger_state(self, ledger_id: int) -> LedgerState | None: ...

    def has_entry(self, ledger_id: int, entry_id: int) -> bool: ...

    def add_entries(self, ledger_id: int, master_key: bytes, entry_ids: list[int] | Any,
                    payloads: list[bytes] | Any, last_add_confirmed: int = -1,
                    recovery: bool = False) -> tuple[list[Code], str]: ...

    def repair_entries(self, ledger_id: int, master_key: bytes, entry_ids: list[int],
                       payloads: list[bytes]) -> tuple[list[Code], str]: ...

    def verify_entry(self, ledger_id: int, entry_id: int) -> str | None: ...

    def locate(self, ledger_id: int, entry_id: int) -> tuple[int, int, int] | None: ...

    def on_corrupt_read(self, callback: Callable[[int, int, str], None]) -> None: ...

    def wait_for_room(self, entries: int, timeout_s: float) -> bool: ...

    def allocate_log_id(self) -> int: ...

    def roll_if_older_than(self, age_s: float) -> bool: ...

    def active_log_age_s(self) -> float | None: ...

    def wake_on_roll(self, callback: Callable[[], None] | None) -> None: ...

    def pending_flushes(self) -> int: ...

    def flush_one(self) -> bool: ...

    def log_accounting(self) -> dict[int, LogMeta]: ...

    def delete_log_file(self, log_id: int, sync_dir: bool = True) -> int: ...
