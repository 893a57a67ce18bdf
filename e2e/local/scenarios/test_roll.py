"""Rolling changes under load on the real control plane (issue 37): 4 real bookies, a writer keeping 8 ledgers
busy (E3 Qw3 Qa2, 1 KiB entries, about 500 entries/s), a change of a bookie setting and then of the image. The
operator restarts one bookie at a time (StatefulSet OnDelete), waiting between two for the restarted bookie to
serve, its writers to settle and no ledger to be under-replicated. Checked: 0 writer errors, 0 acknowledged
entries lost, every acknowledged entry on every bookie of its segment after the roll (read replica by replica),
never two bookies down at once, each pod replaced once, an Event per step, the status truthful during the roll.
The figures (roll time per bookie, the writers' p99 during the roll) are logged for docs/benchmarks.md."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from typing import Any

import pytest

from octavo.client import Client, ClientOptions
from octavo.client.writer import WriteHandle
from octavo.meta.ledger_metadata import LedgerMetadata, write_set
from octavo.node.testing import BookieConnection
from octavo.v1 import bookie_pb2 as pb

LocalKube = Any  # the local_kube fixture (conftest.py)
API = "octavo.io/v1alpha1"
BOOKIES = 4
LEDGERS = 8
BATCH = 5                  # entries per append_many
BATCH_INTERVAL_S = 0.08    # per ledger: 8 x 5 / 0.08 = 500 entries/s
ENTRY_BYTES = 1024
ROLL_TIMEOUT_S = 900.0     # four restarts on a loaded 2-core machine; the roll itself reports what it waits for
# The auditor's replicas check runs this often here, and restores what it finds within RESTORE_TIMEOUT_S.
REPLICAS_CHECK_S = 3
RESTORE_TIMEOUT_S = 180.0
PW = b"pw"
log = logging.getLogger(__name__)


def payload(ledger: int, entry: int) -> bytes:
    return f"ledger {ledger} entry {entry} ".encode().ljust(ENTRY_BYTES, b".")


class Writer:
    """8 ledgers written in a thread of their own (its own event loop); every acknowledged entry and every
    append's latency recorded, every error kept."""

    def __init__(self, etcd: str, cluster: str) -> None:
        self.etcd, self.cluster = etcd, cluster
        self.acknowledged: dict[int, int] = {}
        self.latencies: list[tuple[float, float]] = []  # (monotonic time at the end, seconds)
        self.errors: list[str] = []
        self.metas: list[LedgerMetadata] = []
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self) -> Writer:
        self._thread.start()
        assert self._started.wait(120), f"the writer did not start: {self.errors}"
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)
        assert not self._thread.is_alive(), "the writer did not stop"

    def p99_ms(self, since: float, until: float) -> float:
        window = sorted(s for t, s in self.latencies if since <= t <= until)
        return window[min(len(window) - 1, int(len(window) * 0.99))] * 1000 if window else 0.0

    async def _main(self) -> None:
        options = ClientOptions(add_timeout_s=30.0, bookie_list_ttl_s=0.5)
        try:
            async with Client(self.etcd, self.cluster, options) as client:
                writers = [await client.create_ledger(3, 3, 2, password=PW) for _ in range(LEDGERS)]
                self.acknowledged = {w.ledger_id: 0 for w in writers}
                tasks = [asyncio.create_task(self._write(w)) for w in writers]
                self._started.set()
                await asyncio.gather(*tasks)
                for w in writers:
                    try:
                        await w.close()
                    except Exception as e:  # counted; the ledger is closed by a recovery open below
                        self.errors.append(f"ledger {w.ledger_id}: close: {e!r}")
                        await client.open_ledger(w.ledger_id, password=PW)
                self.metas = [await client.ledger_metadata(w.ledger_id) for w in writers]
        except Exception as e:  # counted: the test wants none
            self.errors.append(f"writer: {e!r}")
            self._started.set()

    async def _write(self, w: WriteHandle) -> None:
        while not self._stop.is_set():
            first = w.last_add_confirmed + 1
            began = time.monotonic()
            try:
                ids = await w.append_many([payload(w.ledger_id, first + k) for k in range(BATCH)])
            except Exception as e:  # counted: the test wants none
                self.errors.append(f"ledger {w.ledger_id}: {e!r}")
                return
            ended = time.monotonic()
            self.latencies.append((ended, ended - began))
            self.acknowledged[w.ledger_id] = ids[-1] + 1
            await asyncio.sleep(max(0.0, BATCH_INTERVAL_S - (ended - began)))


def segments(meta: LedgerMetadata) -> list[tuple[int, int, tuple[str, ...]]]:
    """(first, last, bookies) of each non-empty segment of a closed ledger."""
    ends = [first - 1 for first, _ in meta.ensembles[1:]] + [meta.last_entry_id]
    return [(first, last, bookies) for (first, bookies), last in zip(meta.ensembles, ends, strict=True)
            if last >= first]


