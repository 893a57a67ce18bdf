"""The operator on the local control plane with real bookies (see conftest.py): what a platform engineer sees."""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

import pytest

LocalKube = Any  # the local_kube fixture (conftest.py)


def test_a_bookie_cluster_becomes_a_statefulset_whose_bookies_register(local_kube: LocalKube) -> None:
    k, eventually = local_kube.k, local_kube.eventually
    with local_kube.operator():
        local_kube.bookie_cluster("logs", replicas=3)
        sts = eventually(lambda: k.get("apps/v1", "statefulsets", "logs"), 30, "the StatefulSet")
        owners = sts["metadata"]["ownerReferences"]
        assert [o["kind"] for o in owners] == ["BookieCluster"] and owners[0]["name"] == "logs"
        assert sts["spec"]["replicas"] == 3
        for plural, name in (("services", "logs"), ("services", "logs-bookies"), ("configmaps", "logs-bookie-config")):
            obj = k.get("v1", plural, name)
            assert obj is not None, f"{plural}/{name} missing"
            assert obj["metadata"]["ownerReferences"][0]["name"] == "logs"
        assert k.get("policy/v1", "poddisruptionbudgets", "logs")["spec"]["maxUnavailable"] == 1
        bookies = eventually(lambda: (r := local_kube.registered("logs")) and len(r) == 3 and r, 60,
                             "three bookies registered in etcd")
        assert sorted(bookies) == ["logs-0", "logs-1", "logs-2"]
        for name, bookie in bookies.items():  # each advertises its pod's stable name, which is the pod's address
            host, _, port = bookie.address.rpartition(":")
            assert (host, port) == (f"{name}.logs-bookies.default.svc", "3181"), bookie.address
            ip = k.get("v1", "pods", name)["status"]["podIP"]
            eventually(lambda h=host, want=ip: _resolves(h) == want, 30, f"{host} resolving to {ip}")
        ready = eventually(lambda: k.condition("logs", "Ready").get("status") == "True" and k.cluster("logs"), 60,
                           "Ready")
        status = ready["status"]
        assert status["readyReplicas"] == 3 and status["writableBookies"] == 3
        assert [b["id"] for b in status["bookies"]] == ["logs-0", "logs-1", "logs-2"]
        assert all(b["mode"] == "writable" and b["reachable"] for b in status["bookies"])
        assert status["observedGeneration"] == 1
        # Each pod's process was started once (the emulation's pod runner once stopped what it had just started).
        assert {b: local_kube.restarts("default", b) for b in bookies} == {"logs-0": 0, "logs-1": 0, "logs-2": 0}


ENTRY = 1000


def payload(ledger: int, entry: int) -> bytes:
    head = b"%d/%d:" % (ledger, entry)
    return head + bytes((ledger * 31 + entry + i) % 251 for i in range(ENTRY - len(head)))


def write_interleaved(etcd: str, cluster: str, ledgers: int, rounds: int, ensemble: int = 3
                      ) -> list[tuple[int, int]]:
    """Ledgers written in turns of 20 entries (every log holds some of each); returns (id, entries)."""
    from octavo.client import SyncClient

    with SyncClient(etcd, cluster=cluster) as client:
        handles = [client.create_ledger(ensemble, ensemble, min(2, ensemble), password=b"pw")
                   for _ in range(ledgers)]
        for r in range(rounds):
            for h in handles:
                h.append_many([payload(h.ledger_id, e) for e in range(r * 20, (r + 1) * 20)])
        for h in handles:
            h.close()
        return [(h.ledger_id, rounds * 20) for h in handles]


def delete_ledgers(etcd: str, cluster: str, ledgers: list[int]) -> None:
    from octavo.client import SyncClient

    with SyncClient(etcd, cluster=cluster) as client:
        for ledger in ledgers:
            client.delete_ledger(ledger)


def read_back(etcd: str, cluster: str, ledger: int, count: int) -> None:
    from octavo.client import SyncClient

    with SyncClient(etcd, cluster=cluster) as client:
        handle = client.open_ledger(ledger, password=b"pw")
        got = list(handle.read(0, count - 1))
    assert [e.entry_id for e in got] == list(range(count))
    assert all(e.data == payload(ledger, e.entry_id) for e in got), f"ledger {ledger} reads back different bytes"


def bookie_status(k: Any, cluster: str) -> dict[str, dict[str, Any]]:
    return {b["id"]: b for b in ((k.cluster(cluster) or {}).get("status") or {}).get("bookies") or []}


