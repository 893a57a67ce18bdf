"""A seeded, bounded-time network-fault run: writers, a reader and a recoverer (a second writer that takes
over open ledgers with recovery opens; worker.py, each in its own namespace) over a cluster of etcd members and
bookies (labcluster.py), while the nemesis partitions, makes links lossy or slow, heals, SIGKILLs and
SIGSTOPs; then everything is healed and the checker (checker.py) reads every ledger back.

`run(root, seconds, seed)` returns a RunResult; `python nemesis.py --seconds 600 --seed 1 --runs N` (what
`make chaos` calls) runs several and writes their figures into docs/reliability.md. The same seed gives the
same faults in the same order (the workers' own timing still varies with the machine).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from checker import Summary, check, load, report
from labcluster import LabCluster
from netlab import NetLab

WORKER = str(Path(__file__).resolve().parent / "worker.py")
# Most faults are held 1-4 s; one step in LONG_HOLD_ONE_IN is held past the registration lease and the
# lost-bookie delay (a bookie's lease lapses, the auditor may start re-replicating while it comes back), and
# after one step in STACK_ONE_IN nothing is healed, so the next step's fault comes on top (at most
# STACK_STEPS_MAX steps in a row).
LONG_HOLD_ONE_IN = 5
STACK_ONE_IN = 4
STACK_STEPS_MAX = 3
REGISTRATION_TTL_S = 3
LOST_BOOKIE_DELAY_S = 5
FAULT_KINDS = ("cut", "isolate", "partition", "bridge", "kill-bookie", "pause-bookie", "isolate-etcd-member",
               "pause-etcd-member", "kill-etcd-member", "lossy-host", "throttle")


@dataclass
class RunResult:
    seed: int
    seconds: float
    faults: Counter[str] = field(default_factory=Counter)
    holds: Counter[str] = field(default_factory=Counter)  # steps held past the lease, steps left unhealed
    summary: Summary | None = None
    nemesis_log: list[str] = field(default_factory=list)
    text: str = ""

    @property
    def ok(self) -> bool:
        return self.summary is not None and not self.summary.violations


def run(root: str | Path, seconds: float, seed: int, etcd_members: int = 3, bookies: int = 4, writers: int = 2,
        readers: int = 1, recoverers: int = 1) -> RunResult:
    root = Path(root)
    rng = random.Random(seed)
    result = RunResult(seed, seconds)
    with NetLab(root / "lab") as lab:
        cluster = LabCluster(lab, root, etcd_members=etcd_members, bookies=bookies,
                             registration_ttl_s=REGISTRATION_TTL_S,
                             bookie_args=("--lost-bookie-delay-s", str(LOST_BOOKIE_DELAY_S),
                                          "--audit-interval-s", "3")).start()
        clients = ([f"w{i}" for i in range(writers)] + [f"r{i}" for i in range(readers)]
                   + [f"x{i}" for i in range(recoverers)])
        modes = {"w": "write", "r": "read", "x": "recover"}
        histories = []
        procs = []
        for name in clients:
            lab.add_host(name)
            history = root / f"{name}.history"
            histories.append(history)
            procs.append(lab.start(name, [sys.executable, WORKER, modes[name[0]],
                                          "--etcd", cluster.etcd_endpoints, "--cluster", cluster.cluster,
                                          "--name", name, "--history", str(history), "--seconds", str(seconds),
                                          "--seed", str(rng.randrange(1 << 30))],
                                   root / f"{name}.log"))
        servers = [*cluster.etcd_names, *cluster.bookie_names]
        hosts = [*servers, *clients]
        stopped: list[str] = []
        killed: list[str] = []
        stacked = 0
        deadline = time.monotonic() + seconds

        def log(text: str) -> None:
            result.nemesis_log.append(f"{time.monotonic() - (deadline - seconds):7.2f}s {text}")

        while time.monotonic() < deadline - 2:
            kind = rng.choice(FAULT_KINDS)
            result.faults[kind] += 1
            if kind == "cut":
                a, b = rng.sample(hosts, 2)
                lab.cut(a, b)
                log(f"cut {a} {b}")
            elif kind == "isolate":
                a = rng.choice(hosts)
                lab.isolate(a)
                log(f"isolate {a}")
            elif kind == "partition":
                shuffled = rng.sample(hosts, len(hosts))
                half = len(shuffled) // 2
                lab.partition(shuffled[:half], shuffled[half:])
                log(f"partition {sorted(shuffled[:half])} | {sorted(shuffled[half:])}")
            elif kind == "bridge":
                a, b, c = rng.sample(hosts, 3)
                lab.bridge(a, b, c)
                log(f"bridge {a} - {b} - {c}")
            elif kind in ("kill-bookie", "kill-etcd-member"):
                name = rng.choice(cluster.bookie_names if kind == "kill-bookie" else cluster.etcd_names)
                cluster.kill(name)
                killed.append(name)
                log(f"SIGKILL {name}")
            elif kind in ("pause-bookie", "pause-etcd-member"):
                name = rng.choice(cluster.bookie_names if kind == "pause-bookie" else cluster.etcd_names)
                _signal(cluster, name, signal.SIGSTOP)
                stopped.append(name)
                log(f"SIGSTOP {name}")
            elif kind == "lossy-host":  # a bad NIC: loss between it and everyone
                a = rng.choice(hosts)
                for other in hosts:
                    lab.lossy(a, other)
                log(f"lossy {a}")
            elif kind == "throttle":
                a, b = rng.sample(hosts, 2)
                lab.throttle(a, b)
                log(f"throttle {a} {b}")
            elif kind == "isolate-etcd-member":
                e = rng.choice(cluster.etcd_names)
                lab.isolate(e)
                log(f"isolate etcd {e}")
            if rng.randrange(LONG_HOLD_ONE_IN) == 0:
                hold = rng.uniform(LOST_BOOKIE_DELAY_S + 1.0, LOST_BOOKIE_DELAY_S + 5.0)
                result.holds["held past the lease"] += 1
                log(f"hold {hold:.1f}s")
            else:
                hold = rng.uniform(1.0, 4.0)
            time.sleep(min(hold, max(0.0, deadline - time.monotonic())))
            if stacked + 1 < STACK_STEPS_MAX and rng.randrange(STACK_ONE_IN) == 0 and time.monotonic() < deadline - 4:
                stacked += 1  # no heal: the next fault comes on top of this one
                result.holds["left unhealed under the next"] += 1
                log("keep")
                continue
            stacked = 0
            # Heal: everything cut is joined again, stopped processes continue, killed ones restart on their data.
            lab.heal_all()
            for name in sorted(set(stopped)):
                _signal(cluster, name, signal.SIGCONT)
            for name in sorted(set(killed)):  # restarted on its data: a bookie replays its logs, an etcd member rejoins
                if name in cluster.etcd_names:
                    cluster.start_etcd(name)
                else:
                    cluster.start_bookie(name)
            if stopped or killed:
                log(f"resume {sorted(set(stopped))} restart {sorted(set(killed))}")
            stopped, killed = [], []
            log("heal")
            time.sleep(rng.uniform(0.5, 2.0))
        lab.heal_all()
        for proc in procs:
            try:
                proc.wait(timeout=120)
            except Exception:
                proc.kill()
        # Converge: every etcd member and bookie serving (and registered) before the checker reads.
        for name in [*cluster.etcd_names, *cluster.bookie_names]:
            if cluster.procs[name].poll() is not None and name in cluster.etcd_names:
                cluster.start_etcd(name)
            elif cluster.procs[name].poll() is not None:
                cluster.start_bookie(name)
        time.sleep(cluster.registration_ttl_s + 1)
        events = load(histories)
        os.environ.pop("OCTAVO_ETCD", None)
        result.summary = asyncio.run(check(cluster.etcd_endpoints, cluster.cluster, events))
        result.text = report(result.summary, events)
    return result


def _signal(cluster: LabCluster, name: str, sig: int) -> None:
    proc = cluster.procs[name]
    if proc.poll() is None:
        os.kill(proc.pid, sig)


def describe(result: RunResult) -> str:
    s = result.summary
    head = (f"seed {result.seed}: {result.seconds:.0f}s, faults {dict(result.faults)}, steps {dict(result.holds)}, "
            f"ledgers {s.ledgers if s else '?'}, acknowledged entries {s.acknowledged_entries if s else '?'}, "
            f"operations {dict(s.operations) if s else '?'}, violations {len(s.violations) if s else '?'}")
    if result.ok:
        return head
    return head + "\nnemesis:\n" + "\n".join(result.nemesis_log[-30:]) + "\n" + result.text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=600.0, help="total time of the runs")
    p.add_argument("--run-seconds", type=float, default=120.0, help="length of one run")
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--root", default="/tmp/octavo-chaos")
    p.add_argument("--write", default="", help="write the figures into this markdown file")
    args = p.parse_args(argv)
    results = []
    started = time.monotonic()
    seed = args.seed
    while time.monotonic() - started < args.seconds:
        length = min(args.run_seconds, max(20.0, args.seconds - (time.monotonic() - started)))
        r = run(Path(args.root) / f"run-{seed}", length, seed)
        print(describe(r), flush=True)
        results.append(r)
        if not r.ok:
            break
        seed += 1
    if args.write:
        _write(Path(args.write), results)
    return 0 if all(r.ok for r in results) else 1


def _write(path: Path, results: list[RunResult]) -> None:
    faults: Counter[str] = Counter()
    holds: Counter[str] = Counter()
    ops: Counter[str] = Counter()
    for r in results:
        faults.update(r.faults)
        holds.update(r.holds)
        if r.summary:
            ops.update(r.summary.operations)
    violations = sum(len(r.summary.violations) if r.summary else 0 for r in results)
    text = path.read_text() if path.exists() else "# Reliability\n"
    marker = "<!-- chaos figures -->"
    section = (f"{marker}\n## Last `make chaos` run\n\n"
               f"On {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores (each run up to "
               f"{max(r.seconds for r in results):.0f} s of faults, then the check).\n\n"
               f"{len(results)} runs, {sum(r.seconds for r in results):.0f} s, seeds "
               f"{results[0].seed}..{results[-1].seed}; violations: **{violations}**.\n\n"
               "| fault | injected |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in sorted(faults.items())) +
               "\n| fault steps | count |\n|---|---|\n" +
               "".join(f"| {k} | {v} |\n" for k, v in sorted(holds.items())) +
               "\n| operation | count |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in sorted(ops.items())) +
               f"\nledgers checked: {sum(r.summary.ledgers for r in results if r.summary)}; acknowledged entries "
               f"checked: {sum(r.summary.acknowledged_entries for r in results if r.summary)}.\n")
    head = text.split(marker)[0].rstrip() + "\n\n"
    path.write_text(head + section)


if __name__ == "__main__":
    sys.exit(main())
