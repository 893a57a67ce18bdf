"""An asyncio event loop on virtual time: when nothing is ready to run, the clock jumps to the next timer.

Nothing waits on real IO in the simulation (the network is in memory and file IO is synchronous), so the
selector never has anything to report: its select(timeout) only moves the clock forward by `timeout`. A loop
with no ready callback and no timer can never make progress again: that raises Stuck instead of hanging.
Executor calls (run_in_executor) run inline on the loop's thread, so a run is one thread and replays exactly.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Mapping
from typing import Any


class Stuck(RuntimeError):
    pass


class VirtualClock:
    def __init__(self, start_s: float = 0.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s


class _VirtualSelector(selectors.BaseSelector):
    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self._keys: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise Stuck("the simulation is stuck: no callback is ready and no timer is set")
        self._clock.now_s += timeout
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._keys

    def close(self) -> None:
        self._keys.clear()


# Loop iterations in a row without the clock moving before the run counts as livelocked: something retries
# without waiting (a bug in a retry loop, or a fault the code spins on), which in real time would burn a core.
SPINS_MAX = 100_000


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        super().__init__(_VirtualSelector(clock))
        self._clock_resolution = 1e-9
        self._spins = 0
        self._spun_at = -1.0

    def _run_once(self) -> None:
        if self.clock.now_s != self._spun_at:
            self._spun_at, self._spins = self.clock.now_s, 0
        self._spins += 1
        if self._spins > SPINS_MAX:
            ready = sorted({_where(h) for h in self._ready})[:12]  # type: ignore[attr-defined]
            head = self._scheduled[0] if self._scheduled else None  # type: ignore[attr-defined]
            raise Stuck(f"livelock: {SPINS_MAX} loop iterations at virtual time {self.clock.now_s:.6f} without "
                        f"the clock moving; ready: {ready}; next timer: {head!r} at {head and head.when()!r}")
        super()._run_once()  # type: ignore[misc]

    def time(self) -> float:
        return self.clock.now_s

    def run_in_executor(self, executor: Any, func: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:  # type: ignore[override]
        """Inline: the call runs now, on the loop's thread (one thread, one order of events)."""
        future = self.create_future()
        try:
            future.set_result(func(*args))
        except BaseException as e:  # handed to the awaiting caller, as an executor would
            future.set_exception(e)
        return future


def _where(handle: Any) -> str:
    """A ready callback, and where its task stands when it is a task's wakeup (for a livelock's message)."""
    task = getattr(handle._callback, "__self__", None)
    if isinstance(task, asyncio.Task):
        frames = task.get_stack()[-4:]
        at = " <- ".join(f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_lineno} {f.f_code.co_name}" for f in frames)
        return f"task {task.get_name()} at {at}"
    return repr(handle)[:200]