def test_compaction_runs_in_the_policys_window_one_bookie_at_a_time_and_survives_an_operator_restart(
        local_kube: LocalKube) -> None:
    from datetime import UTC, datetime, timedelta

    k, eventually = local_kube.k, local_kube.eventually
    real = datetime.now(UTC)
    start = (real + timedelta(seconds=150)).replace(second=0, microsecond=0)
    # The operator's clock stands 20 s before the window (the bookies keep the machine's).
    offset_s = (start - timedelta(seconds=20) - real).total_seconds()
    local_kube.policy("nightly", {"windows": [{"schedule": f"{start.minute} {start.hour} * * *", "duration": "1h",
                                               "timeZone": "UTC"}],
                                  "maxConcurrentBookies": 1, "minor": {"threshold": 0.5},
                                  "rateBytesPerSecond": 64 << 20})
    with local_kube.operator(clock_offset_s=offset_s):
        local_kube.bookie_cluster("logs", replicas=3, policy="nightly",
                                  bookie={"log_size_bytes_max": 256 * 1024, "batch_bytes_max": 128 * 1024,
                                          "entry_size_bytes_max": 64 * 1024})
        eventually(lambda: k.condition("logs", "Ready").get("status") == "True", 60, "Ready")
        closed = eventually(lambda: (s := bookie_status(k, "logs")) and all(
            b["compaction"]["window"] == "closed" for b in s.values()) and s, 30, "every bookie's window closed")
        assert len(closed) == 3
        assert k.condition("logs", "CompactionWindowOpen")["status"] == "False"
        window = ("octavo_operator_windows_open", (("namespace", "default"), ("policy", "nightly")))
        eventually(lambda: local_kube.operator_metrics().get(window) == 0, 10, "the window gauge at 0")
        (kept, count), *doomed = write_interleaved(local_kube.etcd, "logs", 6, 20)  # 1/6 live
        delete_ledgers(local_kube.etcd, "logs", [ledger for ledger, _ in doomed])
        time.sleep(3)  # GC drops the deleted ledgers; scheduled compaction may not run
        assert all(not b["compaction"]["lastRun"] for b in bookie_status(k, "logs").values()), \
            "a bookie compacted outside the window"

        local_kube.state.clock_offset_s = (start + timedelta(seconds=1) - datetime.now(UTC)).total_seconds()
        eventually(lambda: k.condition("logs", "CompactionWindowOpen").get("status") == "True", 10, "window open")
        eventually(lambda: local_kube.operator_metrics().get(window) == 1, 10, "the window gauge at 1")
        slots_seen: set[int] = set()

        def one_compacted() -> list[str]:
            status = k.cluster("logs")["status"]
            slots_seen.add(len(status["memory"]["windowOpenedUnixMs"]))
            return [b["id"] for b in status["bookies"] if b["compaction"]["lastRun"]]
        first = eventually(one_compacted, 60, "a bookie compacted in the window")
        assert len(first) == 1
    # Restarted mid-window (on the same clock), the operator carries on from the memory it kept in the status.
    with local_kube.operator(clock_offset_s=local_kube.state.clock_offset_s):
        def all_compacted() -> bool:
            status = k.cluster("logs")["status"]
            slots_seen.add(len(status["memory"]["windowOpenedUnixMs"]))
            return all(b["compaction"]["lastRun"] for b in status["bookies"])
        eventually(all_compacted, 90, "every bookie compacted in the window")
        assert slots_seen <= {0, 1}, f"more bookies than maxConcurrentBookies held a slot: {slots_seen}"
        opened = [e["message"] for e in k.events("OpenCompactionWindow")]
        # At most one slot per bookie per window (an event queued as the first operator stopped may be lost:
        # kopf posts events in the background, best effort).
        for bookie in ("logs-0", "logs-1", "logs-2"):
            assert sum(1 for m in opened if m.startswith(f"bookie {bookie}:")) <= 1, opened
        assert len(opened) >= 2, opened
        runs = {}
        for bookie in ("logs-0", "logs-1", "logs-2"):
            from octavo.node.testing import BookieConnection
            with BookieConnection(local_kube.address("default", bookie)) as conn:
                runs[bookie] = conn.status().compaction.last_run
        assert all(r.kind == "minor" and r.logs_compacted > 0 for r in runs.values()), runs
        read_back(local_kube.etcd, "logs", kept, count)
        # Past the window's end every bookie's window is closed again.
        local_kube.state.clock_offset_s = (start + timedelta(hours=1, seconds=1) - datetime.now(UTC)).total_seconds()
        eventually(lambda: all(b["compaction"]["window"] == "closed" for b in bookie_status(k, "logs").values())
                   and k.condition("logs", "CompactionWindowOpen")["status"] == "False", 20, "windows closed")


