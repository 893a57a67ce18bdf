"""`octavo dev up --kubernetes` / `octavo dev down`, as a user runs them: the real control plane (`make kube`), the
node agent's pods, the CLI's own output, kubectl as written. Needs the binaries `make kube` builds and root; the
refusals without them are checked here too. Under CI=true a skip fails the run (conftest.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from octavo.cli.kubecontrolplane import ControlPlaneError, find_binaries, pinned_version

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[3]
# The kubectl `make helm` installs (the control plane's minor), else the one on PATH.
KUBECTL = str(REPO / ".tools" / "bin" / "kubectl") if (REPO / ".tools" / "bin" / "kubectl").exists() else (
    shutil.which("kubectl") or "kubectl")
# A bridge of its own: a developer's `dev up --kubernetes` may hold the default one on this machine.
BRIDGE = f"okd-{os.getpid() % 100000}"
ENV = {**os.environ, "OCTAVO_DEV_BRIDGE": BRIDGE}


def octavo(*args: str, timeout_s: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "octavo.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout_s, env=env or ENV)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def eventually(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            result = fn()
            if result:
                return result
            last = result
        except (KeyError, IndexError, TypeError, ValueError, AssertionError) as e:
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout_s}s (last: {last!r})")
        time.sleep(0.3)


def leftovers(pids: list[int]) -> list[str]:
    """What of a cluster still exists: its processes, the bridge, the pods' namespaces, the nftables table."""
    found = [f"process {p}" for p in pids if alive(p)]
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        found.append(f"bridge {BRIDGE}")
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"netns {line.split()[0]}" for line in netns.splitlines() if line.startswith(BRIDGE + "-")]
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    table = "octavo_" + BRIDGE.replace("-", "_")
    found += [f"nft {line}" for line in tables.splitlines() if line.split()[-1:] == [table]]
    return found


def state_pids(state: dict[str, Any]) -> list[int]:
    return [int(p) for p in [state.get("host_pid"), *(state.get("pids") or {}).values()] if p]


