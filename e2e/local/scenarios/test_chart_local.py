"""The Helm chart's scenarios on this machine: the real helm installs, tests, upgrades and uninstalls the chart on
the local control plane (conftest.py, helmlocal.py); the operator runs as the chart's Deployment pod and the
bookies as its StatefulSet's pods under the node agent; etcd as the release's own StatefulSet (3 members under
the agent) in the main scenario, elsewhere a real etcd on the pod network's gateway address (the chart's
external-etcd mode; over TLS in the TLS scenario). The same scenarios as the kind e2e (e2e/kind/) except pulling
images and filling a volume at the kernel level (a bookie's disk_capacity_bytes setting stands in for a small
volume)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from octavo.client import Client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helmlocal import ROOT, LocalRelease, helm_binary
from localplane import KEPT

LocalKube = Any  # the local_kube fixture (conftest.py)
NAMESPACE = "default"  # conftest.NAMESPACE

# Under CI=true the skip fails the run (conftest.py): `make test` installs helm first.
pytestmark = pytest.mark.skipif(helm_binary() is None, reason="no helm binary (run `make helm`)")
CLUSTER = "octavo"
V1 = "octavo.io/v1alpha1"


def values(external_etcd: str, **over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "etcd": {"enabled": False},
        "externalEtcd": {"endpoints": external_etcd},
        "image": {"repository": "octavo", "tag": "dev"},
        "operator": {"pollIntervalSeconds": 0.5, "adminTimeoutSeconds": 2},
        "bookieCluster": {"replicas": 3, "storage": {"size": "1Gi"}, "resources": {},
                          "bookie": {"disk_check_interval_ms": 200, "gc_interval_ms": 500}},
        "compactionPolicy": {"windows": []},
        "tests": {"entries": 50},
    }
    for key, value in over.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return base


def payload(ledger: int, entry: int) -> bytes:
    return f"{ledger}:{entry}:".encode() + bytes([entry % 251]) * 200


async def read_all(etcd: str, ledger: int, count: int) -> None:
    async with Client(etcd, CLUSTER) as client:
        reader = await client.open_ledger(ledger, password=b"pw")
        assert reader.last_entry_id >= count - 1, (ledger, reader.last_entry_id, count)
        got = [e.data async for e in reader.read(0, count - 1)]
        assert got == [payload(ledger, i) for i in range(count)], f"ledger {ledger} differs"


def bookies(local_kube: LocalKube) -> dict[str, Any]:
    status = (local_kube.k.cluster(CLUSTER) or {}).get("status") or {}
    return {b["id"]: b for b in status.get("bookies") or []}


def registered(etcd: str) -> list[str]:
    async def read() -> list[str]:
        async with Client(etcd, CLUSTER) as client:
            return sorted(await client.bookies(refresh=True))
    return asyncio.run(read())


def ready(local_kube: LocalKube, replicas: int, etcd: str = "") -> bool:
    """Ready with `replicas` bookies, each registered in `etcd` (the external one by default)."""
    cluster = local_kube.k.cluster(CLUSTER) or {}
    return (local_kube.k.condition(CLUSTER, "Ready").get("status") == "True"
            and (cluster.get("status") or {}).get("readyReplicas") == replicas
            and len(registered(etcd or local_kube.etcd)) == replicas)


@pytest.fixture
def release(local_kube: LocalKube, tmp_path: Path) -> Any:
    made: list[LocalRelease] = []
    # No CRDs before the install: `helm install` creates them from the chart's crds/ (conftest.py puts them back
    # after the test; Helm itself never deletes them).
    local_kube.plane.kubectl("delete", "--wait=true", "--ignore-not-found", "-f", str(ROOT / "charts/octavo/crds"))

    def make(vals: dict[str, Any]) -> LocalRelease:
        rel = LocalRelease(local_kube.kubeconfig, local_kube.agent, tmp_path / "release", vals, namespace=NAMESPACE)
        made.append(rel)
        return rel
    yield make
    for rel in made:
        rel.stop()


def test_install_test_kill_fill_scale_and_uninstall(local_kube: LocalKube, release: Any) -> None:
    k = local_kube.k
    # The release's own etcd: the chart's StatefulSet of 3 members, run by the agent like the bookies.
    rel: LocalRelease = release(values(
        "", etcd={"enabled": True, "replicas": 3, "storage": {"size": "1Gi"}, "resources": {},
                  "deleteVolumesOnUninstall": True},
        bookieCluster={"replicas": 4, "storage": {"size": "1Gi"}, "resources": {}, "deleteVolumesOnUninstall": True,
                       "bookie": {"disk_check_interval_ms": 200, "gc_interval_ms": 500,
                                  "disk_capacity_bytes": 8 << 20, "log_size_bytes_max": 256 * 1024,
                                  "batch_bytes_max": 128 * 1024, "entry_size_bytes_max": 64 * 1024}},
        compactionPolicy={"windows": [], "warnRatio": 0.45, "readOnlyRatio": 0.5, "writableRatio": 0.25,
                          "outsideWindow": "compact"}))

    def eventually(fn: Any, timeout_s: float, what: str) -> Any:
        try:
            return local_kube.eventually(fn, timeout_s, what)
        except AssertionError as e:
            raise AssertionError(f"{e}\noperator log:\n{rel.operator_log()}") from None

    # helm install: the operator (the Deployment's pod) makes the BookieCluster's bookies.
    rel.install()
    assert k.get("apps/v1", "deployments", f"{CLUSTER}-operator")["status"]["availableReplicas"] == 1
    etcd = k.get("v1", "configmaps", f"{CLUSTER}-etcd-endpoints")["data"]["endpoints"]
    assert etcd.startswith(f"{CLUSTER}-etcd-0.") and etcd.count(",") == 2, etcd
    eventually(lambda: ready(local_kube, 4, etcd), 120, "4 bookies ready and registered")
    statefulset = k.get("apps/v1", "statefulsets", CLUSTER)
    assert statefulset["spec"]["template"]["spec"]["containers"][0]["image"] == "octavo:dev"
    assert k.get("policy/v1", "poddisruptionbudgets", CLUSTER) is not None
    assert k.cluster(CLUSTER)["spec"]["compactionPolicyRef"] == {"name": "octavo"}

    # helm test: the test pod writes a ledger through the client and reads it back.
    tested = rel.test()
    assert tested.returncode == 0 and tested.stdout.startswith("ok: ledger "), tested.stdout + tested.stderr
    assert k.get("v1", "pods", "octavo-test-write-read")["status"]["phase"] == "Succeeded"  # kept, as Helm does

    # A bookie pod killed under a writer: every acknowledged entry reads back.
    acked: dict[int, int] = {}
    stop = threading.Event()
    failures: list[BaseException] = []

    async def write() -> None:
        async with Client(etcd, CLUSTER) as client:
            while not stop.is_set():
                handle = await client.create_ledger(3, 3, 2, password=b"pw")
                for batch in range(10):
                    await handle.append_many([payload(handle.ledger_id, batch * 20 + i) for i in range(20)])
                    acked[handle.ledger_id] = batch * 20 + 20
                await handle.close()

    def writer() -> None:
        try:
            asyncio.run(write())
        except BaseException as e:  # reported below
            failures.append(e)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        eventually(lambda: len(acked) >= 2, 30, "the writer writing")
        local_kube.kill(NAMESPACE, f"{CLUSTER}-1")
        written = len(acked)
        eventually(lambda: len(acked) >= written + 3, 60, "the writer going on after the kill")
    finally:
        stop.set()
        thread.join(60)
    assert not failures, failures
    for ledger, count in acked.items():
        asyncio.run(read_all(etcd, ledger, count))
    eventually(lambda: ready(local_kube, 4, etcd), 60, "the killed bookie back")

    # A bookie's disk fills past readOnlyRatio: forced read-only; writable again once the space comes back.
    async def fill() -> int:
        async with Client(etcd, CLUSTER) as client:
            handle = await client.create_ledger(1, 1, 1, password=b"pw")
            for _ in range(50):
                await handle.append_many([bytes([i]) * 1000 for i in range(100)])  # 5 MB of an 8 MB "disk"
            await handle.close()
            return handle.ledger_id

    full = asyncio.run(fill())
    forced = eventually(lambda: (s := bookies(local_kube)) and any(b.get("forcedByOperator") for b in s.values())
                        and s, 30, "a bookie forced read-only")
    victim = max(forced, key=lambda b: forced[b]["diskUsageRatio"])
    assert forced[victim]["mode"] == "read-only"
    assert any(e["message"].startswith(f"bookie {victim}:") for e in k.events("ForceReadOnly"))

    async def delete(ledger: int) -> None:
        async with Client(etcd, CLUSTER) as client:
            await client.delete_ledger(ledger)

    asyncio.run(delete(full))
    eventually(lambda: bookies(local_kube)[victim]["mode"] == "writable", 60, f"{victim} writable again")

    # helm upgrade to 3 bookies: the highest ordinal is decommissioned first; back to 4.
    rel.upgrade({"bookieCluster": {"replicas": 3}})
    eventually(lambda: k.get("apps/v1", "statefulsets", CLUSTER)["spec"]["replicas"] == 3, 120,
               "the StatefulSet scaled to 3")
    eventually(lambda: registered(etcd) == [f"{CLUSTER}-{i}" for i in range(3)], 30,
               "three bookies registered")
    for ledger, count in acked.items():
        asyncio.run(read_all(etcd, ledger, count))
    rel.upgrade({"bookieCluster": {"replicas": 4}})
    eventually(lambda: ready(local_kube, 4, etcd), 90, "4 bookies again")

    # helm uninstall: the hook deletes the cluster and policy while the operator runs, then everything goes.
    volumes = [Path(pv["spec"]["local"]["path"]) for pv in k._call("GET", "/api/v1/persistentvolumes")["items"]
               if pv["spec"]["claimRef"]["name"].startswith(f"data-{CLUSTER}-")]
    assert len(volumes) == 4 + 3, volumes  # the bookies' and the etcd members'
    hooked = rel.uninstall()
    assert hooked.returncode == 0, hooked.stdout + hooked.stderr
    assert "bookieclusters/octavo in default: deleted (the operator released it)" in hooked.stdout, hooked.stdout
    assert "deleted PersistentVolumeClaim default/data-octavo-0" in hooked.stdout
    assert "deleted Pod default/octavo-test-write-read" in hooked.stdout
    assert k.get("apps/v1", "deployments", f"{CLUSTER}-operator") is None

    def leftovers() -> dict[str, list[str]]:
        out = {}
        for api_version, plural in (("apps/v1", "statefulsets"), ("apps/v1", "deployments"), ("v1", "services"),
                                    ("v1", "configmaps"), ("v1", "pods"), ("v1", "persistentvolumeclaims"),
                                    ("v1", "serviceaccounts"), ("policy/v1", "poddisruptionbudgets"),
                                    (V1, "bookieclusters"), (V1, "compactionpolicies"),
                                    ("rbac.authorization.k8s.io/v1", "roles"),
                                    ("rbac.authorization.k8s.io/v1", "rolebindings"), ("v1", "secrets")):
            # What the control plane keeps in every namespace is not the release's.
            names = [o["metadata"]["name"] for o in k.list(api_version, plural)
                     if o["metadata"]["name"] not in KEPT.get(plural, ())]
            if names:
                out[plural] = names
        # Cluster-wide: the release's own (a real API server has its system roles, and the volumes the agent
        # provisioned for other tests' claims).
        for plural in ("clusterroles", "clusterrolebindings"):
            listed = k._call("GET", f"/apis/rbac.authorization.k8s.io/v1/{plural}") or {}
            mine = [o["metadata"]["name"] for o in listed.get("items") or []
                    if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/instance") == CLUSTER]
            if mine:
                out[plural] = mine
        volumes = k._call("GET", "/api/v1/persistentvolumes") or {}
        claimed = [o["metadata"]["name"] for o in volumes.get("items") or []
                   if ((o["spec"].get("claimRef") or {}).get("name") or "").startswith(f"data-{CLUSTER}-")]
        if claimed:
            out["persistentvolumes"] = claimed
        return out

    try:
        eventually(lambda: leftovers() == {}, 30, "nothing left after uninstall")
    except AssertionError as e:
        raise AssertionError(f"left after uninstall: {leftovers()}\n{e}") from None
    eventually(lambda: not any(v.exists() for v in volumes), 30, "the volume directories deleted")


def test_uninstall_removes_the_finalizer_when_no_operator_runs(local_kube: LocalKube) -> None:
    """A BookieCluster holding the operator's finalizer, and no operator: the hook does not hang."""
    k = local_kube.k
    k.create(V1, "bookieclusters", {"apiVersion": V1, "kind": "BookieCluster", "metadata": {
        "name": "orphan", "namespace": NAMESPACE, "finalizers": ["octavo.io/finalizer", "example.com/other"]},
        "spec": {"image": "x", "storage": {"size": "1Gi"}, "etcd": {"endpoints": local_kube.etcd}}})
    done = subprocess.run([sys.executable, "-m", "octavo.cli.main", "operator", "uninstall", "--namespace", NAMESPACE,
                           "--bookie-cluster", "orphan", "--compaction-policy", "absent", "--timeout-s", "1",
                           "--kubeconfig", local_kube.kubeconfig], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "did not release it within 1 s" in done.stdout and "compactionpolicies/absent" in done.stdout
    left = k.cluster("orphan")
    # Only our finalizer is removed; another controller's stays (and holds the object, as it should).
    assert left is None or left["metadata"]["finalizers"] == ["example.com/other"]
    bad = subprocess.run([sys.executable, "-m", "octavo.cli.main", "operator", "uninstall", "--namespace", NAMESPACE,
                          "--timeout-s", "0", "--kubeconfig", local_kube.kubeconfig], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "--timeout-s must be in" in bad.stderr


@pytest.mark.spark
# A Spark job (a JVM, local[2]) beside the control plane and three bookies on two cores: install, readiness and the
# job took 5-6 minutes at load average 25, so this test has more than the suite's 300 s.
@pytest.mark.timeout(720)
def test_a_spark_job_writes_and_reads_a_dataset_through_the_installed_cluster(local_kube: LocalKube,
                                                                              release: Any) -> None:
    rel: LocalRelease = release(values(local_kube.etcd))
    rel.install()
    local_kube.eventually(lambda: ready(local_kube, 3), 90, "3 bookies ready")
    config_map = local_kube.k.get("v1", "configmaps", "octavo-etcd-endpoints")
    env = {**os.environ, "OCTAVO_ETCD": config_map["data"]["endpoints"], "OCTAVO_CLUSTER": CLUSTER}
    done = subprocess.run([sys.executable, str(ROOT / "e2e" / "jobs" / "spark_roundtrip.py"), "--rows", "5000"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "read them back identical" in done.stdout


def test_a_tls_release_with_its_own_secrets_and_an_external_etcd_over_tls(tls_kube: Any, tmp_path: Path) -> None:
    """tls.enabled with the user's Secrets (as cert-manager would write them) and externalEtcd.tls: the operator
    from the rendered Deployment reaches the bookies with its mounted certificate, the bookies reach etcd over
    TLS, `helm test` writes and reads with the client certificate; a client without a certificate is refused."""
    import base64

    kube, ca = tls_kube
    k = kube.k

    def secret(name: str, common_name: str, sans: list[str]) -> None:
        cert, key = ca.issue(common_name, sans=sans)
        data = {"tls.crt": cert, "tls.key": key, "ca.crt": ca.pem}
        k.create("v1", "secrets", {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                                   "metadata": {"name": name, "namespace": NAMESPACE},
                                   "data": {key_: base64.b64encode(v).decode() for key_, v in data.items()}})

    secret("bookie-tls", CLUSTER, [f"*.{CLUSTER}-bookies.{NAMESPACE}.svc", f"{CLUSTER}.{NAMESPACE}.svc"])
    secret("operator-tls", "octavo-operator", [])
    secret("client-tls", "octavo-client", [])
    secret("etcd-client-tls", "octavo-etcd-user", [])
    rel = LocalRelease(kube.kubeconfig, kube.agent, tmp_path / "release", values(
        kube.etcd, externalEtcd={"endpoints": kube.etcd, "tls": {"secretName": "etcd-client-tls"}},
        tls={"enabled": True, "certManager": {"enabled": False}, "bookieSecret": "bookie-tls",
             "operatorSecret": "operator-tls", "clientSecret": "client-tls", "metrics": True}), namespace=NAMESPACE)
    try:
        _tls_release(kube, ca, rel, tmp_path)
    finally:
        rel.stop()


def _tls_release(kube: Any, ca: Any, rel: LocalRelease, tmp_path: Path) -> None:
    import grpc

    from octavo.meta.tls import TlsFiles
    from octavo.node.testing import BookieConnection

    k = kube.k
    rel.install()

    def tls_ready() -> bool:
        return (k.condition(CLUSTER, "Ready").get("status") == "True"
                and ((k.cluster(CLUSTER) or {}).get("status") or {}).get("readyReplicas") == 3)
    try:
        kube.eventually(tls_ready, 90, "a TLS cluster Ready through the operator's certificate")
    except AssertionError as e:
        raise AssertionError(f"{e}\noperator log:\n{rel.operator_log()}") from None
    tested = rel.test()
    assert tested.returncode == 0 and tested.stdout.startswith("ok: ledger "), tested.stdout + tested.stderr
    address = kube.address(NAMESPACE, f"{CLUSTER}-0")
    client = ca.write(tmp_path / "pki", "c", common_name="someone", sans=[])
    with BookieConnection(address, tls=TlsFiles(ca_file=client.ca_file)) as conn, \
            pytest.raises(grpc.RpcError) as refused:
        conn.status()
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    with BookieConnection(address, tls=TlsFiles(client.cert_file, client.key_file, client.ca_file)) as conn, \
            pytest.raises(grpc.RpcError) as denied:
        conn.status()  # a certificate of the CA, but not the operator's: no admin
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    rel.uninstall()