def test_a_bookie_past_read_only_ratio_is_forced_read_only_and_released_below_writable_ratio(
        local_kube: LocalKube) -> None:
    import asyncio

    from octavo.client import Client

    k, eventually, etcd = local_kube.k, local_kube.eventually, local_kube.etcd
    capacity = 8 << 20
    local_kube.policy("tight", {"warnRatio": 0.45, "readOnlyRatio": 0.5, "writableRatio": 0.25})

    async def fill() -> tuple[str, int]:
        """One E1 ledger with 5 MB: its bookie crosses readOnlyRatio, the others stay near empty."""
        async with Client(etcd, "logs") as client:
            handle = await client.create_ledger(1, 1, 1, password=b"pw")
            for batch in range(50):
                await handle.append_many([payload(handle.ledger_id, batch * 100 + i) for i in range(100)])
            await handle.close()
            return handle.metadata.last_ensemble[0], handle.ledger_id

    async def new_ensembles(n: int) -> set[str]:
        async with Client(etcd, "logs") as client:
            named: set[str] = set()
            for _ in range(n):
                handle = await client.create_ledger(3, 3, 2, password=b"pw")
                await handle.append(b"x")
                named.update(handle.metadata.last_ensemble)
                await handle.close()
            return named

    async def delete(ledger: int) -> None:
        async with Client(etcd, "logs") as client:
            await client.delete_ledger(ledger)

    with local_kube.operator():
        local_kube.bookie_cluster("logs", replicas=4, policy="tight", min_writable=3, bookie={
            "disk_capacity_bytes": capacity, "log_size_bytes_max": 256 * 1024, "batch_bytes_max": 128 * 1024,
            "entry_size_bytes_max": 64 * 1024})
        eventually(lambda: k.condition("logs", "Ready").get("status") == "True", 60, "Ready")
        _, ledger = asyncio.run(fill())
        forced = eventually(lambda: (s := bookie_status(k, "logs")) and any(b["forcedByOperator"] for b in s.values())
                            and s, 30, "a bookie forced read-only")
        victim = max(forced, key=lambda b: forced[b]["diskUsageRatio"])
        assert forced[victim]["mode"] == "read-only" and forced[victim]["diskUsageRatio"] >= 0.5
        assert [b for b, s in forced.items() if s["mode"] == "read-only"] == [victim]
        assert k.condition("logs", "DiskPressure")["status"] == "True"
        assert victim in k.condition("logs", "DiskPressure")["message"]
        from octavo.node.testing import BookieConnection
        with BookieConnection(local_kube.address("default", victim)) as conn:
            st = conn.status()  # what `octavo cluster status` shows: forced by the operator at its readOnlyRatio
        assert st.forced_threshold_ratio == pytest.approx(0.5) and st.forced_reason.startswith("the operator: "), st
        assert any(e["message"].startswith(f"bookie {victim}:") for e in k.events("ForceReadOnly"))
        metrics = local_kube.operator_metrics()
        assert metrics[("octavo_operator_actions_total", (("kind", "ForceReadOnly"), ("result", "ok")))] >= 1
        assert ("octavo_operator_actions_total", (("kind", "ReleaseReadOnly"), ("result", "ok"))) not in metrics
        polls = metrics[("octavo_operator_reconcile_duration_seconds_count", (("result", "ok"), ("trigger", "poll")))]
        assert polls >= 1
        assert metrics[("octavo_operator_objects_applied_total", ())] >= 1
        assert victim in local_kube.registered("logs") and local_kube.registered("logs")[victim].readonly
        named = asyncio.run(new_ensembles(10))
        assert victim not in named and len(named) == 3, f"a new ledger was placed on read-only {victim}: {named}"
        # Space comes back (the ledger deleted, its logs collected): released below writableRatio, not before.
        asyncio.run(delete(ledger))
        released = eventually(lambda: (s := bookie_status(k, "logs")) and s[victim]["mode"] == "writable" and s,
                              60, f"{victim} writable again")
        assert released[victim]["diskUsageRatio"] <= 0.25 and not released[victim]["forcedByOperator"]
        assert any(e["message"].startswith(f"bookie {victim}:") for e in k.events("ReleaseReadOnly"))
        eventually(lambda: k.condition("logs", "DiskPressure")["status"] == "False", 10, "no disk pressure")
        metrics = local_kube.operator_metrics()
        assert metrics[("octavo_operator_actions_total", (("kind", "ReleaseReadOnly"), ("result", "ok")))] >= 1
        assert metrics[("octavo_operator_reconcile_duration_seconds_count", (("result", "ok"), ("trigger", "poll")))] \
            > polls
        assert not local_kube.registered("logs")[victim].readonly


