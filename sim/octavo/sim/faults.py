"""Fault schedules drawn from a seed, and their effect on the cluster.

A schedule is a list of (virtual time, fault); each fault that lasts (a partition, a crashed bookie, an etcd
outage) carries its own end. Faults that lose data on a disk (a machine crash, a bookie lost for good) are at
most one per run: the durability model covers one bookie losing its unsynced tail, not two at once (with
Qa = 2 two such losses can legitimately lose an acknowledged entry).
"""

from __future__ import annotations

import asyncio
import random
import shutil
from dataclasses import dataclass

from octavo.sim.cluster import Cluster
from octavo.sim.world import ETCD_NODE

KINDS = ("process_crash", "machine_crash", "partition", "isolate", "lossy_link", "etcd_down", "leases_expire",
         "bookie_lost", "disk_full", "disk_error")
DATA_LOSING = frozenset({"machine_crash", "bookie_lost"})
# Starts of a crashed bookie tried before the run reports that it cannot start again.
RESTART_ATTEMPTS_MAX = 20
EXIT_RESTART_DELAY_S = 1.0  # an exited bookie's pod restarts after this (Kubernetes' first back-off is 10 s)


@dataclass(frozen=True)
class Fault:
    at_s: float
    kind: str
    target: str  # a bookie, or "a|b" for a link
    duration_s: float
    drop_ratio: float = 0.0

    def __str__(self) -> str:
        extra = f" drop {self.drop_ratio:.3f}" if self.drop_ratio else ""
        return f"{self.kind} {self.target} for {self.duration_s:.2f}s{extra}"


def draw_schedule(rng: random.Random, bookies: list[str], clients: list[str], faults_max: int,
                  window_s: float, ensemble_size: int) -> list[Fault]:
    """A bookie is lost for good only where a spare can replace it (more bookies than an ensemble): with none,
    recovery and re-replication cannot complete, and that is a limit of the cluster's size, not a bug."""
    nodes = [*bookies, *clients, ETCD_NODE]
    schedule = []
    data_lost = False
    for _ in range(rng.randrange(faults_max + 1)):
        at = rng.uniform(0.3, window_s)
        kind = rng.choice(KINDS)
        if kind == "bookie_lost" and len(bookies) <= ensemble_size:
            kind = "machine_crash"
        if kind in DATA_LOSING:
            if data_lost:
                kind = "process_crash"
            data_lost = True
        duration = rng.uniform(0.2, 3.0)
        if kind in ("partition", "lossy_link"):
            a, b = rng.sample(nodes, 2)
            if a == ETCD_NODE and b == ETCD_NODE:
                continue
            drop = rng.uniform(0.001, 0.05) if kind == "lossy_link" else 0.0
            schedule.append(Fault(at, kind, f"{min(a, b)}|{max(a, b)}", duration, drop))
        elif kind in ("etcd_down", "leases_expire"):
            schedule.append(Fault(at, kind, ETCD_NODE, duration))
        else:
            schedule.append(Fault(at, kind, rng.choice(bookies), duration))
    return sorted(schedule, key=lambda f: (f.at_s, f.kind, f.target))


