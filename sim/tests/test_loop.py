"""The virtual loop: timers in order on a clock that jumps, cancelled timers and callbacks never run (and are
counted for the heap's sweep), handles made with every field asyncio gives them."""

from __future__ import annotations

import asyncio

from octavo.sim.loop import TIMERS_SWEEP_MIN, VirtualClock, VirtualLoop


def test_timers_run_in_time_order_and_cancelled_ones_never() -> None:
    loop = VirtualLoop(VirtualClock())
    ran: list[tuple[str, float]] = []
    try:
        loop.call_later(0.3, lambda: ran.append(("c", loop.time())))
        loop.call_at(0.1, lambda: ran.append(("a", loop.time())))
        loop.call_later(0.2, lambda: ran.append(("x", loop.time()))).cancel()
        loop.call_soon(lambda: ran.append(("x", loop.time()))).cancel()
        loop.call_later(0.1, lambda: ran.append(("b", loop.time())))  # same time as "a", set after it
        assert loop._timer_cancelled_count == 1
        loop.run_until_complete(asyncio.sleep(0.5))
    finally:
        loop.close()
    assert ran == [("a", 0.1), ("b", 0.1), ("c", 0.3)]
    assert loop.time() == 0.5


def test_cancelled_timers_are_swept_from_the_heap() -> None:
    loop = VirtualLoop(VirtualClock())
    try:
        timers = [loop.call_later(10.0 + i, lambda: None) for i in range(3 * TIMERS_SWEEP_MIN)]
        for timer in timers[: 2 * TIMERS_SWEEP_MIN]:
            timer.cancel()
            timer.cancel()  # a second cancel counts nothing more
        assert loop._timer_cancelled_count == 2 * TIMERS_SWEEP_MIN
        loop.run_until_complete(asyncio.sleep(0))
        assert len(loop._timers) == TIMERS_SWEEP_MIN and loop._timer_cancelled_count == 0
    finally:
        loop.close()


def test_handles_made_without_their_init_have_every_field_asyncio_gives_them() -> None:
    """call_soon and call_at fill a handle's fields themselves (no Handle.__init__): each field asyncio's classes
    declare is set, so a Python whose Handle gains a field fails here rather than in a callback."""
    loop = VirtualLoop(VirtualClock())
    try:
        made = [(loop.call_soon(print), asyncio.Handle), (loop.call_later(1.0, print), asyncio.TimerHandle)]
        for handle, kind in made:
            assert isinstance(handle, kind)
            fields = {f for cls in kind.__mro__ for f in getattr(cls, "__slots__", ()) if f != "__weakref__"}
            assert fields >= {"_callback", "_args", "_context", "_loop", "_cancelled"}
            for field in fields:
                getattr(handle, field)  # AttributeError when a field was left unset
            assert "print" in repr(handle)
    finally:
        loop.close()
