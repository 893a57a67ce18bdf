"""One seeded run: draw the cluster's shape, the workload and the fault schedule from the seed, run them in
virtual time, heal, let the cluster settle, check. The same seed gives the same history, event for event.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import shutil
import subprocess
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from octavo.client import faults as client_faults
from octavo.sim.checks import check
from octavo.sim.cluster import Cluster
from octavo.sim.crashpoints import POINTS, CrashPoint
from octavo.sim.faults import DATA_LOSING, Fault, Injector, draw_schedule
from octavo.sim.network import NODE
from octavo.sim.workload import Takeover, Workload
from octavo.sim.world import World

# Virtual seconds of workload and faults, then of settling after the heal, and the bound on a whole run (a run
# that has not finished by then is stuck: reported as a violation, never waited out).
WORKLOAD_S = 5.0
SETTLE_S = 3.0
RUN_S_MAX = 300.0
FAULTS_MAX = 6
# Share of runs in which a client dies at a named point: the client's own (mid ensemble change) or one the
# simulated network recognises (crashpoints.py: mid close, mid recovery).
CRASH_POINT_RATIO = 0.3
CRASH_POINTS = (client_faults.ENSEMBLE_CHANGE_AFTER_SEGMENT_CAS, *sorted(POINTS))
CRASH_POINT_SALT = 0x5EED
# Share of runs with a takeover (workload.py: another client recovery-opens a ledger whose writer is alive and
# idle, then the ledger's bookies restart one after another). Drawn, with the takeover's plan, from a generator
# of its own (seed ^ TAKEOVER_SALT), so that a run without one draws everything as before (this salt leaves the
# pinned seeds 1004 and 2179 of sim/tests without one).
TAKEOVER_RATIO = 0.5
TAKEOVER_SALT = 0x7A4E8
TAKEOVER = "takeover: a recovery open of an idle writer's ledger, then a rolling restart of its bookies"
# Lines of history printed around a violation.
HISTORY_TAIL_LINES = 60


@dataclass
class Outcome:
    seed: int
    violations: list[str] = field(default_factory=list)
    history: list[str] = field(default_factory=list)
    virtual_s: float = 0.0
    ledgers: int = 0
    acked: int = 0
    faults: int = 0
    # The fault schedule drawn from the seed (the armed client fault point last, when there is one), and which of
    # its faults this run applied (all of them unless run_seed was given `keep`: a shrunk replay).
    schedule: list[str] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def digest(self) -> str:
        """A hash of the history: two runs of a seed replay exactly when their digests are equal."""
        return hashlib.sha256("\n".join(self.history).encode()).hexdigest()[:16]

    def report(self) -> str:
        lines = [f"seed {self.seed} (commit {git_commit()}): {len(self.violations)} violation(s)",
                 *(f"  - {v}" for v in self.violations[:20]),
                 f"history, last {HISTORY_TAIL_LINES} events:",
                 *(f"  {h}" for h in self.history[-HISTORY_TAIL_LINES:]),
                 f"replay: {self.replay_command()}"]
        return "\n".join(lines)

    def replay_command(self) -> str:
        if self.kept == list(range(len(self.schedule))):
            return f"make sim SEED={self.seed}  (python -m octavo.sim --seed {self.seed})"
        keep = keep_arg(self.kept)
        return f"make sim SEED={self.seed} KEEP={keep}  (python -m octavo.sim --seed {self.seed} --keep {keep})"


def keep_arg(kept: list[int]) -> str:
    """The --keep argument naming these faults of a seed's schedule ("none": no fault at all)."""
    return ",".join(map(str, kept)) or "none"


def parse_keep(text: str) -> frozenset[int]:
    return frozenset() if text == "none" else frozenset(int(part) for part in text.split(",") if part)


class NodeCrashed(asyncio.CancelledError):
    """Raised at a client fault point: the node's process dies there (its task ends as if cancelled)."""


def crash_at_point(cluster: Cluster, name: str) -> None:
    """A client fault point was hit: the writer whose task hit it crashes on the spot. Points hit by a client of
    a bookie (its autorecovery's) are passed: the bookie's own crashes are the schedule's."""
    node = NODE.get()
    if not node.startswith("writer-"):
        return
    cluster.world.record(f"{node} dies at fault point {name}")
    cluster.crash_client(node)
    raise NodeCrashed(f"{node} died at {name}")


