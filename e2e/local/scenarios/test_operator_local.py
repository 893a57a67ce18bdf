"""The operator against the emulated API with real bookies (see conftest.py): what a platform engineer sees."""

from __future__ import annotations

from typing import Any

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
        assert all(b.address.startswith(local_kube.runner.ip_prefix) for b in bookies.values())
        ready = eventually(lambda: k.condition("logs", "Ready").get("status") == "True" and k.cluster("logs"), 60,
                           "Ready")
        status = ready["status"]
        assert status["readyReplicas"] == 3 and status["writableBookies"] == 3
        assert [b["id"] for b in status["bookies"]] == ["logs-0", "logs-1", "logs-2"]
        assert all(b["mode"] == "writable" and b["reachable"] for b in status["bookies"])
        assert status["observedGeneration"] == 1