# -- where it cannot run --------------------------------------------------------------------------------------
def test_dev_up_kubernetes_without_the_binaries_names_make_kube(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the root check comes first")
    out = octavo("dev", "up", "--kubernetes", "--data-dir", str(tmp_path / "dev"),
                 env={**ENV, "OCTAVO_KUBE_BIN_DIR": str(tmp_path / "no-binaries")})
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "make kube" in lines[0] and "kube-apiserver" in lines[0], out.stderr
    assert not (tmp_path / "dev" / "cluster.json").exists()


def test_dev_up_kubernetes_not_as_root_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from octavo.cli.main import main

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    code = main(["dev", "up", "--kubernetes", "--data-dir", str(tmp_path / "dev")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0
    assert len(err) == 1 and "needs root" in err[0] and "sudo" in err[0], err


# -- a running cluster ----------------------------------------------------------------------------------------
class Dev:
    def __init__(self, root: Path, state: dict[str, Any]) -> None:
        self.root = root
        self.state = state

    def kubectl(self, *args: str, check: bool = True) -> str:
        out = subprocess.run([KUBECTL, *args], capture_output=True, text=True, timeout=60,
                             env={**ENV, "KUBECONFIG": self.state["kubeconfig"]})
        if check:
            assert out.returncode == 0, f"kubectl {' '.join(args)}: {out.stderr}"
        return out.stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    try:
        find_binaries()
    except ControlPlaneError as e:
        pytest.skip(str(e))
    if os.geteuid() != 0:
        pytest.skip("`dev up --kubernetes` needs root (the node agent's network and mount namespaces)")
    root = tmp_path_factory.mktemp("dev-kube") / "dev"
    started = time.monotonic()
    up = octavo("dev", "up", "--kubernetes", "--data-dir", str(root), "--bookies", "3", "--detach", "--json")
    host_log = (root / "kubernetes-host.log").read_text() if (root / "kubernetes-host.log").exists() else ""
    assert up.returncode == 0, up.stderr + host_log
    state = json.loads(up.stdout)
    print(f"dev up --kubernetes: Ready in {time.monotonic() - started:.1f}s as the user waits "
          f"({state['startup_s']}s inside the host)")
    try:
        yield Dev(root, state)
    finally:
        if state.get("host_pid") and alive(int(state["host_pid"])):
            octavo("dev", "down", "--data-dir", str(root))


def test_dev_up_kubernetes_runs_a_ready_bookie_cluster_on_the_real_control_plane(dev: Dev) -> None:
    state = dev.state
    assert state["kind"] == "kubernetes" and state["ready"] and state["bridge"] == BRIDGE
    assert state["version"] == pinned_version()
    assert [b["id"] for b in state["bookies"]] == ["default-0", "default-1", "default-2"]
    for b in state["bookies"]:
        assert not b["address"].startswith("127.") and b["node"].startswith("node-")
        assert Path(b["data_dir"]).is_dir() and str(dev.root / "agent" / "volumes") in b["data_dir"]
    assert all(alive(p) for p in state_pids(state)), state["pids"]
    assert set(state["pids"]) == {"kube-etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                                  "etcd", "operator"}
    assert state["kubernetes"] in Path(state["kubeconfig"]).read_text()
    version = json.loads(dev.kubectl("version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"] == pinned_version(), version  # the real one, not k3s's
    cluster = dev.get("bookiecluster", "default")
    ready = next(c for c in cluster["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", cluster["status"]
    # Octavo's metadata etcd is reachable from the host through --data-dir (the bookies registered there).
    ls = octavo("ledger", "ls", "--data-dir", str(dev.root))
    assert ls.returncode == 0, ls.stdout + ls.stderr
    again = octavo("dev", "up", "--kubernetes", "--data-dir", str(dev.root))
    assert again.returncode != 0 and "already runs" in again.stderr, again.stderr


def test_kubectl_works_as_written(dev: Dev) -> None:
    got = dev.kubectl("get", "bookieclusters,pods,pvc,events")
    for expected in ("bookiecluster.octavo.io/default", "WRITABLE", "DISK-MAX",  # the CRD's printer columns
                     "pod/default-0", "pod/default-2", "Running",
                     "persistentvolumeclaim/data-default-1", "Bound", "standard",
                     "SuccessfulCreate", "Scheduled", "Started"):
        assert expected in got, f"{expected!r} not in:\n{got}"
    described = dev.kubectl("describe", "bookiecluster")
    for expected in ("Name:         default", "Kind:         BookieCluster", "Conditions:", "Events:",
                     "octavo-operator"):
        assert expected in described, f"{expected!r} not in:\n{described}"
    logs = dev.kubectl("logs", "default-1")
    assert "bookie default-1 serving on 0.0.0.0:3181" in logs, logs
    explained = dev.kubectl("explain", "bookiecluster.spec")
    assert "KIND:       BookieCluster" in explained and "replicas" in explained and "FIELDS:" in explained, explained
    refused = subprocess.run([KUBECTL, "apply", "-f", "-"], capture_output=True, text=True, timeout=60,
                             env={**ENV, "KUBECONFIG": dev.state["kubeconfig"]}, input=json.dumps(
                                 {"apiVersion": "octavo.io/v1alpha1", "kind": "BookieCluster",
                                  "metadata": {"name": "typo"}, "spec": {"replcas": 3}}))
    assert refused.returncode != 0 and "replcas" in refused.stderr, refused.stderr  # the server's validation


def test_a_killed_bookie_process_is_restarted(dev: Dev) -> None:
    pod = dev.get("pod", "default-2")
    status = pod["status"]["containerStatuses"][0]
    pid = int(status["containerID"].removeprefix("octavo://"))
    assert "node" in Path(f"/proc/{pid}/cmdline").read_text().split("\0"), "not the bookie's process"
    os.kill(pid, signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        s = dev.get("pod", "default-2")["status"]["containerStatuses"][0]
        return s if s["restartCount"] == status["restartCount"] + 1 and s["ready"] else None

    now = eventually(restarted, 90, "default-2 restarted and Ready")
    assert now["containerID"] != status["containerID"]
    assert now["lastState"]["terminated"]["exitCode"] != 0
    assert alive(int(now["containerID"].removeprefix("octavo://")))
    eventually(lambda: next(c["status"] == "True" for c in dev.get("bookiecluster", "default")["status"]["conditions"]
                            if c["type"] == "Ready"), 60, "the BookieCluster Ready again")


def test_dev_down_stops_everything_and_leaves_nothing(dev: Dev) -> None:
    pods = [int(s["containerID"].removeprefix("octavo://")) for p in dev.get("pods")["items"]
            for s in p["status"]["containerStatuses"] if s.get("containerID")]
    running = leftovers([])
    assert len(pods) == 3 and f"bridge {BRIDGE}" in running, running  # while it runs
    assert sum(item.startswith(f"netns {BRIDGE}-") for item in running) == 3, running
    down = octavo("dev", "down", "--data-dir", str(dev.root))
    assert down.returncode == 0 and down.stdout.strip() == "stopped", down.stdout + down.stderr
    eventually(lambda: not leftovers(state_pids(dev.state) + pods), 30, "nothing left after dev down")
    assert not subprocess.run(["pgrep", "-f", str(dev.root)], capture_output=True, text=True).stdout.split()
    again = octavo("dev", "up", "--kubernetes", "--data-dir", str(dev.root))
    assert again.returncode != 0 and "rm -rf" in again.stderr, again.stderr


def test_ctrl_c_during_dev_up_stops_what_it_started(dev: Dev, tmp_path: Path) -> None:
    """Interrupted while the node agent starts: the control plane, the operator and the agent's network go."""
    root = tmp_path / "dev"
    proc = subprocess.Popen([sys.executable, "-m", "octavo.cli.main", "dev", "up", "--kubernetes", "--data-dir",
                             str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "starting the node agent" in line:
            break
    state = json.loads((root / "cluster.json").read_text())
    pids = state_pids(state)
    assert {"kube-apiserver", "operator"} <= set(state["pids"]), (state, seen)
    time.sleep(1.0)  # into the agent's start
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "interrupted" in err, "".join(seen) + err
    assert not leftovers(pids), leftovers(pids)
    again = octavo("dev", "up", "--kubernetes", "--data-dir", str(root))
    assert again.returncode != 0 and "rm -rf" in again.stderr and "already runs" not in again.stderr