class Injector:
    """Applies a schedule on the loop and heals everything at the end."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.lost: set[str] = set()  # bookies gone for good
        self.down: set[str] = set()
        self.start_failures: dict[str, str] = {}  # bookies that could not start again: why
        self._restarts: dict[str, asyncio.Task[None]] = {}
        for bookie in cluster.bookies.values():
            bookie.on_exit = lambda reason, name=bookie.name: self.exited(name, reason)

    def record(self, line: str) -> None:
        self.cluster.world.record(line)

    async def run(self, schedule: list[Fault]) -> None:
        loop = asyncio.get_running_loop()
        for fault in schedule:
            await asyncio.sleep(max(0.0, fault.at_s - loop.time()))
            self.record(f"fault {fault}")
            self.apply(fault)

    def apply(self, fault: Fault) -> None:
        network = self.cluster.world.network
        loop = asyncio.get_running_loop()
        kind, target = fault.kind, fault.target
        if kind in ("process_crash", "machine_crash", "bookie_lost"):
            if target in self.down or target in self.lost:
                return
            self.cluster.crash_bookie(target, machine=kind == "machine_crash")
            if kind == "bookie_lost":
                self.lost.add(target)
                shutil.rmtree(self.cluster.bookies[target].data_dir, ignore_errors=True)
                self.record(f"bookie {target} lost for good")
                return
            self.down.add(target)
            loop.call_later(fault.duration_s, self._restart_soon, target)
        elif kind in ("partition", "isolate"):
            pairs = self._pairs(target) if kind == "partition" else [
                (target, other) for other in [*self.cluster.bookies, *self.cluster.clients, ETCD_NODE]
                if other != target]
            for a, b in pairs:
                network.link(a, b).partitioned = True
            loop.call_later(fault.duration_s, self._heal_links, pairs)
        elif kind == "lossy_link":
            pairs = self._pairs(target)
            for a, b in pairs:
                network.link(a, b).drop_ratio = fault.drop_ratio
            loop.call_later(fault.duration_s, self._heal_links, pairs)
        elif kind in ("disk_full", "disk_error"):
            io = self.cluster.bookies[target].io
            setattr(io, "full" if kind == "disk_full" else "failing", True)
            loop.call_later(fault.duration_s, self._disk_healed, target, kind)
        elif kind == "etcd_down":
            network.down(ETCD_NODE, "unavailable")
            loop.call_later(fault.duration_s, self._etcd_up)
        elif kind == "leases_expire":
            self.cluster.world.etcd.expire_all()

    def exited(self, name: str, reason: str) -> None:
        """The bookie's process exited after a failed sync (synclost.py): Kubernetes restarts it after a short
        delay (and again while its start fails, as a pod's restarts go on)."""
        if name in self.down or name in self.lost:
            return
        self.record(f"bookie {name} exited: {reason}")
        self.cluster.crash_bookie(name, machine=False)
        self.down.add(name)
        asyncio.get_running_loop().call_later(EXIT_RESTART_DELAY_S, self._restart_soon, name)

    @staticmethod
    def _pairs(target: str) -> list[tuple[str, str]]:
        a, b = target.split("|")
        return [(a, b)]

    def _heal_links(self, pairs: list[tuple[str, str]]) -> None:
        network = self.cluster.world.network
        for a, b in pairs:
            link = network.link(a, b)
            link.partitioned, link.drop_ratio = False, 0.0
        self.record(f"healed {' '.join(f'{a}|{b}' for a, b in pairs)}")

    def _disk_healed(self, name: str, kind: str) -> None:
        io = self.cluster.bookies[name].io
        io.full = io.failing = False
        self.record(f"{kind} on {name} over")

    def _etcd_up(self) -> None:
        self.cluster.world.network.up(ETCD_NODE)
        self.record("etcd available again")

    def _restart_soon(self, name: str) -> asyncio.Task[None]:
        """One restart of a bookie at a time: a second one would find the first's directory lock."""
        task = self._restarts.get(name)
        if task is None or task.done():
            task = self._restarts[name] = asyncio.get_running_loop().create_task(self._restart(name))
        return task

    async def _restart(self, name: str) -> None:
        """Start the bookie again; a start that fails (etcd unreachable for the cookie check) is retried, up to
        RESTART_ATTEMPTS_MAX times (then the failure is kept for the checkers)."""
        attempts = 0
        while name in self.down:
            try:
                await self.cluster.start_bookie(name)
                self.down.discard(name)
            except Exception as e:  # any start failure is retried; the last one is reported
                attempts += 1
                self.record(f"bookie {name} start failed: {type(e).__name__}: {e}")
                self.cluster.world.network.down(name, "start failed")
                self.cluster.kill_tasks(name)
                self.cluster.bookies[name].crash_process()
                if attempts >= RESTART_ATTEMPTS_MAX:
                    self.start_failures[name] = f"{type(e).__name__}: {e}"
                    return
                await asyncio.sleep(0.5)

    async def restart_one_by_one(self, names: list[str], rng: random.Random, machine_first: bool) -> None:
        """A rolling restart: each bookie of `names` (not already down or lost) crashes, stays down for a moment
        and is started again before the next one goes; the first one's crash is a machine crash when
        `machine_first` (the run has no other data-losing fault: at most one a run)."""
        for i, name in enumerate(names):
            if name in self.down or name in self.lost:
                continue
            machine = machine_first and i == 0
            self.record(f"fault rolling restart: {'machine' if machine else 'process'} crash {name}")
            self.cluster.crash_bookie(name, machine=machine)
            self.down.add(name)
            await asyncio.sleep(rng.uniform(0.05, 0.4))
            # Shielded: when the workload ends, this task is cancelled, and heal() waits for the same restart.
            await asyncio.shield(self._restart_soon(name))
            await asyncio.sleep(rng.uniform(0.0, 0.2))

    async def heal(self) -> None:
        """Every link clean, etcd up, every bookie not lost running again."""
        network = self.cluster.world.network
        for link in network.links.values():
            link.partitioned, link.drop_ratio = False, 0.0
        network.up(ETCD_NODE)
        for bookie in self.cluster.bookies.values():
            bookie.io.full = bookie.io.failing = False
        self.record("heal: links clean, etcd up, disks healthy")
        for name in sorted(self.down):
            await self._restart_soon(name)
