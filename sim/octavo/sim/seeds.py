"""Running many seeds: for a wall-time budget on several processes, with the figures (seeds per minute,
virtual seconds, violations found) and their section in docs/reliability.md."""

from __future__ import annotations

import gc
import os
import random
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from octavo.sim.run import Outcome, git_commit, run_seed

# Where the bookies' data directories go: memory when the machine has it (fsync costs nothing there, and the
# simulation models durability itself).
SHM_DIR = "/dev/shm"
SECTION_BEGIN = "<!-- octavo.sim figures: begin -->"
SECTION_END = "<!-- octavo.sim figures: end -->"
# Python's cyclic GC in a worker process (docs/simulation.md, "Fourth round" and "Sixth round"): what the imports
# made is frozen out of the collections, a collection runs between seeds, and one starts during a seed only after
# this many new container objects. Python's default is 700 (a seed made about 18 collections, about 4% of its CPU);
# 10,000 still made about 0.7 a seed. At 200,000 a typical seed makes none (its peak memory is unchanged: most of its
# garbage is freed by reference counting; counted in instructions the saving is under 1%, as the collection between
# seeds does most of that work anyway), while a run that goes on for long is still collected. A seed's garbage is
# collected at the latest before the next seed starts, so the memory stays bounded.
GC_GEN0_THRESHOLD = 200_000
GC_GEN1_THRESHOLD = 20
GC_GEN2_THRESHOLD = 20
# glibc's malloc in a worker process: blocks of this size and more are mapped fresh (and unmapped when freed) rather
# than carved from the heap. Every simulated bookie start opens an LMDB index, which callocs a 2 MB and a 1 MB list;
# by default glibc raises its mapping threshold once the first such block is freed, so in a worker that has run many
# seeds those lists come from the reused heap and are zeroed by hand (an index open cost about 0.5 ms instead of
# 0.15). Fixed at 128 KiB (glibc's initial value), they stay fresh mappings: 2.75% fewer instructions a seed.
MALLOC_MMAP_THRESHOLD_BYTES = 128 * 1024
M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


def base_dir() -> str | None:
    return SHM_DIR if os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK) else None


def replay(seed: int, keep: frozenset[int] | None = None) -> Outcome:
    return run_seed(seed, base_dir=base_dir(), keep=keep)


@dataclass
class Summary:
    """What a worker sends back: the outcome without its history unless it failed."""

    seed: int
    ok: bool
    virtual_s: float
    acked: int
    faults: int
    report: str
    cpu_s: float = 0.0  # CPU time of the run (wall time depends on what else the machine runs)


def _worker_start() -> None:
    """A worker process's set-up, once: no logging (a seed's history is its record), and the GC settings above."""
    import logging

    logging.disable(logging.CRITICAL)
    _fix_mmap_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, GC_GEN1_THRESHOLD, GC_GEN2_THRESHOLD)


def _fix_mmap_threshold() -> bool:
    """MALLOC_MMAP_THRESHOLD_BYTES, where the C library is glibc (elsewhere nothing changes). True if it was set."""
    import ctypes

    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    return bool(mallopt is not None and mallopt(M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES))


def _run_one(seed: int) -> Summary:
    cpu0 = time.process_time()
    # Every seed starts with empty generations: its collections do not depend on what the seeds before it left.
    gc.collect()
    outcome = run_seed(seed, base_dir=base_dir())
    return Summary(seed, outcome.ok, outcome.virtual_s, outcome.acked, outcome.faults,
                   "" if outcome.ok else outcome.report(), time.process_time() - cpu0)


@dataclass
class SeedRun:
    wall_s: float = 0.0
    jobs: int = 1
    first_seed: int = 0
    done: list[Summary] = field(default_factory=list)

    @property
    def failed(self) -> list[Summary]:
        return [s for s in self.done if not s.ok]

    @property
    def cpu_s_per_seed(self) -> float:
        return sum(s.cpu_s for s in self.done) / len(self.done) if self.done else 0.0

    @property
    def seeds_per_minute(self) -> float:
        return len(self.done) / self.wall_s * 60 if self.wall_s else 0.0

    def summary(self) -> str:
        virtual = sum(s.virtual_s for s in self.done)
        lines = [f"{len(self.done)} seeds from {self.first_seed} in {self.wall_s:.0f} s on {self.jobs} processes: "
                 f"{self.seeds_per_minute:.0f} seeds/minute ({self.cpu_s_per_seed:.2f} CPU s a seed), "
                 f"{virtual:.0f} virtual s, "
                 f"{sum(s.acked for s in self.done)} entries acknowledged, {sum(s.faults for s in self.done)} "
                 f"faults, {len(self.failed)} seeds with violations"]
        for s in self.failed:
            lines.append(s.report)
        return "\n".join(lines)


def run_for(seconds: float, jobs: int, first_seed: int | None = None, until_violation: bool = False) -> SeedRun:
    """Consecutive seeds from `first_seed` (drawn when None) until `seconds` of wall time have passed (or, with
    `until_violation`, until a seed violates: the seeds still running then are finished, no new one starts)."""
    first = first_seed if first_seed is not None else random.SystemRandom().randrange(1 << 31)
    result = SeedRun(jobs=jobs, first_seed=first)
    t0 = time.monotonic()
    next_seed = first
    with ProcessPoolExecutor(max_workers=jobs, initializer=_worker_start) as pool:
        running: set[Future[Summary]] = set()
        while True:
            while len(running) < jobs * 2 and time.monotonic() - t0 < seconds and not (
                    until_violation and result.failed):
                running.add(pool.submit(_run_one, next_seed))
                next_seed += 1
            if not running:
                break
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                summary = future.result()
                result.done.append(summary)
                if not summary.ok:
                    print(summary.report, flush=True)
    result.wall_s = time.monotonic() - t0
    result.done.sort(key=lambda s: s.seed)
    return result


def write_figures(path: str, result: SeedRun) -> None:
    """Replace (or append) the simulation's section of a markdown file with this run's figures."""
    failed = ", ".join(str(s.seed) for s in result.failed) or "none"
    section = "\n".join([
        SECTION_BEGIN,
        "## Deterministic simulation (`make sim`)",
        "",
        f"Last long run: commit {git_commit()}, {len(result.done)} seeds ({result.first_seed} on) in "
        f"{result.wall_s:.0f} s of wall time on {result.jobs} processes: **{result.seeds_per_minute:.0f} seeds per "
        f"minute** ({result.cpu_s_per_seed:.2f} CPU s a seed; 1-minute load average {os.getloadavg()[0]:.1f} at the "
        f"end), {sum(s.virtual_s for s in result.done):.0f} s of virtual time, "
        f"{sum(s.acked for s in result.done)} entries acknowledged, {sum(s.faults for s in result.done)} faults "
        f"injected. Seeds with violations: {failed} (replay each with `make sim SEED=N`).",
        "What a seed runs and checks: docs/simulation.md.",
        SECTION_END,
    ])
    text = Path(path).read_text() if os.path.exists(path) else ""
    if SECTION_BEGIN in text and SECTION_END in text:
        head, rest = text.split(SECTION_BEGIN, 1)
        text = head + section + rest.split(SECTION_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    with open(path, "w") as f:
        f.write(text)
