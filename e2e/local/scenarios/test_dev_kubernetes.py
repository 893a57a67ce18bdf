"""`octavo dev up --kubernetes` / `octavo dev down`, as a user runs them: real processes, the CLI's own output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def octavo(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "octavo.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout_s)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_dev_up_kubernetes_runs_the_operator_on_a_local_api_and_dev_down_stops_everything(tmp_path: Path) -> None:
    root = tmp_path / "dev"
    up = octavo("dev", "up", "--kubernetes", "--data-dir", str(root), "--bookies", "3", "--detach", "--json")
    assert up.returncode == 0, up.stderr + (root / "kubernetes-host.log").read_text()
    state = json.loads(up.stdout)
    try:
        assert state["kind"] == "kubernetes" and state["ready"]
        assert [b["id"] for b in state["bookies"]] == ["default-0", "default-1", "default-2"]
        kubeconfig = Path(state["kubeconfig"]).read_text()
        assert state["kubernetes"] in kubeconfig
        url = state["kubernetes"] + "/apis/octavo.io/v1alpha1/namespaces/default/bookieclusters/default"
        with urllib.request.urlopen(url, timeout=10) as r:
            cluster = json.loads(r.read())
        ready = next(c for c in cluster["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", cluster["status"]
        assert all(alive(int(state[k])) for k in ("host_pid", "operator_pid", "etcd_pid"))
        # The other commands find the cluster through --data-dir: a ledger written and read back.
        from octavo.client import SyncClient

        with SyncClient(state["etcd"], cluster=state["cluster"]) as client, client.create_ledger(3, 3, 2) as handle:
            handle.append_many([b"entry %d" % i for i in range(10)])
            ledger = handle.ledger_id
        out = octavo("ledger", "read", str(ledger), "--data-dir", str(root))
        assert out.returncode == 0 and out.stdout.count("entry ") == 10, out.stderr
        again = octavo("dev", "up", "--kubernetes", "--data-dir", str(root))
        assert again.returncode != 0 and "already runs" in again.stderr
    finally:
        down = octavo("dev", "down", "--data-dir", str(root))
    assert down.returncode == 0 and "stopped" in down.stdout, down.stderr
    deadline = time.monotonic() + 30
    while any(alive(int(state[k])) for k in ("host_pid", "operator_pid", "etcd_pid")):
        assert time.monotonic() < deadline, "dev down left processes running"
        time.sleep(0.2)
    pods = subprocess.run(["pgrep", "-f", str(root / "kube")], capture_output=True, text=True).stdout.split()
    assert not pods, f"bookie processes left running: {pods}"
