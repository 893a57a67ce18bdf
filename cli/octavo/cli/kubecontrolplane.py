"""A real Kubernetes control plane on this machine: its own etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, built from k8s.io/kubernetes by `make kube` (tools/build-kube.sh), each a process with its own
log file under ROOT/logs. For `octavo dev up --kubernetes` and the e2e tests (docs/kubernetes.md).

    plane = KubeControlPlane(root).start()      # ready in seconds once built
    plane.kubeconfig                            # ROOT/kubeconfig: the cluster admin (system:masters)
    plane.stop()

What it sets up, as kubeadm would on one host:
- a throwaway PKI under ROOT/pki: a cluster CA, the API server's serving certificate, client certificates for
  the admin, the controller manager, the scheduler, the API server's client of the kubelets, and the nodes
  (`node_credentials`), and the service-account signing key;
- kube-apiserver on 127.0.0.1 with RBAC and Node authorization, the default admission plugins (and
  NodeRestriction), service accounts, and the service range SERVICE_CIDR; the `kubernetes` Service points at
  `advertise_address` (etcd and the other components stay on loopback);
- kube-controller-manager with every default controller (StatefulSet, garbage collector, namespace, PV binder,
  node lifecycle, endpoints, service accounts and their tokens...), signing service-account tokens;
- kube-scheduler.
Its etcd is separate from Octavo's metadata etcd, as in production. Nodes come from a node agent
(octavo.cli.kubeagent), not from here.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from octavo.cli.certs import CertificateAuthority
from octavo.cli.localcluster import EtcdProcess, free_port

SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
CLUSTER_DOMAIN = "cluster.local"
START_TIMEOUT_S = 120.0
STOP_GRACE_S = 10.0
COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
ENV_BIN_DIR = "OCTAVO_KUBE_BIN_DIR"


class ControlPlaneError(RuntimeError):
    """The control plane could not be found, built or started; the message says which part and why."""


def pinned_version(repo: Path | None = None) -> str:
    """The k8s.io/kubernetes version tools/kube/go.mod pins (what `make kube` builds)."""
    go_mod = (repo or _repo_root()) / "tools" / "kube" / "go.mod"
    try:
        match = re.search(r"^\s*k8s\.io/kubernetes (v[0-9][0-9.]*)", go_mod.read_text(), re.MULTILINE)
    except OSError:
        match = None
    if match is None:
        raise ControlPlaneError(f"no k8s.io/kubernetes version in {go_mod}")
    return match.group(1)


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def binaries_dir() -> Path:
    """Where the control plane's binaries are: $OCTAVO_KUBE_BIN_DIR, or what `make kube` built."""
    if os.environ.get(ENV_BIN_DIR):
        return Path(os.environ[ENV_BIN_DIR])
    return _repo_root() / ".tools" / "kube" / pinned_version()


def find_binaries() -> dict[str, str]:
    """Each component's binary; ControlPlaneError naming `make kube` when one is missing."""
    where = binaries_dir()
    found = {}
    for name in COMPONENTS:
        path = where / name
        if not os.access(path, os.X_OK):
            raise ControlPlaneError(f"{name} is not built in {where}: run `make kube` (tools/build-kube.sh builds "
                                    f"the Kubernetes control plane from the Go module proxy), or set {ENV_BIN_DIR}")
        found[name] = str(path)
    return found


@dataclass(frozen=True)
class Credentials:
    """A client certificate of the cluster CA, and the kubeconfig that uses it."""

    cert_file: str
    key_file: str
    kubeconfig: str


