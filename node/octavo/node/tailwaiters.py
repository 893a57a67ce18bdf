"""Tailing reads held by the data plane (ReadTail's long poll), bounded by long_poll_waiters_max."""

from __future__ import annotations

import asyncio


class TailWaiters:
    """Tailing reads held on a ledger (ReadTail's long poll): a future each, woken (to look again) when an add
    request, a fence or a write-close touches the ledger. Bounded by long_poll_waiters_max."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0
        self.by_ledger: dict[int, list[asyncio.Future[None]]] = {}

    def add(self, ledger_id: int) -> asyncio.Future[None] | None:
        """A future to wait on, None when the limit is reached."""
        if self.count >= self.limit:
            return None
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.by_ledger.setdefault(ledger_id, []).append(future)
        self.count += 1
        return future

    def remove(self, ledger_id: int, future: asyncio.Future[None]) -> None:
        futures = self.by_ledger.get(ledger_id)
        if futures is None or future not in futures:
            return
        futures.remove(future)
        self.count -= 1
        if not futures:
            del self.by_ledger[ledger_id]

    def wake(self, ledger_id: int) -> None:
        for future in self.by_ledger.get(ledger_id, ()):
            if not future.done():
                future.set_result(None)
