"""The chart on a real Kubernetes (kind): what a platform engineer does after `helm install`. In file order,
on one installed release; the last test uninstalls it. Skipped here (no kind, no Docker engine): the same
scenarios run on the emulated API in e2e/local/scenarios/test_chart_local.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytestmark = pytest.mark.kind

Kind = Any  # conftest.Kind


def bookies(kind: Kind) -> dict[str, Any]:
    body = kind.get("bookiecluster", "octavo") or {}
    return {b["id"]: b for b in (body.get("status") or {}).get("bookies") or []}


def ready(kind: Kind, replicas: int) -> bool:
    body = kind.get("bookiecluster", "octavo") or {}
    status = body.get("status") or {}
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    return conditions.get("Ready") == "True" and status.get("readyReplicas") == replicas


def test_the_install_is_ready_and_helm_test_passes(kind: Kind) -> None:
    assert ready(kind, 4)
    deployment = kind.get("deployment", "octavo-operator")
    assert deployment["status"].get("readyReplicas") == 1
    etcd = kind.get("statefulset", "octavo-etcd")
    assert etcd["status"].get("readyReplicas") == 3
    done = kind.helm("test", "octavo", "--logs")
    assert "ok: ledger" in done.stdout, done.stdout


def test_a_spark_job_writes_and_reads_a_dataset(kind: Kind) -> None:
    log = kind.job("spark-roundtrip", "octavo-spark:dev",
                   ["python", "/jobs/spark_roundtrip.py", "--rows", "20000"], timeout_s=900)
    assert "read them back identical" in log, log


def test_a_killed_bookie_pod_loses_nothing_acknowledged(kind: Kind) -> None:
    kind.job("writer", "octavo:dev", ["python", "/jobs/ledger_job.py", "write", "60"], wait=False)
    kind.eventually(lambda: kind.kubectl("logs", "job/writer", check=False).stdout.count("\n") > 20, 120,
                    "the writer writing")
    kind.kubectl("delete", "pod", "octavo-1", "--grace-period=0", "--force")
    done = kind.kubectl("wait", "job/writer", "--for=condition=complete", "--timeout=300s", check=False, timeout=330)
    log = kind.kubectl("logs", "job/writer").stdout
    assert done.returncode == 0, log[-3000:]
    acked: dict[str, int] = {}
    for line in log.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            acked[str(record["ledger"])] = record["acked"]
    assert len(acked) >= 2
    verified = kind.job("verify", "octavo:dev", ["python", "/jobs/ledger_job.py", "verify", json.dumps(acked)])
    assert verified.startswith("ok: ")
    kind.eventually(lambda: ready(kind, 4), 300, "the killed bookie back")


def test_a_full_volume_goes_read_only_and_back_after_cleanup(kind: Kind) -> None:
    # The bookies' disk_capacity_bytes is 1 GiB (values-kind.yaml): 900 MB of filler passes readOnlyRatio 0.8.
    kind.kubectl("exec", "octavo-2", "--", "sh", "-c", "head -c 900000000 /dev/zero > /data/filler")
    forced = kind.eventually(lambda: bookies(kind).get("octavo-2", {}).get("mode") == "read-only" and bookies(kind),
                             120, "octavo-2 read-only")
    assert forced["octavo-2"]["diskUsageRatio"] >= 0.8
    kind.kubectl("exec", "octavo-2", "--", "rm", "/data/filler")
    kind.eventually(lambda: bookies(kind)["octavo-2"]["mode"] == "writable", 120, "octavo-2 writable again")


def test_scale_down_and_up(kind: Kind) -> None:
    kind.helm("upgrade", "octavo", kind.chart, "--reuse-values", "--set", "bookieCluster.replicas=3",
              "--wait")
    kind.eventually(lambda: kind.get("statefulset", "octavo")["spec"]["replicas"] == 3, 600,
                    "the StatefulSet scaled to 3 after decommission")
    kind.eventually(lambda: kind.get("pvc", "data-octavo-3") is None, 120, "octavo-3's volume deleted")
    kind.helm("upgrade", "octavo", kind.chart, "--reuse-values", "--set", "bookieCluster.replicas=4",
              "--wait")
    kind.eventually(lambda: ready(kind, 4), 600, "4 bookies again")
    done = kind.helm("test", "octavo", "--logs")
    assert "ok: ledger" in done.stdout


def acknowledged(log: str) -> dict[str, int]:
    acked: dict[str, int] = {}
    for line in log.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            acked[str(record["ledger"])] = record["acked"]
    return acked


def test_a_settings_roll_and_an_image_roll_under_a_writer_lose_nothing(kind: Kind) -> None:
    """Issue 37, as e2e/local/scenarios/test_roll.py on the local control plane: the operator restarts one
    bookie at a time; every acknowledged entry is read back, and found on every bookie of its segment."""
    def completed() -> list[dict[str, Any]]:
        events = kind.get("events", "--field-selector", "involvedObject.name=octavo,reason=RollingUpdateComplete")
        return list((events or {}).get("items") or [])

    kind.job("roller", "octavo:dev", ["python", "/jobs/ledger_job.py", "write", "300"], wait=False)
    kind.eventually(lambda: kind.kubectl("logs", "job/roller", check=False).stdout.count("\n") > 20, 120,
                    "the writer writing")
    # A bookie setting, then the image (the same image by another reference: kind has no registry).
    for patch in ({"spec": {"bookie": {"gc_interval_ms": 45000}}}, {"spec": {"image": "docker.io/library/octavo:dev"}}):
        before = len(completed())
        kind.kubectl("patch", "bookiecluster", "octavo", "--type=merge", "-p", json.dumps(patch))
        kind.eventually(lambda before=before: len(completed()) > before, 900, "the roll complete")
        assert kind.get("bookiecluster", "octavo")["status"]["observedGeneration"] == kind.get(
            "bookiecluster", "octavo")["metadata"]["generation"]
    done = kind.kubectl("wait", "job/roller", "--for=condition=complete", "--timeout=600s", check=False, timeout=630)
    log = kind.kubectl("logs", "job/roller").stdout
    assert done.returncode == 0, log[-3000:]
    acked = acknowledged(log)
    assert len(acked) >= 2
    assert kind.job("roll-verify", "octavo:dev", ["python", "/jobs/ledger_job.py", "verify",
                                                  json.dumps(acked)]).startswith("ok: ")
    assert kind.job("roll-replicas", "octavo:dev", ["python", "/jobs/ledger_job.py", "replicas",
                                                    json.dumps(acked)]).startswith("ok: ")
    restarts = kind.get("events", "--field-selector", "involvedObject.name=octavo,reason=RollingUpdate")
    messages = [e["message"] for e in (restarts or {}).get("items") or []]
    assert sum(m.startswith("Restarting bookie octavo-") for m in messages) >= 8, messages
    kind.eventually(lambda: ready(kind, 4), 300, "Ready after the rolls")


def test_uninstall_leaves_no_orphan(kind: Kind) -> None:
    kind.helm("uninstall", "octavo", "--wait", "--timeout", "10m")
    # Everything the chart and the operator made carries app.kubernetes.io/name=octavo.
    kind.eventually(lambda: (kind.get("pods", "-l", "app.kubernetes.io/name=octavo") or {}).get("items") == [], 300,
                    "every pod gone")
    for what in ("bookieclusters", "compactionpolicies", "statefulsets", "deployments", "services", "configmaps",
                 "poddisruptionbudgets", "pvc", "jobs", "roles", "rolebindings", "serviceaccounts"):
        left = kind.get(what, "-l", "app.kubernetes.io/name=octavo") or {"items": []}
        assert left["items"] == [], f"{what} left: {[i['metadata']['name'] for i in left['items']]}"
    claims = kind.get("pvc") or {"items": []}  # deleteVolumesOnUninstall is on in values-kind.yaml
    kind.eventually(lambda: (kind.get("pvc") or {"items": []})["items"] == [], 120, f"volumes deleted ({claims})")
    for what in ("clusterroles", "clusterrolebindings"):
        left = json.loads(kind.kubectl_cluster("get", what, "-l", "app.kubernetes.io/name=octavo", "-o",
                                               "json").stdout)
        assert left["items"] == [], f"{what} left"