class KubeControlPlane:
    def __init__(self, root: str | Path, advertise_address: str = "", apiserver_port: int = 0) -> None:
        self.root = Path(root).resolve()
        self.pki = self.root / "pki"
        self.logs = self.root / "logs"
        self.advertise_address = advertise_address
        self.apiserver_port = apiserver_port or free_port()
        self.etcd = EtcdProcess(str(self.root / "etcd"), name="kube-etcd")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._ca: CertificateAuthority | None = None

    # -- addresses and files ----------------------------------------------------------------------------
    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def kubeconfig(self) -> str:
        return str(self.root / "kubeconfig")

    @property
    def ca_file(self) -> str:
        return str(self.pki / "ca.crt")

    def log_file(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    # -- PKI ----------------------------------------------------------------------------------------------
    def _write_pki(self) -> None:
        self._ca = ca = CertificateAuthority("octavo-kubernetes-ca")
        ca.write_ca(self.pki)
        (self.pki / "ca.key").write_bytes(ca.key.private_bytes(serialization.Encoding.PEM,
                                                               serialization.PrivateFormat.PKCS8,
                                                               serialization.NoEncryption()))
        os.chmod(self.pki / "ca.key", 0o600)
        sans = ["localhost", "127.0.0.1", KUBERNETES_SERVICE_IP, "kubernetes", "kubernetes.default",
                "kubernetes.default.svc", f"kubernetes.default.svc.{CLUSTER_DOMAIN}"]
        if self.advertise_address:
            sans.append(self.advertise_address)
        ca.write(self.pki, "apiserver", "kube-apiserver", sans=sans, client=False)
        ca.write(self.pki, "apiserver-kubelet-client", "kube-apiserver-kubelet-client", sans=(), server=False,
                 organization="system:masters")
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (self.pki / "sa.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                            serialization.PrivateFormat.PKCS8,
                                                            serialization.NoEncryption()))
        os.chmod(self.pki / "sa.key", 0o600)
        (self.pki / "sa.pub").write_bytes(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        self.credentials("admin", "kubernetes-admin", "system:masters", self.kubeconfig)
        self.credentials("controller-manager", "system:kube-controller-manager")
        self.credentials("scheduler", "system:kube-scheduler")

    def credentials(self, name: str, user: str, group: str = "", kubeconfig: str = "") -> Credentials:
        """A client certificate for `user` (in `group`) and a kubeconfig using it (ROOT/<name>.kubeconfig)."""
        if self._ca is None:
            raise ControlPlaneError("the control plane's CA exists only once start() has run")
        issued = self._ca.write(self.pki, name, user, sans=(), server=False, organization=group)
        path = kubeconfig or str(self.root / f"{name}.kubeconfig")
        write_kubeconfig(path, self.server, self.ca_file, issued.cert_file, issued.key_file, user)
        return Credentials(issued.cert_file, issued.key_file, path)

    def node_credentials(self, node: str) -> Credentials:
        """What a kubelet (the node agent) of `node` authenticates with: system:node:<node> in system:nodes,
        which the Node authorizer and NodeRestriction confine to that node's objects."""
        return self.credentials(f"node-{node}", f"system:node:{node}", "system:nodes")

    def serving_certificate(self, name: str, sans: list[str]) -> tuple[str, str]:
        """A server certificate of the cluster CA (the node agent's kubelet endpoint)."""
        if self._ca is None:
            raise ControlPlaneError("the control plane's CA exists only once start() has run")
        issued = self._ca.write(self.pki, name, name, sans=sans, client=False)
        return issued.cert_file, issued.key_file

    # -- processes ----------------------------------------------------------------------------------------
    def start(self, timeout_s: float = START_TIMEOUT_S) -> KubeControlPlane:
        binaries = find_binaries()
        self.root.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        try:
            self._write_pki()
            self.etcd.start()
            deadline = time.monotonic() + timeout_s
            self._spawn("kube-apiserver", binaries["kube-apiserver"], self._apiserver_args())
            self._wait_ready("kube-apiserver", deadline)
            self._spawn("kube-controller-manager", binaries["kube-controller-manager"], self._controller_args())
            self._spawn("kube-scheduler", binaries["kube-scheduler"], self._scheduler_args())
            self._wait_controllers(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _apiserver_args(self) -> list[str]:
        p = self.pki
        args = [
            f"--etcd-servers=http://{self.etcd.endpoint}", "--bind-address=127.0.0.1",
            f"--secure-port={self.apiserver_port}", f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--client-ca-file={p / 'ca.crt'}", f"--tls-cert-file={p / 'apiserver.crt'}",
            f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
            f"--service-account-issuer=https://kubernetes.default.svc.{CLUSTER_DOMAIN}",
            f"--service-account-key-file={p / 'sa.pub'}", f"--service-account-signing-key-file={p / 'sa.key'}",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true", "--profiling=false", "--kubelet-preferred-address-types=InternalIP",
            "--event-ttl=1h",
        ]
        if self.advertise_address:
            args.append(f"--advertise-address={self.advertise_address}")
        else:  # a loopback address may not be an endpoint: no `kubernetes` Service endpoints then
            args.append("--endpoint-reconciler-type=none")
        return args

    def _controller_args(self) -> list[str]:
        p = self.pki
        kubeconfig = str(self.root / "controller-manager.kubeconfig")
        return [
            f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            "--leader-elect=false", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={p / 'sa.key'}", f"--root-ca-file={p / 'ca.crt'}",
            f"--cluster-signing-cert-file={p / 'ca.crt'}", f"--cluster-signing-key-file={p / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--cluster-name=octavo", "--controllers=*",
            "--node-monitor-grace-period=20s", "--profiling=false",
        ]

    def _scheduler_args(self) -> list[str]:
        kubeconfig = str(self.root / "scheduler.kubeconfig")
        return [f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}", "--leader-elect=false", "--profiling=false"]

    def _spawn(self, name: str, binary: str, args: list[str]) -> None:
        log = open(self.log_file(name), "ab")  # noqa: SIM115 - the child keeps it
        try:
            self.procs[name] = subprocess.Popen([binary, *args], stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise ControlPlaneError(f"{name} exited with {proc.returncode}: {self._tail(name)}")

    def _tail(self, name: str, lines: int = 15) -> str:
        try:
            return " | ".join(self.log_file(name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _wait_ready(self, name: str, deadline: float) -> None:
        while True:
            self._check_alive()
            try:
                if self.get("/readyz") == "ok":
                    return
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"{name} was not ready in time: {self._tail(name)}")
            time.sleep(0.2)

    def _wait_controllers(self, deadline: float) -> None:
        """Until the controller manager has made the default namespace's service account (its controllers run)."""
        while True:
            self._check_alive()
            try:
                if self.get("/api/v1/namespaces/default/serviceaccounts/default"):
                    return
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"kube-controller-manager did not start its controllers in time: "
                                        f"{self._tail('kube-controller-manager')}")
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM every component, SIGKILL what is left after STOP_GRACE_S, then the etcd."""
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()
        self.etcd.stop()

    def __enter__(self) -> KubeControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the API as admin ---------------------------------------------------------------------------------
    def _context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_file)
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def get(self, path: str) -> Any:
        """GET `path` as the cluster admin: JSON decoded, or the text of a plain answer (/readyz)."""
        try:
            with urllib.request.urlopen(self.server + path, context=self._context(), timeout=5) as response:
                body = response.read()
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise
        try:
            return json.loads(body)
        except ValueError:
            return body.decode(errors="replace").strip()

    def kubectl(self, *args: str, check: bool = True, input_text: str | None = None,
                timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        """Run kubectl (the one `make helm` installs into .tools/bin, of the control plane's minor version, else
        the one on $PATH) against this control plane as the admin."""
        pinned = _repo_root() / ".tools" / "bin" / "kubectl"
        kubectl = str(pinned) if os.access(pinned, os.X_OK) else (shutil.which("kubectl") or str(pinned))
        out = subprocess.run([kubectl, f"--kubeconfig={self.kubeconfig}", *args], capture_output=True, text=True,
                             input=input_text, timeout=timeout_s, check=False)
        if check and out.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} failed: {out.stderr.strip()}")
        return out


def write_kubeconfig(path: str, server: str, ca_file: str, cert_file: str, key_file: str, user: str) -> None:
    """A kubeconfig with the certificates embedded (a copy of the file works anywhere)."""

    def b64(file: str) -> str:
        return base64.b64encode(Path(file).read_bytes()).decode()

    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "octavo",
        "clusters": [{"name": "octavo", "cluster": {"server": server, "certificate-authority-data": b64(ca_file)}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(cert_file),
                                          "client-key-data": b64(key_file)}}],
        "contexts": [{"name": "octavo", "context": {"cluster": "octavo", "user": user, "namespace": "default"}}],
    }
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(config, f, indent=2)
    os.replace(tmp, path)