def test_scale_down_decommissions_the_highest_ordinal_under_a_writer_and_loses_nothing(local_kube: LocalKube) -> None:
    import asyncio
    import threading

    from octavo.client import Client
    from octavo.client.replication import ledgers_naming

    k, eventually, etcd = local_kube.k, local_kube.eventually, local_kube.etcd
    acked: list[tuple[int, int]] = []
    stop = threading.Event()
    failures: list[BaseException] = []

    async def write() -> None:
        async with Client(etcd, "logs") as client:
            while not stop.is_set():
                handle = await client.create_ledger(3, 3, 2, password=b"pw")
                for batch in range(10):
                    await handle.append_many([payload(handle.ledger_id, batch * 20 + i) for i in range(20)])
                    acked.append((handle.ledger_id, batch * 20 + 19))
                await handle.close()

    def writer() -> None:
        try:
            asyncio.run(write())
        except BaseException as e:  # reported by the test
            failures.append(e)

    async def naming(bookie: str) -> list[int]:
        async with Client(etcd, "logs") as client:
            return [m.ledger_id for m in await ledgers_naming(client, bookie)]

    with local_kube.operator():
        local_kube.bookie_cluster("logs", replicas=4, min_writable=3)
        eventually(lambda: k.condition("logs", "Ready").get("status") == "True", 60, "Ready")
        thread = threading.Thread(target=writer)
        thread.start()
        try:
            eventually(lambda: asyncio.run(naming("logs-3")), 30, "ledgers on logs-3")
            k.patch("octavo.io/v1alpha1", "bookieclusters", "logs", {"spec": {"replicas": 3}})
            eventually(lambda: "decommissioning logs-3" in (k.cluster("logs")["status"].get("scaleDown") or ""),
                       20, "the scale-down reported")
            assert k.get("apps/v1", "statefulsets", "logs")["spec"]["replicas"] == 4  # not before it is drained
            eventually(lambda: k.get("apps/v1", "statefulsets", "logs")["spec"]["replicas"] == 3, 120,
                       "the StatefulSet scaled to 3")
        finally:
            stop.set()
            thread.join(60)
        assert not failures, failures
        eventually(lambda: k.get("v1", "pods", "logs-3") is None, 30, "pod logs-3 removed")
        eventually(lambda: k.get("v1", "persistentvolumeclaims", "data-logs-3") is None, 10, "its volume deleted")
        eventually(lambda: sorted(local_kube.registered("logs")) == ["logs-0", "logs-1", "logs-2"], 30,
                   "three bookies registered")
        assert asyncio.run(naming("logs-3")) == []
        assert any("decommissioned logs-3" in e["message"] for e in k.events("ScaledDown"))
        eventually(lambda: k.condition("logs", "Ready").get("status") == "True", 30, "Ready at 3 bookies")
        # Scaling up again: logs-3 comes back on a new, empty volume (its retired data could never rejoin).
        k.patch("octavo.io/v1alpha1", "bookieclusters", "logs", {"spec": {"replicas": 4}})
        eventually(lambda: sorted(local_kube.registered("logs")) == ["logs-0", "logs-1", "logs-2", "logs-3"], 60,
                   "logs-3 registered again")
        eventually(lambda: k.condition("logs", "Ready").get("status") == "True"
                   and k.cluster("logs")["status"]["readyReplicas"] == 4, 30, "Ready at 4 bookies")

        async def wide() -> tuple[int, tuple[str, ...]]:  # a ledger over all four: the new one takes its share
            async with Client(etcd, "logs") as client:
                handle = await client.create_ledger(4, 3, 2, password=b"pw")
                await handle.append_many([payload(handle.ledger_id, i) for i in range(8)])
                await handle.close()
                return handle.ledger_id, tuple(handle.metadata.last_ensemble)
        wide_ledger, ensemble = asyncio.run(wide())
        assert "logs-3" in ensemble
        read_back(etcd, "logs", wide_ledger, 8)
    last: dict[int, int] = {}
    for ledger, entry in acked:
        last[ledger] = max(last.get(ledger, -1), entry)
    assert len(last) >= 2, "the writer wrote too little to mean anything"
    for ledger, entry in last.items():
        read_back(etcd, "logs", ledger, entry + 1)


