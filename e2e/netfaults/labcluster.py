"""An Octavo cluster on the lab's network: etcd members and bookies, each in a namespace of its own, reached by
their lab addresses (the observer leg lets the tests' own process reach them too)."""

from __future__ import annotations

import os
import sys
import time
import urllib.request
from pathlib import Path
from subprocess import Popen

from netlab import NetLab

from octavo.cli.localcluster import etcd_binary

ETCD_PORT, PEER_PORT, BOOKIE_PORT = 2379, 2380, 3181
START_TIMEOUT_S = 60.0


class LabCluster:
    def __init__(self, lab: NetLab, root: str | Path, etcd_members: int = 1, bookies: int = 3,
                 cluster: str = "lab", registration_ttl_s: int = 3, bookie_args: tuple[str, ...] = ()) -> None:
        self.lab = lab
        self.root = Path(root)
        self.cluster = cluster
        self.registration_ttl_s = registration_ttl_s
        self.bookie_args = bookie_args
        self.etcd_names = [f"e{i}" for i in range(etcd_members)]
        self.bookie_names = [f"b{i}" for i in range(bookies)]
        for name in [*self.etcd_names, *self.bookie_names]:
            lab.add_host(name)
        self.procs: dict[str, Popen[bytes]] = {}

    @property
    def etcd_endpoints(self) -> str:
        return ",".join(f"{self.lab.hosts[e].address}:{ETCD_PORT}" for e in self.etcd_names)

    def address(self, host: str) -> str:
        return self.lab.hosts[host].address

    # -- etcd ------------------------------------------------------------------------------------------------
    def start_etcd(self, name: str, state: str = "new") -> None:
        a = self.address(name)
        initial = ",".join(f"{e}=http://{self.address(e)}:{PEER_PORT}" for e in self.etcd_names)
        argv = [etcd_binary(), "--name", name, "--data-dir", str(self.root / name),
                "--listen-client-urls", f"http://{a}:{ETCD_PORT}", "--advertise-client-urls", f"http://{a}:{ETCD_PORT}",
                "--listen-peer-urls", f"http://{a}:{PEER_PORT}", "--initial-advertise-peer-urls",
                f"http://{a}:{PEER_PORT}", "--initial-cluster", initial, "--initial-cluster-state", state,
                "--initial-cluster-token", f"{self.lab.tag}-etcd", "--log-level", "warn"]
        self.procs[name] = self.lab.start(name, argv, self.root / f"{name}.log")

    def etcd_healthy(self, name: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.address(name)}:{ETCD_PORT}/health", timeout=1) as r:
                return b'"health":"true"' in r.read()
        except OSError:
            return False

    # -- bookies ---------------------------------------------------------------------------------------------
    def ready_file(self, name: str) -> Path:
        return self.root / f"{name}.ready"

    def start_bookie(self, name: str) -> None:
        ready = self.ready_file(name)
        ready.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "octavo.cli.main", "node", "--data-dir", str(self.root / name),
                "--host", self.address(name), "--port", str(BOOKIE_PORT), "--etcd", self.etcd_endpoints,
                "--cluster", self.cluster, "--bookie-id", name, "--registration-ttl-s", str(self.registration_ttl_s),
                "--ready-file", str(ready), *self.bookie_args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("OCTAVO_")}
        self.procs[name] = self.lab.start(name, argv, self.root / f"{name}.log", env=env)

    def start(self) -> LabCluster:
        for name in self.etcd_names:
            self.start_etcd(name)
        self._wait(lambda: all(self.etcd_healthy(e) for e in self.etcd_names), "etcd healthy")
        for name in self.bookie_names:
            self.start_bookie(name)
        self._wait(lambda: all(self.ready_file(b).exists() for b in self.bookie_names), "bookies serving")
        return self

    def _wait(self, predicate: object, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not predicate():  # type: ignore[operator]
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    log = (self.root / f"{name}.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"{name} exited with {proc.returncode} before {what}:\n{log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not within {START_TIMEOUT_S}s")
            time.sleep(0.1)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def log_tail(self, name: str, chars: int = 3000) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")[-chars:]
