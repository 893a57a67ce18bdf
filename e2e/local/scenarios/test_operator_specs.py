"""Specs a platform engineer gets wrong, and deleting what they made, on the real control plane (issue 29 items
3 and 5, issue 37 item 4): every fault at once, no Progressing=True while invalid, the closest known name for a
mistyped setting (where the API server lets one through: kubectl's strict field validation refuses it first);
settings out of their bounds refused by the API server at apply time; deletions that complete."""

from __future__ import annotations

import time
from typing import Any

LocalKube = Any  # the local_kube fixture (conftest.py)
API = "octavo.io/v1alpha1"


def test_an_invalid_spec_is_reported_whole_and_the_cluster_and_policies_delete(local_kube: LocalKube) -> None:
    k, eventually = local_kube.k, local_kube.eventually
    with local_kube.operator():
        local_kube.policy("nightly", {"windows": [{"schedule": "0 2 * * *", "duration": "2h"}]})
        local_kube.policy("unused", {"windows": []})
        # The API server takes these (each fits the CRD's schema and bounds); the operator's checks of how the
        # settings go together refuse them, all in one message.
        k.create(API, "bookieclusters", {
            "apiVersion": API, "kind": "BookieCluster", "metadata": {"name": "bad"},
            "spec": {"replicas": 3, "image": "octavo:dev", "storage": {"size": "1Gi"},
                     "etcd": {"endpoints": local_kube.etcd}, "compactionPolicyRef": {"name": "nightly"},
                     "bookie": {"disk_writable_ratio": 0.99, "write_cache_entries_max": 10,
                                "compaction_minor_threshold": 0.9}}})
        error = eventually(lambda: (k.cluster("bad").get("status") or {}).get("specError"), 30, "the spec error")
        for part in ("3 problems: ", "spec.bookie: write_cache_entries_max (10) must be at least twice",
                     "spec.bookie: compaction thresholds must satisfy", "spec.bookie: disk watermarks must satisfy"):
            assert part in error, (part, error)
        assert k.condition("bad", "Degraded")["reason"] == "InvalidSpec"
        assert k.condition("bad", "Progressing")["status"] == "False", k.condition("bad", "Progressing")
        assert k.get("apps/v1", "statefulsets", "bad") is None, "an invalid spec applied something"
        warnings = [e for e in k.events("InvalidSpec") if e["involvedObject"]["name"] == "bad"]
        assert len(warnings) == 1 and sum(e.get("count", 1) for e in warnings) == 1, warnings

        for plural, name in (("compactionpolicies", "unused"), ("compactionpolicies", "nightly"),
                             ("bookieclusters", "bad")):
            k.delete(API, plural, name)
            # kopf holds a finalizer on objects with timers and releases it once their timer stopped; a timer
            # mid-run at the delete was checked again 60 s later (a CI run saw a policy take over 30 s) before
            # the operator set kopf's cancellation_polling to 1 s.
            eventually(lambda plural=plural, name=name: k.get(API, plural, name) is None, 30,
                       f"{plural}/{name} deleted")


def test_a_setting_out_of_its_bounds_is_refused_at_apply_time_naming_it(local_kube: LocalKube) -> None:
    """The CRD carries the bookie's bounds (issue 37: a 1 PiB index map once crash-looped a bookie)."""
    import pytest

    spec = {"image": "octavo:dev", "storage": {"size": "1Gi"}, "etcd": {"endpoints": local_kube.etcd},
            "bookie": {"index_map_size_bytes": 1 << 50}}
    with pytest.raises(AssertionError, match=r"422.*spec.bookie.index_map_size_bytes"):
        local_kube.k.create(API, "bookieclusters", {"apiVersion": API, "kind": "BookieCluster",
                                                    "metadata": {"name": "huge"}, "spec": spec})


