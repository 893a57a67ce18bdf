"""`octavo dev up --kubernetes`: the operator on a local, emulated Kubernetes with real bookies.

One host process (this one, or a background one with --detach) runs the emulated API (kmock with an API
server's bookkeeping) and the pod runner (real `octavo node` processes on loopback addresses, a directory per
volume); beside it run a real etcd and `octavo operator run` as processes of their own. It creates a
CompactionPolicy `default` and a BookieCluster, waits until the bookies serve, and writes DIR/kubeconfig
(`export KUBECONFIG=...` for kubectl or the kubernetes client) and DIR/cluster.json (so `octavo ... --data-dir
DIR` finds etcd). `octavo dev down --data-dir DIR` stops everything. The API's objects live in memory: a new
`dev up` creates them again, and the bookies find their data again in the same volumes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from argparse import Namespace
from pathlib import Path
from typing import Any

from octavo.cli.common import DEV_STATE_FILE, EXIT_OK, CliError, print_json

READY_TIMEOUT_S = 180.0
OPERATOR_POLL_INTERVAL_S = 5.0
HOST_LOG = "kubernetes-host.log"


def _write_state(root: Path, state: dict[str, Any]) -> None:
    tmp = root / (DEV_STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, root / DEV_STATE_FILE)


def _read_state(root: Path) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads((root / DEV_STATE_FILE).read_text())
        return state
    except (OSError, ValueError):
        return {}


def _request(url: str, method: str = "GET", body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read() or b"null")


def example_resources(cluster: str, bookies: int, etcd: str) -> list[tuple[str, dict[str, Any]]]:
    """The CompactionPolicy and BookieCluster `dev up --kubernetes` creates (path under the API, object)."""
    base = "/apis/octavo.io/v1alpha1/namespaces/default"
    policy = {"apiVersion": "octavo.io/v1alpha1", "kind": "CompactionPolicy",
              "metadata": {"name": "default", "namespace": "default"},
              "spec": {"windows": [{"schedule": "0 2 * * *", "duration": "2h", "timeZone": "UTC"}],
                       "maxConcurrentBookies": 1, "outsideWindow": "compact"}}
    spec = {"replicas": bookies, "minWritableBookies": min(3, bookies), "image": "octavo:dev",
            "storage": {"size": "10Gi"}, "etcd": {"endpoints": etcd}, "compactionPolicyRef": {"name": "default"},
            "bookie": {"log_size_bytes_max": 64 << 20}}
    cluster_body = {"apiVersion": "octavo.io/v1alpha1", "kind": "BookieCluster",
                    "metadata": {"name": cluster, "namespace": "default"}, "spec": spec}
    return [(f"{base}/compactionpolicies", policy), (f"{base}/bookieclusters", cluster_body)]


def cmd_up(args: Namespace) -> int:
    root = Path(args.data_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if args.bookies < 1:
        raise CliError("--bookies must be at least 1")
    previous = _read_state(root)
    host = previous.get("host_pid")
    if host and _alive(int(host)):
        raise CliError(f"a cluster already runs on {root} (pid {host}); `octavo dev down --data-dir "
                       f"{args.data_dir}` first")
    if args.detach:
        return _detach(args, root)
    return _host(args, root)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def _detach(args: Namespace, root: Path) -> int:
    """Run the host in the background and return once it reports the cluster ready (or failed)."""
    with contextlib.suppress(FileNotFoundError):
        (root / DEV_STATE_FILE).unlink()
    argv = [sys.executable, "-m", "octavo.cli.main", "dev", "up", "--kubernetes", "--data-dir", str(root),
            "--bookies", str(args.bookies), "--cluster", args.cluster, "--json"]
    with open(root / HOST_LOG, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + READY_TIMEOUT_S + 30
    while True:
        state = _read_state(root)
        if state.get("ready"):
            break
        if proc.poll() is not None:
            raise CliError(f"the local Kubernetes did not start ({_describe(proc.returncode)}); see "
                           f"{root / HOST_LOG}")
        if time.monotonic() > deadline:
            proc.terminate()
            raise CliError(f"the local Kubernetes was not ready within {READY_TIMEOUT_S:.0f}s; see {root / HOST_LOG}")
        time.sleep(0.2)
    _print(args, state)
    if not args.json:
        print(f"detached: stop with `octavo dev down --data-dir {args.data_dir}`")
    return EXIT_OK


def _describe(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by signal {-code}"
    return f"exit code {code}"


def _print(args: Namespace, state: dict[str, Any]) -> None:
    if args.json:
        print_json(state)
        return
    print(f"kubernetes  {state['kubernetes']} (emulated)   export KUBECONFIG={state['kubeconfig']}")
    print(f"etcd        {state['etcd']}")
    print(f"operator    pid {state['operator_pid']}, log {state['operator_log']}")
    for b in state["bookies"]:
        print(f"bookie      {b['id']:12} {b['address']:21} data {b['data_dir']}")
    print(f"cluster     BookieCluster {state['cluster']} and CompactionPolicy default in namespace default; "
          f"`octavo ledger ls --data-dir {args.data_dir}` and the other commands reach it with --data-dir")
    sys.stdout.flush()


def _host(args: Namespace, root: Path) -> int:
    from octavo.cli.localcluster import EtcdProcess, free_port
    from octavo.localk8s.apiserver import ApiServer
    from octavo.localk8s.podrunner import PodRunner

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    etcd = EtcdProcess(str(root / "etcd"), new_session=True)
    api = ApiServer(kubeconfig=str(root / "kubeconfig"))
    runner = PodRunner("", str(root / "kube"))
    operator: subprocess.Popen[bytes] | None = None
    try:
        endpoint = etcd.start()
        api.start()
        runner.url = api.url
        runner.start()
        operator_log = root / "operator.log"
        with open(operator_log, "ab") as log:
            operator = subprocess.Popen(
                [sys.executable, "-m", "octavo.cli.main", "operator", "run", "--kubeconfig", api.kubeconfig,
                 "--poll-interval-s", str(OPERATOR_POLL_INTERVAL_S), "--liveness", f"127.0.0.1:{free_port()}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        for path, body in example_resources(args.cluster, args.bookies, endpoint):
            _request(api.url + path, "POST", body)
        bookies = _wait_ready(api.url, args.cluster, args.bookies, runner, operator, stop)
        state = {"kind": "kubernetes", "ready": True, "host_pid": os.getpid(), "kubernetes": api.url,
                 "kubeconfig": api.kubeconfig, "etcd": endpoint, "etcd_pid": etcd.proc.pid if etcd.proc else None,
                 "cluster": args.cluster, "operator_pid": operator.pid, "operator_log": str(operator_log),
                 "bookies": bookies, "pids": []}
        _write_state(root, state)
        _print(args, state)
        if not args.json:
            print("running: Ctrl-C (or SIGTERM) stops everything cleanly")
            sys.stdout.flush()
        while not stop.wait(1.0):
            if operator.poll() is not None:
                print(f"note: the operator stopped ({_describe(operator.returncode)}); see {operator_log}",
                      file=sys.stderr)
                break
            runner.check()
    finally:
        if operator is not None and operator.poll() is None:
            operator.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                operator.wait(30)
        runner.stop()
        api.stop()
        etcd.stop()
        state = _read_state(root)
        if state:
            _write_state(root, {**state, "ready": False, "host_pid": None, "etcd_pid": None, "operator_pid": None})
    if not args.json:
        print("stopped")
    return EXIT_OK


def _wait_ready(url: str, cluster: str, replicas: int, runner: Any, operator: subprocess.Popen[bytes],
                stop: threading.Event) -> list[dict[str, Any]]:
    deadline = time.monotonic() + READY_TIMEOUT_S
    path = f"/apis/octavo.io/v1alpha1/namespaces/default/bookieclusters/{cluster}"
    while True:
        status = (_request(url + path) or {}).get("status") or {}
        ready: dict[str, Any] = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
        if ready.get("status") == "True":
            return [{"id": b["id"], "address": runner.address("default", b["id"]),
                     "data_dir": str(runner.root / "default" / "volumes" / f"data-{b['id']}")}
                    for b in status.get("bookies") or []]
        if operator.poll() is not None:
            raise CliError(f"the operator stopped ({_describe(operator.returncode)}) before the cluster was ready")
        runner.check()
        if stop.is_set():
            raise CliError("interrupted")
        if time.monotonic() > deadline:
            raise CliError(f"BookieCluster {cluster} was not ready within {READY_TIMEOUT_S:.0f}s: "
                           f"{ready.get('message') or status.get('specError') or 'no status yet'}")
        time.sleep(0.5)


def cmd_down(root: Path, state: dict[str, Any], as_json: bool) -> int:
    host = state.get("host_pid")
    clean = True
    if host and _alive(int(host)):
        os.kill(int(host), signal.SIGTERM)
        deadline = time.monotonic() + 120
        while _alive(int(host)):
            if time.monotonic() > deadline:
                os.kill(int(host), signal.SIGKILL)
                clean = False
                break
            time.sleep(0.1)
    if not clean:  # the host could not stop its children: stop what it started
        for pid in (state.get("operator_pid"), state.get("etcd_pid")):
            if pid and _alive(int(pid)):
                os.kill(int(pid), signal.SIGKILL)
    if as_json:
        print_json({"stopped": True, "killed": not clean})
    else:
        print("stopped" if clean else "stopped (the host had to be killed)")
    return EXIT_OK