def test_invalid_specs_and_unsafe_scale_downs_are_refused_with_a_reason(local_kube: LocalKube) -> None:
    import asyncio

    from octavo.client import Client

    k, eventually, etcd = local_kube.k, local_kube.eventually, local_kube.etcd
    # Settings the bookie's own rules refuse together (disk_writable_ratio must be below disk_readonly_ratio) and
    # the CRD's schema lets through: each value is within its own bounds, which the CRD checks at apply time.
    # On the emulated API this was an unknown setting (`no_such_setting`); a real API server never hands the
    # operator one: the CRD's structural schema prunes unknown fields of a create that does not ask for strict
    # field validation (kopf's and the kubernetes client's), and kubectl's strict validation refuses it.
    with local_kube.operator():
        local_kube.bookie_cluster("logs", replicas=4, bookie={"disk_writable_ratio": 0.99})
        degraded = eventually(lambda: (c := k.condition("logs", "Degraded")).get("reason") == "InvalidSpec" and c,
                              20, "Degraded/InvalidSpec")
        assert "disk watermarks must satisfy" in degraded["message"] and degraded["status"] == "True"
        assert k.get("apps/v1", "statefulsets", "logs") is None, "an invalid spec was applied"
        assert any("disk watermarks" in e["message"] and e["type"] == "Warning" for e in k.events("InvalidSpec"))
        k.patch("octavo.io/v1alpha1", "bookieclusters", "logs", {"spec": {"bookie": {"disk_writable_ratio": None}}})
        eventually(lambda: k.condition("logs", "Ready").get("status") == "True", 60, "Ready once the spec is fixed")
        assert k.condition("logs", "Degraded")["status"] == "False"

        async def wide_ledger() -> int:
            async with Client(etcd, "logs") as client:
                handle = await client.create_ledger(4, 4, 3, password=b"pw")
                await handle.append_many([payload(handle.ledger_id, i) for i in range(10)])
                await handle.close()
                return handle.ledger_id
        ledger = asyncio.run(wide_ledger())
        # Below minWritableBookies: refused, nothing changes. On the emulated API the operator's spec check refused
        # it (Degraded); the real API server refuses the change itself, by the CRD's CEL rule, before the
        # operator could see it.
        with pytest.raises(AssertionError, match=r"422.*replicas must be at least minWritableBookies"):
            k.patch("octavo.io/v1alpha1", "bookieclusters", "logs", {"spec": {"replicas": 2}})
        assert k.cluster("logs")["spec"]["replicas"] == 4
        # An ensemble of four cannot live on three bookies: the decommission refuses, the StatefulSet stays.
        k.patch("octavo.io/v1alpha1", "bookieclusters", "logs", {"spec": {"replicas": 3}})
        refused = eventually(lambda: [e for e in k.events("ScaleDownRefused") if f"ledger {ledger}" in e["message"]],
                             60, "the scale-down refused")
        assert "needs an ensemble of 4" in refused[0]["message"]
        time.sleep(6)  # a dozen polls: the refusal is said once per change of reason (issue 29), not per poll
        refusals = [e for e in k.events("ScaleDownRefused") if f"ledger {ledger}" in e["message"]]
        assert sum(e.get("count") or 1 for e in refusals) == 1, refusals
        assert sum(e.get("count") or 1 for e in k.events("ScaleDown")) == 1, k.events("ScaleDown")
        ready = k.condition("logs", "Ready")["message"]
        assert ready.startswith("4 of 4 bookies answer (1 being removed)"), ready  # never "4 of 3"
        assert k.get("apps/v1", "statefulsets", "logs")["spec"]["replicas"] == 4
        assert len(local_kube.registered("logs")) == 4
        read_back(etcd, "logs", ledger, 10)