def test_a_roll_whose_bookie_does_not_start_halts_and_reverting_the_spec_resumes_it(local_kube: LocalKube) -> None:
    """Issue 37 item 5: a restarted bookie not Ready in time halts the roll with an event naming the cause; the
    revert un-sticks it without anyone deleting a pod."""
    k, eventually = local_kube.k, local_kube.eventually

    def events(reason: str) -> list[str]:
        return [e["message"] for e in k.events(reason) if e["involvedObject"]["name"] == "halt"]

    def uids() -> dict[str, str]:
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in k.list("v1", "pods")}

    with local_kube.operator(roll_ready_timeout_s=20.0):
        local_kube.bookie_cluster("halt", replicas=3)
        eventually(lambda: k.condition("halt", "Ready").get("status") == "True", 180, "Ready")
        before = uids()
        # An image whose entry point is not octavo: the restarted bookie never serves.
        k.patch(API, "bookieclusters", "halt", {"spec": {"image": "busybox:1.36"}})
        halted = eventually(lambda: events("RollingUpdateHalted"), 240, "the roll halted")
        assert len(halted) == 1 and "bookie halt-2 was not Ready within 20 s of its restart" in halted[0], halted
        assert "revert" in halted[0]
        degraded = eventually(lambda: (c := k.condition("halt", "Degraded")).get("reason") == "RollingUpdateHalted"
                              and c, 30, "Degraded with the halt")  # the status is written after the event
        assert degraded["status"] == "True" and "halt-2" in degraded["message"], degraded
        time.sleep(5)  # halted: nothing else is restarted
        now = uids()
        assert (now["halt-0"], now["halt-1"]) == (before["halt-0"], before["halt-1"]), "a roll went on past a halt"
        assert len(events("RollingUpdateHalted")) == 1, "the halt was reported more than once"
        k.patch(API, "bookieclusters", "halt", {"spec": {"image": "octavo:dev"}})
        eventually(lambda: events("RollingUpdateComplete"), 240, "the roll completed after the revert")
        eventually(lambda: k.condition("halt", "Ready").get("status") == "True"
                   and k.condition("halt", "Degraded").get("status") == "False", 120, "Ready after the revert")
        after = uids()
        assert (after["halt-0"], after["halt-1"]) == (before["halt-0"], before["halt-1"])
        assert after["halt-2"] != now["halt-2"], "the stuck pod was not replaced"


def test_a_refused_spec_keeps_the_cluster_running_and_watched_on_the_last_valid_one(local_kube: LocalKube) -> None:
    """Issue 37 item 4: an invalid spec never switches protection off. The status says the new spec is refused and
    why, reports the bookies as they are, and the operator keeps polling them (a killed bookie is seen)."""
    k, eventually = local_kube.k, local_kube.eventually
    with local_kube.operator():
        local_kube.bookie_cluster("keep", replicas=3)
        eventually(lambda: k.condition("keep", "Ready").get("status") == "True", 180, "Ready")
        template = k.get("apps/v1", "statefulsets", "keep")["spec"]["template"]
        k.patch(API, "bookieclusters", "keep", {"spec": {"bookie": {"disk_writable_ratio": 0.99}}})
        status = eventually(lambda: (s := k.cluster("keep")["status"]).get("specError") and s, 30, "the refusal")
        assert "disk watermarks must satisfy" in status["specError"]
        assert [b["reachable"] for b in status["bookies"]] == [True, True, True], status["bookies"]
        assert status["appliedSpec"]["bookie"] == {"disk_check_interval_ms": 200, "gc_interval_ms": 500}
        assert k.condition("keep", "Degraded")["reason"] == "InvalidSpec"
        assert k.condition("keep", "Ready")["status"] == "True", k.condition("keep", "Ready")
        assert k.condition("keep", "Progressing")["status"] == "False", k.condition("keep", "Progressing")
        local_kube.kill("default", "keep-1")  # still watched: the operator sees it go and come back
        eventually(lambda: any(b["id"] == "keep-1" and not b["reachable"] for b in k.cluster("keep")["status"][
            "bookies"]), 30, "keep-1 seen not answering while the spec is refused")
        eventually(lambda: all(b["reachable"] for b in k.cluster("keep")["status"]["bookies"]), 90,
                   "keep-1 seen back")
        assert k.get("apps/v1", "statefulsets", "keep")["spec"]["template"] == template, "the refused spec was applied"
        assert k.cluster("keep")["status"]["specError"], "the refusal went away by itself"
