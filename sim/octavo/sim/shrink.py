"""Shrinking a violating run: the fewest faults of its seed's schedule that still give the same violation.

The seed fixes everything but which faults apply (run_seed's `keep`): the cluster's shape, the workload's
random choices and each fault's time and target stay as drawn. Shrinking drops faults in chunks, halving the
chunk down to one fault at a time (as delta debugging does), and keeps a smaller set whenever its run still shows
one of the original violations (compared without their numbers: ledger ids and entry ids move when the run
changes). The result prints the faults left and the command that replays exactly that run.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from octavo.sim.run import WORKLOAD_S, Outcome, run_seed

# Runs a shrink may spend (each is a whole seed): enough for every single drop of a 7-fault schedule, twice over.
RUNS_MAX = 30


def signature(violation: str) -> str:
    """What a violation is about, without the numbers that change from run to run (ledger and entry ids, times)
    and the details in brackets."""
    return re.sub(r"\d+(\.\d+)?", "#", violation.split(" (", 1)[0])


@dataclass
class Shrunk:
    seed: int
    first: Outcome  # the run with every fault
    last: Outcome  # the run with the fewest faults that still violates
    runs: int

    def report(self) -> str:
        kept = self.last.kept
        lines = [f"seed {self.seed}: shrunk from {len(self.first.schedule)} to {len(kept)} fault(s) in {self.runs} "
                 f"runs; the same violation with only:",
                 *(f"  [{i}] {self.first.schedule[i]}" for i in kept),
                 *(["  (no fault at all)"] if not kept else []),
                 *(f"  - {v}" for v in self.last.violations[:5]),
                 f"replay: {self.last.replay_command()}"]
        return "\n".join(lines)


def shrink(seed: int, workload_s: float = WORKLOAD_S, base_dir: str | None = None, first: Outcome | None = None,
           runner: Callable[[int, float, str | None, frozenset[int] | None], Outcome] = run_seed,
           runs_max: int = RUNS_MAX) -> Shrunk:
    """Drop faults while the violation stays. `first` is the seed's run with every fault when already done."""
    first = first or runner(seed, workload_s, base_dir, None)
    if first.ok:
        raise ValueError(f"seed {seed} has no violation to shrink")
    wanted = {signature(v) for v in first.violations}
    best, runs = first, 0
    keep = list(first.kept)
    chunk = len(keep)
    while chunk >= 1 and keep and runs < runs_max:
        dropped = False
        i = 0
        while i < len(keep) and runs < runs_max:
            trial = keep[:i] + keep[i + chunk:]
            outcome = runner(seed, workload_s, base_dir, frozenset(trial))
            runs += 1
            if any(signature(v) in wanted for v in outcome.violations):
                keep, best, dropped = trial, outcome, True
            else:
                i += chunk
        if chunk == 1 and not dropped:
            break
        chunk = max(1, chunk // 2) if chunk > 1 else 1
    return Shrunk(seed, first, best, runs)
