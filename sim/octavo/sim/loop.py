"""An asyncio event loop on virtual time: when nothing is ready to run, the clock jumps to the next timer.

Nothing waits on real IO in the simulation (the network is in memory and file IO is synchronous), so the
loop never polls a selector: an iteration with nothing ready moves the clock forward to the first timer. A loop
with no ready callback and no timer can never make progress again: that raises Stuck instead of hanging.
Executor calls (run_in_executor) run inline on the loop's thread, so a run is one thread and replays exactly.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import selectors
from asyncio import format_helpers
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


# Cancelled timers are dropped from the heap in one pass once they are this share of it (and there are more
# than TIMERS_SWEEP_MIN timers), as asyncio's own loop does.
TIMERS_SWEEP_MIN = 100
TIMERS_SWEEP_CANCELLED_RATIO = 0.5


_new = object.__new__


class _Handle(asyncio.Handle):
    """asyncio's Handle with a cancel of one Python call instead of two (Handle.cancel asks get_debug())."""

    __slots__ = ()

    def cancel(self) -> None:
        if not self._cancelled:
            self._cancelled = True
            self._callback = self._args = None  # type: ignore[assignment]


class _TimerHandle(asyncio.TimerHandle):
    """asyncio's TimerHandle with a cancel of one Python call instead of four (TimerHandle.cancel, the loop's
    _timer_handle_cancelled, Handle.cancel, get_debug): a unary call's deadline is set and cancelled at each call."""

    __slots__ = ()

    def cancel(self) -> None:
        if not self._cancelled:
            if self._scheduled:  # type: ignore[attr-defined]
                self._loop._timer_cancelled_count += 1  # type: ignore[attr-defined]
            self._cancelled = True
            self._callback = self._args = None  # type: ignore[assignment]


class VirtualLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop with its iteration (`_run_once`) and its timers (`call_at`) written for virtual
    time: nothing ever waits on IO, so an iteration runs what is ready, or moves the clock to the first timer
    and runs what is due. Timers sit in the heap as (when, sequence number, handle): the heap compares them as
    tuples (in C, not with TimerHandle.__lt__), and timers due at the same time run in the order they were set.
    The order of callbacks within an iteration is asyncio's: the ready ones first, then the timers due."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        super().__init__(_VirtualSelector(clock))
        self._clock_resolution = 1e-9
        self._spins = 0
        self._spun_at = -1.0
        self._timer_seq = itertools.count()
        self._timers: list[tuple[float, int, asyncio.TimerHandle]] = []

    def call_soon(self, callback: Callable[..., Any], *args: Any,  # type: ignore[override]
                  context: contextvars.Context | None = None) -> asyncio.Handle:
        """BaseEventLoop.call_soon without its debug checks (the loop never runs in debug mode) and the call to
        _call_soon: a task's every step comes through here (about 5,000 times a seed)."""
        if self._closed:  # type: ignore[attr-defined]
            raise RuntimeError("Event loop is closed")
        handle: Any = _new(_Handle)  # not Handle(...): its __init__ is two Python calls (it asks get_debug())
        handle._callback = callback
        handle._args = args
        handle._loop = self
        handle._context = contextvars.copy_context() if context is None else context
        handle._cancelled = False
        handle._repr = None
        handle._source_traceback = None
        self._ready.append(handle)  # type: ignore[attr-defined]
        return handle  # type: ignore[no-any-return]

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any,  # type: ignore[override]
                   context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        return self.call_at(self.clock.now_s + delay, callback, *args, context=context)

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any,  # type: ignore[override]
                context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        if self._closed:  # type: ignore[attr-defined]
            raise RuntimeError("Event loop is closed")
        # The fields call_soon sets, and a timer's two: written out again, since a function shared by both (one
        # Python call a handle, for about 9,500 handles a seed) costs 2% of a seed's instructions.
        timer: Any = _new(_TimerHandle)
        timer._callback = callback
        timer._args = args
        timer._loop = self
        timer._context = contextvars.copy_context() if context is None else context
        timer._cancelled = False
        timer._repr = None
        timer._source_traceback = None
        timer._when = when
        timer._scheduled = True
        heapq.heappush(self._timers, (when, next(self._timer_seq), timer))
        return timer  # type: ignore[no-any-return]

    def _run_once(self) -> None:
        clock = self.clock
        if clock.now_s != self._spun_at:
            self._spun_at, self._spins = clock.now_s, 0
        self._spins += 1
        if self._spins > SPINS_MAX:
            raise self._livelock()
        timers = self._timers
        ready = self._ready  # type: ignore[attr-defined]
        if len(timers) > TIMERS_SWEEP_MIN and \
                self._timer_cancelled_count / len(timers) > TIMERS_SWEEP_CANCELLED_RATIO:  # type: ignore[has-type]
            for _, _, timer in timers:
                if timer._cancelled:  # type: ignore[attr-defined]
                    timer._scheduled = False  # type: ignore[attr-defined]
            timers[:] = [t for t in timers if not t[2]._cancelled]  # type: ignore[attr-defined]
            heapq.heapify(timers)
            self._timer_cancelled_count = 0
        else:
            while timers and timers[0][2]._cancelled:  # type: ignore[attr-defined]
                self._timer_cancelled_count -= 1
                heapq.heappop(timers)[2]._scheduled = False  # type: ignore[attr-defined]
        if not ready and not self._stopping:  # type: ignore[attr-defined]
            if not timers:
                raise Stuck("the simulation is stuck: no callback is ready and no timer is set")
            clock.now_s += max(0.0, timers[0][0] - clock.now_s)  # the clock jumps to the first timer
        end_time = clock.now_s + self._clock_resolution
        while timers and timers[0][0] < end_time:
            timer = heapq.heappop(timers)[2]
            timer._scheduled = False  # type: ignore[attr-defined]
            ready.append(timer)
        for _ in range(len(ready)):
            handle = ready.popleft()
            if handle._cancelled:
                continue
            # Handle._run inlined (one Python call less for each of about 8,000 callbacks a seed); an exception
            # goes to the loop's exception handler with the context Handle._run gives it.
            try:
                handle._context.run(handle._callback, *handle._args)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                self._callback_failed(handle, exc)

    def _callback_failed(self, handle: asyncio.Handle, exc: BaseException) -> None:
        """What asyncio's Handle._run does with a callback's exception."""
        source = format_helpers._format_callback_source(handle._callback, handle._args)  # type: ignore[attr-defined]
        context: dict[str, Any] = {"message": f"Exception in callback {source}", "exception": exc, "handle": handle}
        source_traceback = getattr(handle, "_source_traceback", None)
        if source_traceback:
            context["source_traceback"] = source_traceback
        self.call_exception_handler(context)

    def _livelock(self) -> Stuck:
        ready = sorted({_where(h) for h in self._ready})[:12]  # type: ignore[attr-defined]
        head = self._timers[0][2] if self._timers else None
        return Stuck(f"livelock: {SPINS_MAX} loop iterations at virtual time {self.clock.now_s:.6f} without the "
                     f"clock moving; ready: {ready}; next timer: {head!r} at {head and head.when()!r}")

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