def test_a_killed_bookie_shows_in_the_status_until_its_pod_is_back(local_kube: LocalKube) -> None:
    k, eventually = local_kube.k, local_kube.eventually
    with local_kube.operator():
        local_kube.bookie_cluster("logs", replicas=3)
        eventually(lambda: k.condition("logs", "Ready").get("status") == "True", 60, "Ready")
        local_kube.kill("default", "logs-1")
        degraded = eventually(lambda: (c := k.condition("logs", "Degraded")).get("status") == "True" and c, 20,
                              "Degraded while logs-1 is down")
        assert degraded["reason"] == "BookiesNotAnswering" and "logs-1" in degraded["message"]
        assert k.condition("logs", "Ready")["status"] == "False"
        assert bookie_status(k, "logs")["logs-1"]["mode"] == "unknown"
        eventually(lambda: k.condition("logs", "Ready").get("status") == "True"
                   and k.condition("logs", "Degraded").get("status") == "False", 60, "Ready after the restart")
        assert local_kube.restarts("default", "logs-1") == 1, local_kube.story("default", "logs-1")


def test_a_spec_change_rolls_the_statefulsets_pods_one_at_a_time(local_kube: LocalKube) -> None:
    """A bookie setting changes the ConfigMap, so the pod template's config-hash annotation: the operator deletes
    the pods one at a time (the StatefulSet's updateStrategy is OnDelete) and kube-controller-manager recreates
    each with the new template, never two of them down at once."""
    k, eventually = local_kube.k, local_kube.eventually
    names = ["logs-0", "logs-1", "logs-2"]

    def ready(pod: dict[str, Any]) -> bool:
        return not pod["metadata"].get("deletionTimestamp") and any(
            c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])

    def pods() -> dict[str, dict[str, Any]]:
        return {p["metadata"]["name"]: p for p in k.list("v1", "pods") if p["metadata"]["name"] in names}

    with local_kube.operator():
        local_kube.bookie_cluster("logs", replicas=3)
        eventually(lambda: k.condition("logs", "Ready").get("status") == "True", 60, "Ready")
        before = {name: p["metadata"]["uid"] for name, p in pods().items()}
        assert sorted(before) == names and all(ready(p) for p in pods().values())
        old_hash = k.get("apps/v1", "statefulsets", "logs")["spec"]["template"]["metadata"]["annotations"][
            "octavo.io/config-hash"]
        k.patch("octavo.io/v1alpha1", "bookieclusters", "logs", {"spec": {"bookie": {"gc_interval_ms": 700}}})
        seen: dict[str, list[str]] = {name: [uid] for name, uid in before.items()}
        max_down, down_samples, samples = 0, [], 0
        started = time.monotonic()
        deadline = started + 300
        order: list[tuple[str, float]] = []
        while True:
            now = pods()
            for name, pod in now.items():
                if pod["metadata"]["uid"] != seen[name][-1]:
                    seen[name].append(pod["metadata"]["uid"])
                    order.append((name, round(time.monotonic() - started, 1)))
            down = sorted(name for name in names if name not in now or not ready(now[name]))
            samples += 1
            if len(down) > max_down:
                max_down = len(down)
            if len(down) >= 2:
                down_samples.append(down)
            if all(len(seen[n]) >= 2 for n in names) and not down:
                break
            assert time.monotonic() < deadline, f"not rolled within 300 s: uids {seen}, {k.pod_status()}"
            time.sleep(0.2)
        sts = k.get("apps/v1", "statefulsets", "logs")
        assert sts["spec"]["template"]["metadata"]["annotations"]["octavo.io/config-hash"] != old_hash
        assert not down_samples, f"two or more bookies down at once ({max_down} of 3): {down_samples[:5]}"
        assert max_down == 1, f"no pod seen down in {samples} samples"
        assert {n: len(u) for n, u in seen.items()} == {n: 2 for n in names}, f"replaced more than once: {seen}"
        assert all(seen[n][1] != before[n] for n in names)
        status = eventually(lambda: (s := k.get("apps/v1", "statefulsets", "logs")["status"])
                            and s.get("updatedReplicas") == 3 and s.get("readyReplicas") == 3 and s, 30,
                            "the StatefulSet's status updated")
        # With OnDelete the controller never moves currentRevision; every pod is on the update revision.
        assert {p["metadata"]["labels"]["controller-revision-hash"] for p in pods().values()} == {
            status["updateRevision"]}, status
        eventually(lambda: k.condition("logs", "Ready").get("status") == "True"
                   and k.cluster("logs")["status"]["readyReplicas"] == 3, 60, "Ready after the roll")
        logging.getLogger(__name__).warning("rolled in %d samples, replaced (pod, s): %s, at most %d of 3 bookies "
                                            "down at once", samples, order, max_down)


def _resolves(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:  # not in the hosts file yet
        return ""
