"""A simulated cluster: the world, its bookies, and clients, each a node of the network whose tasks are
tracked, so a node can crash (every task of it cancelled at once, wherever it is).

Tasks belong to the node named by network.NODE when they are created (a loop task factory records it).
"""

from __future__ import annotations

import asyncio
import contextvars
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

from octavo.client.client import Client
from octavo.client.options import ClientOptions
from octavo.sim.bookie import CLUSTER, SimBookie
from octavo.sim.network import NODE
from octavo.sim.world import ETCD_ADDRESS, World

T = TypeVar("T")

# A node's list of tasks is swept of done ones once it is longer than this, and then whenever it has doubled.
TASKS_SWEEP_MIN = 64

# Client settings scaled to seconds of virtual time.
SIM_CLIENT_OPTIONS = ClientOptions(add_timeout_s=2.0, read_timeout_s=2.0, metadata_timeout_s=2.0,
                                   ensemble_change_wait_s=3.0, bookie_quarantine_s=3.0, tail_wait_ms=500)


class Cluster:
    def __init__(self, world: World, root_dir: str, bookies: int) -> None:
        self.world = world
        self.root_dir = root_dir
        self.bookies = {f"bookie-{i}": SimBookie(f"bookie-{i}", root_dir) for i in range(bookies)}
        # Each node's tasks in the order they were made (done ones are swept out now and then: see _task_factory).
        self.tasks: dict[str, list[asyncio.Task[Any]]] = {}
        self._sweep_at: dict[str, int] = {}
        self.clients: dict[str, Client] = {}
        world.loop.set_task_factory(self._task_factory)  # type: ignore[arg-type]

    def _task_factory(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any],
                      context: contextvars.Context | None = None) -> asyncio.Task[Any]:
        """Every task is made here and kept under its node's name (a list, not a weak set: it costs less, and a
        crash cancels the node's tasks in the order they were made). Done tasks are dropped whenever the list
        has doubled since the last sweep."""
        task = asyncio.Task(coro, loop=loop, context=context)
        node = context.get(NODE, "sim") if context is not None else NODE.get()
        tasks = self.tasks.get(node)
        if tasks is None:
            tasks = self.tasks[node] = []
        tasks.append(task)
        if len(tasks) > self._sweep_at.get(node, TASKS_SWEEP_MIN):
            tasks[:] = [t for t in tasks if not t.done()]
            self._sweep_at[node] = max(TASKS_SWEEP_MIN, 2 * len(tasks))
        return task

    def on_node(self, node: str, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        context = contextvars.copy_context()
        context.run(NODE.set, node)
        return self.world.loop.create_task(coro, context=context)

    def kill_tasks(self, node: str) -> None:
        current = asyncio.current_task()
        for task in list(self.tasks.get(node, ())):
            if task is not current and not task.done():
                task.cancel()

    # -- bookies -------------------------------------------------------------------------------------
    async def start_bookie(self, name: str) -> None:
        bookie = self.bookies[name]
        # Not network.up(name): the old process's host stays down (its handlers hold its closed storage); the
        # new process's host is up once it serves (Network.serve), as a real port is.
        await self.on_node(name, bookie.start(self.world.network, ETCD_ADDRESS))
        self.world.record(f"bookie {name} started (boot {bookie.boot}, start {bookie.starts})")

    async def start_all(self) -> None:
        for name in sorted(self.bookies):
            await self.start_bookie(name)

    def crash_bookie(self, name: str, machine: bool) -> None:
        bookie = self.bookies[name]
        self.world.network.down(name, "crashed")
        self.kill_tasks(name)
        if machine:
            report = bookie.crash_machine(self.world.rng)
            lost = sum(1 for what in report.values() if "of" in what and not what.startswith("durable 0 of 0"))
            self.world.record(f"machine crash {name}: {lost} files cut back to what was synced")
        else:
            bookie.crash_process()
            self.world.record(f"process crash {name}")

    # -- clients -------------------------------------------------------------------------------------
    def client(self, name: str) -> Client:
        """A client on node `name` (made on first use; its channels and tasks belong to that node)."""
        client = self.clients.get(name)
        if client is None:
            client = self.clients[name] = NODE_CONTEXTS.run_on(name, lambda: Client(ETCD_ADDRESS, CLUSTER,
                                                                                      SIM_CLIENT_OPTIONS))
        return client

    def crash_client(self, name: str) -> None:
        """The client's process dies: its tasks end where they are, nothing is closed or flushed."""
        self.kill_tasks(name)
        self.clients.pop(name, None)
        self.world.record(f"client crash {name}")

    async def close(self) -> None:
        for name in list(self.clients):
            client = self.clients.pop(name)
            await self.on_node(name, client.close())
        for bookie in self.bookies.values():
            if bookie.running:
                self.kill_tasks(bookie.name)
                bookie.crash_process()


class _NodeContexts:
    @staticmethod
    def run_on(node: str, fn: Any) -> Any:
        context = contextvars.copy_context()
        context.run(NODE.set, node)
        return context.run(fn)


NODE_CONTEXTS = _NodeContexts()


def data_root(base: str, seed: int) -> str:
    path = os.path.join(base, f"seed-{seed}")
    os.makedirs(path, exist_ok=True)
    return path