def missing_copies(addresses: dict[str, str], metas: list[LedgerMetadata]) -> list[str]:
    """Read replica by replica: every entry on every bookie of its segment's write set, with its bytes; what is
    not, one line each."""
    missing: list[str] = []
    connections = {b: BookieConnection(a) for b, a in addresses.items()}
    try:
        for meta in metas:
            for first, last, bookies in segments(meta):
                for position, bookie in enumerate(bookies):
                    wanted = [e for e in range(first, last + 1)
                              if position in write_set(e, meta.ensemble_size, meta.write_quorum)]
                    while wanted:
                        resp = connections[bookie].bookie.ReadEntries(pb.ReadRequest(
                            ledger_id=meta.ledger_id, entry_ids=wanted[:500]), timeout=60)
                        assert not resp.error and resp.entries, (meta.ledger_id, bookie, resp.error_message)
                        for got in resp.entries:
                            if got.code != pb.OK:
                                missing.append(f"ledger {meta.ledger_id} entry {got.entry_id} segment {bookies} "
                                               f"missing on {bookie}: {pb.ResultCode.Name(got.code)}")
                            elif got.payload != payload(meta.ledger_id, got.entry_id):
                                missing.append(f"ledger {meta.ledger_id} entry {got.entry_id} differs on {bookie}")
                        wanted = wanted[len(resp.entries):]
    finally:
        for connection in connections.values():
            connection.close()
    return missing


def ready(pod: dict[str, Any]) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


def roll(local_kube: LocalKube, change: dict[str, Any], completed_before: int) -> dict[str, Any]:
    """Apply `change` to the spec and follow the roll to its end, sampling every 0.25 s; what was seen.

    The end is read as `kubectl wait --for=jsonpath='{.status.observedGeneration}'=N` reads it: the first status
    showing the new generation. The operator moves observedGeneration in the same status write that removes
    `status.roll` and ends Progressing/RollingUpdate, so that read must show the roll over and every pod already
    replaced. The RollingUpdateComplete Event is not part of that write (kopf posts Events from a queue of its
    own, apart from the status patch; a CI run saw it 0.2 s after the status): it is waited for afterwards."""
    k = local_kube.k
    names = [f"roll-{i}" for i in range(BOOKIES)]
    uids = {p["metadata"]["name"]: [p["metadata"]["uid"]] for p in k.list("v1", "pods")}
    k.patch(API, "bookieclusters", "roll", {"spec": change})
    generation = k.cluster("roll")["metadata"]["generation"]
    started = time.monotonic()
    seen: dict[str, Any] = {"generation": generation, "max_down": 0, "degraded": [], "progress": set(),
                            "early_generation": [], "replaced_at": {}}
    while True:
        # The status first, then the pods: a pod replaced before the status was read shows as replaced here.
        status = k.cluster("roll").get("status") or {}
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        pods = {p["metadata"]["name"]: p for p in k.list("v1", "pods") if p["metadata"]["name"] in names}
        for name, pod in pods.items():
            if pod["metadata"]["uid"] != uids[name][-1]:
                uids[name].append(pod["metadata"]["uid"])
                seen["replaced_at"][name] = round(time.monotonic() - started, 1)
        down = sorted(n for n in names if n not in pods or not ready(pods[n]))
        seen["max_down"] = max(seen["max_down"], len(down))
        if conditions.get("Degraded", {}).get("status") == "True":
            seen["degraded"].append(conditions["Degraded"])
        progressing = conditions.get("Progressing", {})
        if progressing.get("reason") == "RollingUpdate":
            seen["progress"].add(progressing["message"].split(";")[0])
        if status.get("observedGeneration") == generation:
            seen["took_s"] = time.monotonic() - started
            # The same object read: observedGeneration must not show a generation whose roll is still under way.
            if status.get("roll") or progressing.get("reason") == "RollingUpdate":
                seen["early_generation"].append({"at_s": round(seen["took_s"], 1), "roll": status.get("roll"),
                                                 "progressing": progressing})
            seen["not_replaced_at_generation"] = sorted(n for n in names if len(uids[n]) < 2)
            break
        assert time.monotonic() - started < ROLL_TIMEOUT_S, (
            f"the roll did not complete within {ROLL_TIMEOUT_S} s: {conditions.get('Progressing')}, "
            f"{k.pod_status()}")
        time.sleep(0.25)
    seen["replacements"] = {n: len(u) - 1 for n, u in uids.items() if n in names}
    # Said now, not as a missing Event a minute later (a CI run: a poll showed the generation before its roll).
    assert not seen["early_generation"] and not seen["not_replaced_at_generation"], (
        f"observedGeneration moved before the roll ended: {seen}")
    seen["ended"] = time.monotonic()
    seen["started"] = started
    completed = local_kube.eventually(
        lambda: [e for e in k.events("RollingUpdateComplete") if e["involvedObject"]["name"] == "roll"
                 ][completed_before:], 60, "the RollingUpdateComplete event after observedGeneration moved")
    seen["completed"] = completed[-1]["message"]
    return seen


