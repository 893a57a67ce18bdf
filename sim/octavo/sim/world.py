"""One simulated world: the virtual clock and loop, the seeded random generator, the network installed as the
transport, etcd served on it, and the history of what happened (what a replay must reproduce exactly).

Randomness: every decision of the simulation comes from `rng`. The product's own random choices (the client's
ensemble placement, retry jitter) use Python's `random` module and octavo.meta.retry's generator: the world
seeds both from the run's seed, so they replay too. Clock: the loop's time is virtual; `time.monotonic` and
`time.time` read the virtual clock while the world runs, and a blocking `time.sleep` moves it on (the engine's
clock is passed in explicitly).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

from octavo.meta import retry, transport
from octavo.node.startup import BOOT_ID_ENV
from octavo.sim.etcdmodel import EtcdModel
from octavo.sim.loop import Stuck, VirtualClock, VirtualLoop
from octavo.sim.network import NODE, Network

T = TypeVar("T")

ETCD_NODE = "etcd"
ETCD_ADDRESS = "etcd:2379"
# Virtual wall-clock time at the start of a run (time.time() then): a fixed date, so ids made from it replay.
EPOCH_S = 1_767_225_600.0
# Lines of history kept (a run keeps its last ones: a violation prints the events around it).
HISTORY_LINES_MAX = 200_000


class World:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.clock = VirtualClock()
        self.loop = VirtualLoop(self.clock)
        self.history: list[str] = []
        self.network = Network(random.Random(self.rng.getrandbits(64)), self.record)
        self.etcd = EtcdModel(self.clock)
        self.network.serve(ETCD_NODE, ETCD_ADDRESS, self.etcd.handlers(), self.etcd.direct())

    def record(self, line: str) -> None:
        if len(self.history) >= HISTORY_LINES_MAX:
            del self.history[: HISTORY_LINES_MAX // 10]
        self.history.append(f"{self.clock.now_s:10.6f} {line}")

    @contextlib.contextmanager
    def _installed(self) -> Iterator[None]:
        previous = transport.install(self.network)
        saved_random = random.getstate()
        saved_retry = retry._rng.getstate()
        saved_time, saved_monotonic, saved_sleep = time.time, time.monotonic, time.sleep
        saved_boot_id = os.environ.get(BOOT_ID_ENV)  # the simulated machines set theirs (bookie.py)
        random.seed(self.rng.getrandbits(64))
        retry._rng.seed(self.rng.getrandbits(64))
        time.monotonic = self.clock  # type: ignore[assignment]
        time.time = lambda: EPOCH_S + self.clock.now_s  # type: ignore[assignment]
        time.sleep = self._sleep  # type: ignore[assignment]
        try:
            yield
        finally:
            time.time, time.monotonic, time.sleep = saved_time, saved_monotonic, saved_sleep  # type: ignore[assignment]
            if saved_boot_id is None:
                os.environ.pop(BOOT_ID_ENV, None)
            else:
                os.environ[BOOT_ID_ENV] = saved_boot_id
            random.setstate(saved_random)
            retry._rng.setstate(saved_retry)
            transport.install(previous)

    def _sleep(self, seconds: float) -> None:
        """A blocking sleep (a rate limiter in an executor call, which runs inline): the whole world waits, so
        the clock moves on by that much."""
        self.clock.now_s += max(0.0, seconds)

    def run(self, main: Callable[[], Awaitable[T]]) -> T:
        """Run `main` (on node "sim") to its end on the virtual loop; tasks it leaves behind are cancelled."""
        with self._installed():
            asyncio.set_event_loop(self.loop)
            try:
                NODE.set("sim")
                return self.loop.run_until_complete(main())
            finally:
                try:
                    self._cancel_leftovers()
                except Stuck as e:  # tasks that do not end when cancelled: keep the run's own outcome
                    self.record(f"leftover tasks did not end: {e}")
                asyncio.set_event_loop(None)
                self.loop.close()

    def _cancel_leftovers(self) -> None:
        tasks = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
