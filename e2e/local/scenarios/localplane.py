"""The real local control plane (octavo.cli.kubecontrolplane) and node agent (octavo.cli.kubeagent) as the e2e
scenarios use them: one per test session, shared by the tests, with the namespace `default` emptied between
tests (`reset_namespace`).

The test process itself is a client of the bookies: it reads their advertised addresses from etcd, and those
are the names a pod resolves through its /etc/hosts (`logs-0.logs-bookies.default.svc:3181`), which this
machine's resolver does not know. `private_hosts()` gives the test process a mount namespace of its own with a
private copy of /etc/hosts bind-mounted over the real one, and `HostsSync` keeps the pod network's entries in it
(the same entries the agent writes into every pod's /etc/hosts). Nothing of it reaches the machine's /etc/hosts
or another test run's. It must run while the process has one thread: a mount namespace is a thread's, and the
threads started later (gRPC's resolver threads, subprocesses) inherit it. So the root conftest.py calls
`setup_private_hosts()` from pytest_configure, before collection imports anything (a test module imported
during collection starts threads), when the run includes these scenarios."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import urllib3

CLONE_NEWNS = 0x00020000
HOSTS_SYNC_S = 0.5
NAMESPACE = "default"
# What the control plane keeps in every namespace: not the tests' to delete.
KEPT = {"services": {"kubernetes"}, "configmaps": {"kube-root-ca.crt"}, "serviceaccounts": {"default"}}
RESET_TIMEOUT_S = 90.0


class PrivateHosts:
    def __init__(self, path: Path, original: str) -> None:
        self.path = path
        self.original = original


# What setup_private_hosts() made, or why it could not (a message for the tests' skip).
HOSTS: PrivateHosts | str = "no private /etc/hosts was set up (the root conftest.py does it at pytest_configure)"


def setup_private_hosts() -> PrivateHosts | str:
    """Once per process: private_hosts(), kept in HOSTS. The root conftest.py calls it from pytest_configure,
    before collection imports test modules that start threads."""
    global HOSTS
    if not isinstance(HOSTS, PrivateHosts):
        HOSTS = private_hosts()
    return HOSTS


def private_hosts() -> PrivateHosts | str:
    """Move this (single-threaded) process into a mount namespace of its own whose /etc/hosts is a private
    copy; the reason it could not, as a string, otherwise (not root, threads already running)."""
    if os.geteuid() != 0:
        return "not root"
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        return f"the test process already runs {threads} threads (a mount namespace is per thread)"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        return f"unshare(CLONE_NEWNS): {os.strerror(ctypes.get_errno())}"
    subprocess.run(["mount", "--make-rprivate", "/"], check=True, capture_output=True)
    original = Path("/etc/hosts").read_text()
    path = Path(tempfile.mkdtemp(prefix="octavo-e2e-hosts-")) / "hosts"
    path.write_text(original)
    subprocess.run(["mount", "--bind", str(path), "/etc/hosts"], check=True, capture_output=True)
    return PrivateHosts(path, original)


class HostsSync:
    """Writes the pod network's `*.svc` entries (as a pod in `default` sees them) into the private /etc/hosts
    every HOSTS_SYNC_S, in place (the bind mount keeps the inode)."""

    def __init__(self, hosts: PrivateHosts, agent: Any) -> None:
        self.hosts = hosts
        self.agent = agent
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="e2e-hosts-sync", daemon=True)

    def start(self) -> HostsSync:
        self.write()
        self._thread.start()
        return self

    def write(self) -> None:
        from octavo.cli.kubeagent.network import write_in_place

        pods = self.agent.network.net.hosts_file(NAMESPACE).splitlines()
        entries = [line for line in pods if line and not line.startswith(("#", "127.0.0.1\t", "::1\t"))]
        write_in_place(self.hosts.path, self.hosts.original.rstrip("\n") + "\n# octavo e2e: the pod network\n"
                       + "".join(line + "\n" for line in entries))

    def _main(self) -> None:
        while not self._stop.wait(HOSTS_SYNC_S):
            with contextlib.suppress(OSError):  # the next round writes it
                self.write()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.hosts.path.write_text(self.hosts.original)


class K:
    """A small synchronous client of the real API as the cluster admin (its client certificate), for the tests'
    own reads and writes."""

    def __init__(self, plane: Any) -> None:
        self.url = plane.server
        pki = Path(plane.pki)
        self.http = urllib3.PoolManager(cert_reqs="CERT_REQUIRED", ca_certs=plane.ca_file,
                                        cert_file=str(pki / "admin.crt"), key_file=str(pki / "admin.key"))

    @staticmethod
    def path(api_version: str, plural: str, name: str = "", sub: str = "", namespace: str | None = NAMESPACE) -> str:
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        return f"{base}{f'/namespaces/{namespace}' if namespace else ''}/{plural}" + (f"/{name}" if name else "") + (
            f"/{sub}" if sub else "")

    def _call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        r = self.http.request(method, self.url + path, body=json.dumps(body) if body is not None else None,
                              headers={"Content-Type": content_type}, timeout=30)
        if r.status == 404:
            return None
        if r.status >= 300:
            raise AssertionError(f"{method} {path}: {r.status} {r.data[:300]!r}")
        return json.loads(r.data) if r.data else None

    def get(self, api_version: str, plural: str, name: str) -> Any:
        return self._call("GET", self.path(api_version, plural, name))

    def list(self, api_version: str, plural: str) -> list[Any]:
        return list((self._call("GET", self.path(api_version, plural)) or {}).get("items") or [])

    def create(self, api_version: str, plural: str, obj: dict[str, Any]) -> None:
        self._call("POST", self.path(api_version, plural), obj)

    def patch(self, api_version: str, plural: str, name: str, patch: dict[str, Any], sub: str = "") -> None:
        self._call("PATCH", self.path(api_version, plural, name, sub), patch, "application/merge-patch+json")

    def delete(self, api_version: str, plural: str, name: str, body: dict[str, Any] | None = None) -> None:
        self._call("DELETE", self.path(api_version, plural, name), body)

    def cluster(self, name: str) -> Any:
        return self.get("octavo.io/v1alpha1", "bookieclusters", name)

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        status = (self.cluster(name) or {}).get("status") or {}
        return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})

    def events(self, reason: str = "") -> list[dict[str, Any]]:
        return [e for e in self.list("v1", "events") if not reason or e.get("reason") == reason]

    def pod_status(self) -> dict[str, Any]:
        """pod -> (phase, [(ready, restartCount)]) of every pod in the namespace, for failure messages."""
        return {p["metadata"]["name"]: (p["status"].get("phase"), [
            (c.get("ready"), c.get("restartCount"), list(c.get("state") or {})) for c in
            p["status"].get("containerStatuses") or []]) for p in self.list("v1", "pods")}


# What a test may leave in the namespace, in the order it is deleted: the owners first, so that their
# controllers do not make new pods while the pods go.
RESET_KINDS = [("octavo.io/v1alpha1", "bookieclusters"), ("octavo.io/v1alpha1", "compactionpolicies"),
               ("apps/v1", "deployments"), ("apps/v1", "statefulsets"), ("apps/v1", "replicasets"),
               ("batch/v1", "jobs"), ("v1", "pods"), ("v1", "persistentvolumeclaims"), ("v1", "services"),
               ("v1", "configmaps"), ("v1", "secrets"), ("v1", "serviceaccounts"),
               ("policy/v1", "poddisruptionbudgets"), ("rbac.authorization.k8s.io/v1", "roles"),
               ("rbac.authorization.k8s.io/v1", "rolebindings")]


def reset_namespace(k: K, agent: Any) -> None:
    """Delete what a test left in `default` (its finalizers removed: no operator runs now), pods at once, and
    wait until no pod of the namespace has a process left and no claim is left."""
    deadline = time.monotonic() + RESET_TIMEOUT_S
    while True:
        left = []
        for api_version, plural in RESET_KINDS:
            for obj in k.list(api_version, plural):
                name = obj["metadata"]["name"]
                if name in KEPT.get(plural, ()):
                    continue
                left.append(f"{plural}/{name}")
                if obj["metadata"].get("finalizers"):
                    k.patch(api_version, plural, name, {"metadata": {"finalizers": None}})
                if not obj["metadata"].get("deletionTimestamp") or plural == "pods":
                    k.delete(api_version, plural, name, {"gracePeriodSeconds": 0, "propagationPolicy": "Background"})
        k._call("DELETE", k.path("v1", "events"))  # all at once; the agent may record more as pods go
        with agent._lock:
            running = [f"{w.name} (worker)" for w in agent.workers.values() if w.namespace == NAMESPACE and w.alive()]
        if not left and not running:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the namespace {NAMESPACE} was not emptied within {RESET_TIMEOUT_S}s: "
                                 f"{left + running}")
        time.sleep(0.5)