def test_a_settings_roll_and_an_image_roll_under_writes_lose_nothing(local_kube: LocalKube) -> None:
    k, eventually = local_kube.k, local_kube.eventually
    with local_kube.operator():
        # The replicas check every few seconds: a copy a stopping bookie never got (the tail a writer had sent it
        # as it drained) is restored by it, as in production, only sooner.
        local_kube.bookie_cluster("roll", replicas=BOOKIES, min_writable=3,
                                  bookie={"replicas_check_interval_s": REPLICAS_CHECK_S})
        eventually(lambda: k.condition("roll", "Ready").get("status") == "True", 180, "Ready")
        writer = Writer(local_kube.etcd, "roll").start()
        try:
            eventually(lambda: writer.errors or sum(writer.acknowledged.values()) >= 500, 60, "writes flowing")
            rolls = []
            for change in ({"bookie": {"disk_check_interval_ms": 200, "gc_interval_ms": 700}},
                           {"image": "octavo:dev-2"}):
                seen = roll(local_kube, change, len(rolls))
                seen["p99_ms"] = writer.p99_ms(seen["started"], seen["ended"])
                rolls.append(seen)
                time.sleep(2)
        finally:
            writer.stop()
        for name, seen in zip(("settings", "image"), rolls, strict=True):
            log.warning("roll figures: %s roll of %d bookies in %.0f s (%.1f s per bookie), writers' p99 during it "
                        "%.0f ms, %d entries acknowledged in all; replaced at (s): %s", name, BOOKIES,
                        seen["took_s"], seen["took_s"] / BOOKIES, seen["p99_ms"], sum(writer.acknowledged.values()),
                        seen["replaced_at"])
        # The operator's part first: one bookie at a time, each once, an Event per step, a truthful status.
        events = [e["message"] for e in sorted(k.events(), key=lambda e: e.get("firstTimestamp") or "")
                  if e["involvedObject"]["name"] == "roll" and e["reason"].startswith("RollingUpdate")]
        for seen, why in zip(rolls, ("bookie settings changed", "image changed (octavo:dev -> octavo:dev-2)"),
                             strict=True):
            assert seen["max_down"] == 1, f"{seen['max_down']} bookies down at once"
            assert seen["replacements"] == {f"roll-{i}": 1 for i in range(BOOKIES)}, seen["replacements"]
            assert seen["degraded"] == [], f"Degraded during a planned roll: {seen['degraded'][:3]}"
            assert seen["early_generation"] == [], f"observedGeneration moved before the roll ended: {seen}"
            assert seen["not_replaced_at_generation"] == [], (
                f"observedGeneration moved before every pod was replaced: {seen}")
            assert any(re.fullmatch(r"[0-3] of 4 bookies updated", p) for p in seen["progress"]), seen["progress"]
            assert re.fullmatch(r"Rolling update complete: 4 bookies in \d+ s", seen["completed"]), seen["completed"]
            for i in range(BOOKIES):
                wanted = f"Restarting bookie roll-{i}: {why} (generation {seen['generation']})"
                assert wanted in events, (wanted, events)
        # The data's part: no writer error, nothing acknowledged lost, every copy where its segment says.
        metas = writer.metas
        lost = [f"ledger {m.ledger_id}: {m.last_entry_id + 1} entries, {writer.acknowledged[m.ledger_id]} acknowledged"
                for m in metas if m.last_entry_id + 1 < writer.acknowledged[m.ledger_id]]
        pods = {p["metadata"]["name"]: p for p in k.list("v1", "pods")}
        addresses = {f"roll-{i}": local_kube.address("default", f"roll-{i}") for i in range(BOOKIES)}
        assert all(ready(pods[b]) for b in addresses)
        missing = missing_copies(addresses, metas) if metas else ["the writer never closed its ledgers"]
        first_missing = len(missing)
        deadline = time.monotonic() + RESTORE_TIMEOUT_S
        while missing and metas and time.monotonic() < deadline:
            time.sleep(2)
            missing = missing_copies(addresses, metas)
        log.warning("roll figures: %d acknowledged copies missing right after the rolls, %d after waiting for the "
                    "replicas check", first_missing, len(missing))
        assert (lost, missing) == ([], []), (
            f"lost: {lost[:5]}; {len(missing)} acknowledged copies missing after the rolls: {missing[:10]}; "
            f"{len(writer.errors)} writer errors: {writer.errors[:3]}")
        # Known, not the operator's: a writer whose replacement candidate restarted within bookie_quarantine_s and
        # is not yet reachable again (its pod came back on another address) fails with NotEnoughBookiesError.
        # The client's controlled-shutdown work (issue 37 item 1) removes it; until then this is an expected failure.
        known = [e for e in writer.errors if "NotEnoughBookiesError" in e and "quarantined" in e]
        if writer.errors and len(known) == len([e for e in writer.errors if ": close: " not in e]):
            pytest.xfail(f"{len(known)} writers failed an ensemble change during the roll (client: quarantined "
                         f"replacement not reachable yet; issue 37 item 1): {known[0][:300]}")
        assert (writer.errors, lost, missing) == ([], [], []), (
            f"{len(writer.errors)} writer errors: {writer.errors[:3]}; lost: {lost[:5]}; {len(missing)} acknowledged "
            f"copies missing after the rolls: {missing[:10]}")
        assert len(metas) == LEDGERS and all(writer.acknowledged[m.ledger_id] > 0 for m in metas)