def crash_node_at(cluster: Cluster, node: str, name: str) -> None:
    """A crash point of crashpoints.py fired on `node`'s message: that client's process dies there."""
    cluster.world.record(f"{node} dies at crash point {name}")
    cluster.crash_client(node)
    raise NodeCrashed(f"{node} died at {name}")


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, check=False).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _draw_crash_point(seed: int, rng: random.Random) -> str:
    """The crash point armed in this run (`name@N`), or "" (most runs)."""
    if rng.random() >= CRASH_POINT_RATIO:
        return ""
    # Which point: from a generator of its own, so that the world's draws stay as they were.
    return f"{random.Random(seed ^ CRASH_POINT_SALT).choice(CRASH_POINTS)}@{rng.randrange(1, 3)}"


def _kept(outcome: Outcome, schedule: list[Fault], takeover: bool, spec: str, keep: frozenset[int] | None
          ) -> tuple[list[Fault], bool, str]:
    """Record the drawn schedule (then the takeover's rolling restart, then the crash point) in `outcome`, and
    return the faults, whether the rolling restart happens, and the crash point this run applies: all of them,
    or those `keep` names (without its rolling restart, a takeover is still made)."""
    outcome.schedule = ([f"at {f.at_s:.3f}s {f}" for f in schedule] + ([TAKEOVER] if takeover else [])
                        + ([f"client fault point {spec}"] if spec else []))
    outcome.kept = sorted(keep if keep is not None else range(len(outcome.schedule)))
    if spec and len(outcome.schedule) - 1 not in outcome.kept:
        spec = ""
    restart = takeover and len(schedule) in outcome.kept
    kept = [f for i, f in enumerate(schedule) if i in outcome.kept]
    outcome.faults = len(kept) + restart + bool(spec)
    return kept, restart, spec


def _draw_takeover(seed: int, workload_s: float) -> tuple[random.Random, float, float] | None:
    """A takeover's generator, the holder's pause and when into it the taker opens; None in most runs."""
    rng = random.Random(seed ^ TAKEOVER_SALT)
    if rng.random() >= TAKEOVER_RATIO:
        return None
    pause_s = rng.uniform(1.0, min(4.0, workload_s * 0.5))
    return rng, pause_s, rng.uniform(0.02, min(0.5, pause_s / 4))


class TakeoverRun:
    """A run's takeover (workload.py): the holder's and the taker's tasks, and the rolling restart of the holder's
    ensemble that the taker's recovery open starts (when the run keeps it)."""

    HOLDER, TAKER = "holder-0", "taker-0"

    def __init__(self, drawn: tuple[random.Random, float, float], workload: Workload, injector: Injector,
                 schedule: list[Fault], restart: bool) -> None:
        self.rng, pause_s, open_after_s = drawn
        self.workload, self.injector, self.restart = workload, injector, restart
        # The first crash is a machine crash only when the run has no other data-losing fault (one a run).
        self.machine_first = self.rng.random() < 0.5 and not any(f.kind in DATA_LOSING for f in schedule)
        self.plan = Takeover(pause_s, open_after_s, self._after_open)
        self.holder_rng = random.Random(self.rng.getrandbits(64))
        self.taker_rng = random.Random(self.rng.getrandbits(64))
        self.restarts: list[asyncio.Task[None]] = []

    def start(self) -> list[asyncio.Task[None]]:
        cluster = self.workload.cluster
        return [cluster.on_node(self.HOLDER, self.workload.holder(self.HOLDER, self.holder_rng, self.plan)),
                cluster.on_node(self.TAKER, self.workload.taker(self.TAKER, self.taker_rng, self.plan))]

    def stop(self) -> None:
        for task in self.restarts:
            task.cancel()

    def _after_open(self, ensemble: list[str]) -> None:
        if self.restart:
            order = self.rng.sample(ensemble, len(ensemble))
            self.restarts.append(self.workload.cluster.on_node(
                "sim", self.injector.restart_one_by_one(order, self.rng, self.machine_first)))


