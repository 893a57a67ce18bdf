"""The checker of a network-fault run: reads the workers' histories, then (after healing) every ledger through a
recovery open from the observer, and names each violation:

- an acknowledged entry that is not readable, or reads back other bytes, after the recovery open;
- an acknowledged entry beyond the ledger's final last entry (acknowledged after the ledger was closed or
  fenced: a writer that kept getting acks on the minority side);
- a ledger whose content two readers (two recovery opens from two clients) do not agree on;
- a read (without recovery, during the run) that returned bytes that were never written, or entries past what
  the ledger finally holds;
- a close acknowledged at a last entry other than the final one, or a recovery open (by another process, during
  the run) that closed a ledger at another end than the one it finally has.

`report(violations, histories, around)` prints the history around each violation (by ledger) for a failing run.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker import PASSWORD, payload


@dataclass
class Violation:
    ledger: int
    what: str


@dataclass
class Summary:
    operations: dict[str, int] = field(default_factory=dict)
    ledgers: int = 0
    acknowledged_entries: int = 0
    violations: list[Violation] = field(default_factory=list)


def load(paths: Iterable[Path]) -> list[dict[str, Any]]:
    events = []
    for path in paths:
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    try:
                        events.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue  # a line cut by a SIGKILL mid-write
    return sorted(events, key=lambda e: e["t"])


async def check(etcd: str, cluster: str, events: list[dict[str, Any]]) -> Summary:
    from octavo.client import Client, ClientOptions

    summary = Summary()
    for e in events:
        key = f"{e['f']} {e['type']}"
        summary.operations[key] = summary.operations.get(key, 0) + 1
    acked: dict[int, set[int]] = defaultdict(set)
    closes: dict[int, int] = {}
    reads: list[dict[str, Any]] = []
    recoveries: list[dict[str, Any]] = []
    ledgers: set[int] = set()
    for e in events:
        if e["f"] == "create" and e["type"] == "ok":
            ledgers.add(e["ledger"])
        elif e["f"] == "append" and e["type"] == "ok":
            acked[e["ledger"]].update(range(e["first"], e["last"] + 1))
        elif e["f"] == "close" and e["type"] == "ok":
            closes[e["ledger"]] = e["last"]
        elif e["f"] == "read" and e["type"] == "ok":
            reads.append(e)
        elif e["f"] == "recover" and e["type"] == "ok":
            recoveries.append(e)
    summary.ledgers = len(ledgers)
    summary.acknowledged_entries = sum(len(v) for v in acked.values())
    options = ClientOptions(read_timeout_s=10.0, add_timeout_s=10.0, metadata_timeout_s=10.0)
    finals: dict[int, int] = {}
    async with Client(etcd, cluster, options) as one, Client(etcd, cluster, options) as two:
        for ledger in sorted(ledgers):
            handle = await one.open_ledger(ledger, PASSWORD)  # recovery: fences and closes
            last = handle.last_entry_id
            finals[ledger] = last
            content = {en.entry_id: en.data async for en in handle.read(0, last)} if last >= 0 else {}
            again = await two.open_ledger(ledger, PASSWORD)
            other = {en.entry_id: en.data async for en in again.read(0, again.last_entry_id)} \
                if again.last_entry_id >= 0 else {}
            if other != content:
                summary.violations.append(Violation(ledger, f"two readers disagree: last {last} vs "
                                                            f"{again.last_entry_id}"))
            beyond = sorted(i for i in acked[ledger] if i > last)
            if beyond:
                summary.violations.append(Violation(ledger, f"entries {beyond[:5]}... acknowledged beyond the "
                                                            f"final last entry {last}"))
            wrong = sorted(i for i in acked[ledger] if i <= last and content.get(i) != payload(ledger, i))
            if wrong:
                summary.violations.append(Violation(ledger, f"acknowledged entries {wrong[:5]} read back "
                                                            "missing or different"))
            garbage = sorted(i for i, data in content.items() if data != payload(ledger, i))
            if garbage:
                summary.violations.append(Violation(ledger, f"entries {garbage[:5]} hold bytes never written"))
            if ledger in closes and closes[ledger] != last:
                summary.violations.append(Violation(ledger, f"closed by its writer at {closes[ledger]}, "
                                                            f"finally at {last}"))
    for r in recoveries:
        if r["ledger"] in finals and r["last"] != finals[r["ledger"]]:
            summary.violations.append(Violation(r["ledger"], f"{r['p']}'s recovery closed it at {r['last']}, "
                                                             f"it finally ends at {finals[r['ledger']]}"))
    for r in reads:
        if not r["good"]:
            summary.violations.append(Violation(r["ledger"], f"{r['p']} read bytes never written in "
                                                             f"{r['first']}..{r['last']}"))
        if r["ledger"] in finals and r["last"] > finals[r["ledger"]]:
            summary.violations.append(Violation(r["ledger"], f"{r['p']} read up to {r['last']}, past the "
                                                             f"final last entry {finals[r['ledger']]}"))
    return summary


def report(summary: Summary, events: list[dict[str, Any]], around: int = 12) -> str:
    lines = []
    for v in summary.violations:
        lines.append(f"VIOLATION ledger {v.ledger}: {v.what}")
        mine = [e for e in events if e.get("ledger") == v.ledger]
        for e in mine[-around:]:
            lines.append("    " + json.dumps(e))
    return "\n".join(lines)
