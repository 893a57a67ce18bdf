"""The kind e2e: a real Kubernetes (kind), the images built from this checkout and loaded into it, the chart
installed by helm. Runs where kind, kubectl, helm and Docker exist and OCTAVO_E2E_KIND=1 (`make e2e-kind`);
elsewhere every test skips with one line saying what is missing.

    OCTAVO_E2E_KEEP=1      keep the cluster afterwards (kind-down.sh removes it)
    OCTAVO_KIND_CLUSTER=N  use (or make) the kind cluster N instead of octavo-e2e
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
NAMESPACE = "octavo"
RELEASE = "octavo"


def tool(name: str) -> str | None:
    local = ROOT / ".tools" / "bin" / name
    return str(local) if os.access(local, os.X_OK) else shutil.which(name)


def why_not() -> str | None:
    """Why the kind e2e cannot run here (None: it can)."""
    missing = [name for name in ("kind", "docker", "kubectl", "helm") if tool(name) is None]
    if missing:
        return f"kind e2e: {', '.join(missing)} not found (needs kind, kubectl, helm and a Docker engine)"
    if subprocess.run([tool("docker") or "docker", "info"], capture_output=True, timeout=60).returncode != 0:
        return "kind e2e: the docker command is there but no Docker engine answers"
    if os.environ.get("OCTAVO_E2E_KIND") != "1":
        return "kind e2e: kind and Docker are here; run `make e2e-kind` (OCTAVO_E2E_KIND=1) to run these (~15 min)"
    return None


class Kind:
    def __init__(self, name: str) -> None:
        self.name = name
        self.context = f"kind-{name}"
        self.chart = str(ROOT / "charts" / "octavo")

    def run(self, *argv: str, check: bool = True, timeout: float = 600, stdin: str | None = None
            ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, input=stdin)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed ({done.returncode}): {done.stdout[-2000:]}"
                                 f"{done.stderr[-2000:]}")
        return done

    def kubectl(self, *args: str, check: bool = True, timeout: float = 600, stdin: str | None = None
                ) -> subprocess.CompletedProcess[str]:
        return self.run(tool("kubectl") or "kubectl", "--context", self.context, "-n", NAMESPACE, *args,
                        check=check, timeout=timeout, stdin=stdin)

    def kubectl_cluster(self, *args: str) -> subprocess.CompletedProcess[str]:
        """kubectl without a namespace (cluster-scoped objects)."""
        return self.run(tool("kubectl") or "kubectl", "--context", self.context, *args)

    def helm(self, *args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return self.run(tool("helm") or "helm", "--kube-context", self.context, "-n", NAMESPACE, *args, check=check,
                        timeout=timeout)

    def get(self, *what: str) -> Any:
        done = self.kubectl("get", *what, "-o", "json", check=False)
        return json.loads(done.stdout) if done.returncode == 0 else None

    def eventually(self, fn: Callable[[], Any], timeout_s: float, what: str) -> Any:
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = fn()
                if last:
                    return last
            except (KeyError, IndexError, TypeError, AssertionError) as e:
                last = e
            time.sleep(2)
        status = self.kubectl("describe", "bookiecluster", check=False).stdout[-3000:]
        raise AssertionError(f"{what} did not hold within {timeout_s}s (last: {last!r})\n{status}")

    def job(self, name: str, image: str, command: list[str], timeout_s: float = 600, wait: bool = True) -> str:
        """Run a Job with the e2e scripts mounted at /jobs and the cluster's etcd in $OCTAVO_ETCD; its log."""
        manifest = {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"backoffLimit": 0, "template": {"spec": {
                "restartPolicy": "Never",
                "securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
                "volumes": [{"name": "jobs", "configMap": {"name": "octavo-e2e-jobs"}}],
                "containers": [{
                    "name": "job", "image": image, "imagePullPolicy": "Never", "command": command,
                    "volumeMounts": [{"name": "jobs", "mountPath": "/jobs"}],
                    "env": [{"name": "OCTAVO_ETCD", "valueFrom": {"configMapKeyRef": {
                        "name": f"{RELEASE}-etcd-endpoints", "key": "endpoints"}}},
                        {"name": "OCTAVO_CLUSTER", "value": "octavo"}]}]}}}}
        self.kubectl("delete", "job", name, "--ignore-not-found", "--wait")
        self.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
        if not wait:
            return ""
        done = self.kubectl("wait", f"job/{name}", "--for=condition=complete", f"--timeout={int(timeout_s)}s",
                            check=False, timeout=timeout_s + 30)
        log = self.kubectl("logs", f"job/{name}", check=False).stdout
        assert done.returncode == 0, f"job {name} did not complete: {done.stderr}\n{log[-3000:]}"
        return log


@pytest.fixture(scope="session")
def kind() -> Iterator[Kind]:
    reason = why_not()
    if reason:
        pytest.skip(reason)
    cluster = Kind(os.environ.get("OCTAVO_KIND_CLUSTER", "octavo-e2e"))
    made = False
    if cluster.name not in cluster.run(tool("kind") or "kind", "get", "clusters").stdout.split():
        cluster.run(tool("kind") or "kind", "create", "cluster", "--name", cluster.name, "--config",
                    str(HERE / "kind-config.yaml"), "--wait", "300s", timeout=900)
        made = True
    try:
        for target, tag in (("octavo", "octavo:dev"), ("spark", "octavo-spark:dev")):
            cluster.run(tool("docker") or "docker", "build", "-t", tag, "--target", target, str(ROOT), timeout=1800)
        cluster.run(tool("kind") or "kind", "load", "docker-image", "octavo:dev", "octavo-spark:dev", "--name",
                    cluster.name, timeout=900)
        cluster.run(tool("kubectl") or "kubectl", "--context", cluster.context, "create", "namespace", NAMESPACE,
                    check=False)
        cluster.helm("upgrade", "--install", RELEASE, str(ROOT / "charts" / "octavo"), "-f",
                     str(HERE / "values-kind.yaml"), "--wait", "--timeout", "10m")
        cluster.kubectl("wait", "bookiecluster/octavo", "--for=condition=Ready", "--timeout=600s", timeout=660)
        cluster.kubectl("create", "configmap", "octavo-e2e-jobs",
                        f"--from-file={ROOT / 'e2e' / 'jobs' / 'ledger_job.py'}",
                        f"--from-file={ROOT / 'e2e' / 'jobs' / 'spark_roundtrip.py'}", check=False)
        yield cluster
    finally:
        if made and not os.environ.get("OCTAVO_E2E_KEEP"):
            cluster.run(tool("kind") or "kind", "delete", "cluster", "--name", cluster.name, check=False)