def _arm_crash_point(cluster: Cluster, spec: str) -> None:
    if spec.startswith(f"{client_faults.ENSEMBLE_CHANGE_AFTER_SEGMENT_CAS}@"):  # the client's own point
        client_faults.arm(spec, lambda name: crash_at_point(cluster, name))
        cluster.world.record(f"armed client fault point {spec}")
    elif spec:  # one the simulated network recognises
        cluster.world.network.crash_point = CrashPoint(spec, lambda node, name: crash_node_at(cluster, node, name))
        cluster.world.record(f"armed crash point {spec}")


def run_seed(seed: int, workload_s: float = WORKLOAD_S, base_dir: str | None = None,
             keep: frozenset[int] | None = None, settle_s: float = SETTLE_S) -> Outcome:
    """Run one seed. With `keep`, only those faults of the seed's schedule are applied (indexes into
    Outcome.schedule; the armed client fault point is the last index): everything else is drawn as without it."""
    world = World(seed)
    root = tempfile.mkdtemp(prefix=f"octavo-sim-{seed}-", dir=base_dir)
    outcome = Outcome(seed)
    try:
        rng = world.rng
        bookies = rng.choice((3, 3, 4, 5))
        quorums = rng.choice([(3, 3, 2), (3, 2, 2), (3, 3, 3), (2, 2, 2)] +
                             ([(bookies, 3, 2)] if bookies > 3 else []))
        cluster = Cluster(world, root, bookies)
        workload = Workload(cluster, random.Random(rng.getrandbits(64)), workload_s, quorums=quorums)
        writers = [f"writer-{i}" for i in range(rng.randrange(1, 4))]
        readers = ["tailer-0", "recoverer-0", "deleter-0"]
        schedule = draw_schedule(random.Random(rng.getrandbits(64)), sorted(cluster.bookies), writers,
                                 FAULTS_MAX, workload_s * 0.9, quorums[0])
        spec = _draw_crash_point(seed, rng)
        drawn = _draw_takeover(seed, workload_s)
        schedule, restart, spec = _kept(outcome, schedule, drawn is not None, spec, keep)
        world.record(f"seed {seed}: {bookies} bookies, quorums {quorums}, writers {len(writers)}, "
                     f"{len(schedule)} faults" + ("" if keep is None else f" (kept {keep_arg(outcome.kept)})")
                     + ("" if drawn is None else f", a takeover{'' if restart else ' without its restart'}"))
        injector = Injector(cluster)
        _arm_crash_point(cluster, spec)
        takeover = None if drawn is None else TakeoverRun(drawn, workload, injector, schedule, restart)

        async def main() -> list[str]:
            await cluster.start_all()
            roles = {"tailer": workload.tailer, "recoverer": workload.recoverer, "deleter": workload.deleter,
                     "writer": workload.writer}
            tasks = [cluster.on_node(node, roles[node.split("-")[0]](node, random.Random(rng.getrandbits(64))))
                     for node in [*writers, *readers]]
            tasks += takeover.start() if takeover is not None else []
            faults = asyncio.get_running_loop().create_task(injector.run(schedule))
            await asyncio.sleep(workload_s)
            faults.cancel()
            if takeover is not None:
                takeover.stop()
            await injector.heal()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            crashed = [f"workload task failed: {type(r).__name__}: {r}" for r in results
                       if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
            await asyncio.sleep(settle_s)
            found = [f"bookie {b} could not start again: {why}" for b, why in injector.start_failures.items()]
            return crashed + found + await check(cluster, workload)

        async def bounded() -> list[str]:
            try:
                async with asyncio.timeout(RUN_S_MAX):
                    return await main()
            except TimeoutError:
                return [f"stuck: the run did not finish within {RUN_S_MAX:g} virtual seconds"]
            finally:
                await cluster.close()

        outcome.violations = world.run(bounded)
        outcome.ledgers = len(workload.ledgers)
        outcome.acked = sum(len(r.acked) for r in workload.ledgers.values())
    except Exception as e:  # the simulation itself failed: a violation too, with the seed to replay it
        where = traceback.extract_tb(e.__traceback__)[-3:]
        outcome.violations.append(f"simulation error: {type(e).__name__}: {e} (at "
                                  + " <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}" for f in where) + ")")
    finally:
        client_faults.arm("")
        outcome.virtual_s = world.clock.now_s
        outcome.history = world.history
        shutil.rmtree(root, ignore_errors=True)
    return outcome
