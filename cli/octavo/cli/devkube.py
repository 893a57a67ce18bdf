"""`octavo dev up --kubernetes`: the operator and real bookies on a real, local Kubernetes control plane.

One host process (this one, or a background one with --detach) runs, in this order:
- the control plane (octavo.cli.kubecontrolplane: its own etcd, kube-apiserver, kube-controller-manager and
  kube-scheduler, built by `make kube`) under DIR/kube, its admin kubeconfig copied to DIR/kubeconfig;
- the node agent (octavo.cli.kubeagent) in this process, under DIR/agent: three nodes, each pod a set of local
  processes in a network namespace of its own on the bridge `octavo-k8s0` (needs root);
- Octavo's metadata etcd under DIR/etcd, listening on 127.0.0.1 and on the bridge's gateway address (pods do not
  reach the host's 127.0.0.1);
- the CRDs (charts/octavo/crds), then `octavo operator run` as a host process with the admin kubeconfig;
- a CompactionPolicy `default` and a BookieCluster of --bookies bookies, applied with kubectl.
It waits until the BookieCluster is Ready, then writes DIR/cluster.json (`octavo ... --data-dir DIR` finds etcd
there). SIGTERM or SIGINT (Ctrl-C, also while starting) stops what was started, in the order that lets pods stop
first: the agent (which removes the bridge, the pods' namespaces and its nftables table), the operator, the
control plane, the metadata etcd. `octavo dev down --data-dir DIR` sends the host SIGTERM, and cleans up after a
host that died (the pids in cluster.json, every other process of ours whose arguments name a path inside DIR,
the bridge by its name). With --detach, the command waits for the background host and repeats its progress
lines ("... 9.3s starting the operator").

A folder that held a cluster is not resumed: a second `dev up` there refuses at once, saying how to start fresh.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from argparse import Namespace
from pathlib import Path
from types import FrameType
from typing import Any

from octavo.cli.common import DEV_STATE_FILE, EXIT_OK, CliError, print_json

READY_TIMEOUT_S = 180.0
DOWN_TIMEOUT_S = 120.0
PROGRESS_INTERVAL_S = 10.0
OPERATOR_POLL_INTERVAL_S = 5.0
HOST_LOG = "kubernetes-host.log"
PLANE_DIR = "kube"
AGENT_DIR = "agent"
ETCD_DIR = "etcd"
NAMESPACE = "default"
ENV_BRIDGE = "OCTAVO_DEV_BRIDGE"  # the pod network's bridge name (tests use their own; default octavo-k8s0)
ENV_PROGRESS = "OCTAVO_DEV_PROGRESS"  # set for a detached host: progress lines into its log even with --json
CRDS_DIR = Path(__file__).resolve().parents[3] / "charts" / "octavo" / "crds"
BOOKIE_PORT = 3181
_BEGAN = time.monotonic()  # for the progress lines


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


def bridge_name() -> str:
    from octavo.cli.kubeagent.network import BRIDGE

    return os.environ.get(ENV_BRIDGE) or BRIDGE


def example_resources(cluster: str, bookies: int, etcd: str) -> list[dict[str, Any]]:
    """The CompactionPolicy and BookieCluster `dev up --kubernetes` creates."""
    policy = {"apiVersion": "octavo.io/v1alpha1", "kind": "CompactionPolicy",
              "metadata": {"name": "default", "namespace": NAMESPACE},
              "spec": {"windows": [{"schedule": "0 2 * * *", "duration": "2h", "timeZone": "UTC"}],
                       "maxConcurrentBookies": 1, "outsideWindow": "compact"}}
    spec = {"replicas": bookies, "minWritableBookies": min(3, bookies), "image": "octavo:dev",
            "storage": {"size": "10Gi"}, "etcd": {"endpoints": etcd}, "compactionPolicyRef": {"name": "default"},
            "bookie": {"log_size_bytes_max": 64 << 20}}
    cluster_body = {"apiVersion": "octavo.io/v1alpha1", "kind": "BookieCluster",
                    "metadata": {"name": cluster, "namespace": NAMESPACE}, "spec": spec}
    return [policy, cluster_body]


# -- preconditions -----------------------------------------------------------------------------------------
def check_host() -> None:
    """Where --kubernetes cannot run, one line saying why and what to do."""
    from octavo.cli.kubeagent.agent import AgentError
    from octavo.cli.kubeagent.agent import check_host as agent_check_host
    from octavo.cli.kubecontrolplane import ControlPlaneError, find_binaries

    if os.geteuid() != 0:
        raise CliError("--kubernetes needs root: the node agent runs each pod in network and mount namespaces of "
                       "its own on a bridge; run it with sudo (or as root in a container or VM)")
    try:
        find_binaries()
        agent_check_host("bridge")
    except (ControlPlaneError, AgentError) as e:
        raise CliError(str(e)) from None
    if not CRDS_DIR.is_dir():
        raise CliError(f"the CRDs are not in {CRDS_DIR}: --kubernetes runs from a clone of the repository")


def cmd_up(args: Namespace) -> int:
    root = Path(args.data_dir).resolve()
    if args.bookies < 1:
        raise CliError("--bookies must be at least 1")
    from octavo.cli.localcluster import processes_on

    previous = _read_state(root)
    host = previous.get("host_pid")
    if host and _alive(int(host)):
        raise CliError(f"a cluster already runs on {root} (pid {host}); `octavo dev down --data-dir "
                       f"{args.data_dir}` first")
    running = processes_on(root) if root.exists() else {}
    if running:
        raise CliError(f"processes of an earlier cluster still run on {root}: "
                       f"{', '.join(f'{label} (pid {pid})' for pid, label in sorted(running.items()))}; "
                       f"`octavo dev down --data-dir {args.data_dir}` stops them")
    if previous or (root / PLANE_DIR).exists():
        raise CliError(f"{root} holds a stopped cluster, which --kubernetes does not resume: remove the folder "
                       f"(`rm -rf {args.data_dir}`) to start fresh, or give another --data-dir")
    check_host()
    root.mkdir(parents=True, exist_ok=True)
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


def _describe(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by signal {-code}"
    return f"exit code {code}"


# -- detached: a background host, this process waits for it ---------------------------------------------
def _detach(args: Namespace, root: Path) -> int:
    """Run the host in the background and return once it reports the cluster ready (or failed). Ctrl-C here
    stops the host, which stops what it started."""
    argv = [sys.executable, "-m", "octavo.cli.main", "dev", "up", "--kubernetes", "--data-dir", str(root),
            "--bookies", str(args.bookies), "--cluster", args.cluster, "--json"]
    log_offset = (root / HOST_LOG).stat().st_size if (root / HOST_LOG).exists() else 0
    with open(root / HOST_LOG, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, ENV_PROGRESS: "1"})
    deadline = time.monotonic() + READY_TIMEOUT_S + 60
    try:
        while True:
            if not args.json:  # what the host starts or waits for, as it says it (a start takes seconds)
                log_offset = _relay_progress(root / HOST_LOG, log_offset)
            state = _read_state(root)
            if state.get("ready"):
                break
            if proc.poll() is not None:
                raise CliError(f"the local Kubernetes did not start ({_describe(proc.returncode)}): "
                               f"{_last_line(root / HOST_LOG)}; see {root / HOST_LOG}")
            if time.monotonic() > deadline:
                _stop_host(proc)
                raise CliError(f"the local Kubernetes was not ready in time; see {root / HOST_LOG}")
            time.sleep(0.2)
    except KeyboardInterrupt:
        _stop_host(proc)
        raise CliError("interrupted: what it had started is stopped") from None
    _print(args, state)
    if not args.json:
        print(f"detached: stop with `octavo dev down --data-dir {args.data_dir}`")
    return EXIT_OK


def _relay_progress(log: Path, offset: int) -> int:
    """Print the progress lines the host wrote to its log since `offset`; returns the offset read to."""
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except OSError:
        return offset
    complete = chunk.rpartition(b"\n")[0]
    for line in complete.decode(errors="replace").splitlines():
        if line.startswith("... "):
            print(line, file=sys.stderr, flush=True)
    return offset + len(complete) + (1 if complete else 0)


def _stop_host(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(DOWN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no output"
    return lines[-1] if lines else "no output"


def _print(args: Namespace, state: dict[str, Any]) -> None:
    if args.json:
        print_json(state)
        return
    print(f"kubernetes  {state['kubernetes']} ({state['version']}, local control plane, node agent)   "
          f"export KUBECONFIG={state['kubeconfig']}")
    print(f"etcd        {state['etcd']}")
    print(f"operator    pid {state['operator_pid']}, log {state['operator_log']}")
    for b in state["bookies"]:
        print(f"bookie      {b['id']:12} {b['address']:21} pod {b['pod']} on {b['node']}, data {b['data_dir']}")
    print(f"cluster     BookieCluster {state['cluster']} and CompactionPolicy default in namespace {NAMESPACE}, "
          f"Ready in {state['startup_s']:.1f}s; `octavo ledger ls --data-dir {args.data_dir}` reaches its etcd")
    sys.stdout.flush()


# -- the host ------------------------------------------------------------------------------------------------
class _Interrupted(Exception):
    """SIGINT or SIGTERM while starting: stop what was started."""


class _Signals:
    """While starting, a signal raises _Interrupted where the main thread is (each start step stops its own
    partial work on an exception); once running, it only sets `stop`; while stopping, it is ignored."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.starting = True
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stop.is_set():
            return
        self.stop.set()
        if self.starting:
            raise _Interrupted(signal.Signals(signum).name)


class _Host:
    """What one host started, so that stop() undoes exactly that, in order."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.plane: Any = None
        self.agent: Any = None
        self.etcd: Any = None
        self.operator: subprocess.Popen[bytes] | None = None

    def pids(self) -> dict[str, int]:
        out = {}
        if self.plane is not None:
            out.update({name: p.pid for name, p in self.plane.procs.items()})
            if self.plane.etcd.proc is not None:
                out["kube-etcd"] = self.plane.etcd.proc.pid
        if self.etcd is not None and self.etcd.proc is not None:
            out["etcd"] = self.etcd.proc.pid
        if self.operator is not None:
            out["operator"] = self.operator.pid
        return out

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.stop()
        if self.operator is not None and self.operator.poll() is None:
            self.operator.terminate()
            try:
                self.operator.wait(30)
            except subprocess.TimeoutExpired:
                self.operator.kill()
                self.operator.wait()
        if self.plane is not None:
            self.plane.stop()
        if self.etcd is not None:
            self.etcd.stop()


def _host(args: Namespace, root: Path) -> int:
    signals = _Signals()
    started = time.monotonic()
    host = _Host(root)
    state: dict[str, Any] = {"kind": "kubernetes", "ready": False, "host_pid": os.getpid(), "bridge": bridge_name(),
                             "cluster": args.cluster, "pids": {}}
    _write_state(root, state)
    _log_agent(root / "agent.log")
    try:
        try:
            state = _start(args, root, host, state, started, signals)
        except _Interrupted as e:
            raise CliError(f"interrupted ({e}) while starting: stopped what was started") from None
        signals.starting = False
        _print(args, state)
        if not args.json:
            print("running: Ctrl-C (or SIGTERM) stops everything cleanly")
            sys.stdout.flush()
        operator = host.operator
        while operator is not None and not signals.stop.wait(1.0):
            if operator.poll() is not None:
                print(f"note: the operator stopped ({_describe(operator.returncode)}); see "
                      f"{state['operator_log']}", file=sys.stderr)
                break
    finally:
        signals.starting = False
        signals.stop.set()  # a signal from here on is ignored: stopping is under way
        host.stop()
        _write_state(root, {**_read_state(root), "ready": False, "host_pid": None, "etcd_pid": None,
                            "operator_pid": None, "pids": {}})
    if not args.json:
        print("stopped")
    return EXIT_OK


def _log_agent(path: Path) -> None:
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("octavo.kubeagent")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _start(args: Namespace, root: Path, host: _Host, state: dict[str, Any], started: float,
           signals: _Signals) -> dict[str, Any]:
    from octavo.cli.kubeagent import NodeAgent, agent_config
    from octavo.cli.kubecontrolplane import KubeControlPlane, pinned_version
    from octavo.cli.localcluster import EtcdProcess, free_port

    def record() -> None:
        state["pids"] = host.pids()
        _write_state(root, state)

    quiet = args.json
    _progress(quiet, "starting the control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)")
    host.plane = plane = KubeControlPlane(root / PLANE_DIR)
    try:
        plane.start()
    finally:
        record()
    shutil.copyfile(plane.kubeconfig, root / "kubeconfig")
    os.chmod(root / "kubeconfig", 0o600)
    plane.kubectl("apply", "-f", str(CRDS_DIR))
    # The operator starts now (its imports take seconds) while the node agent and etcd start beside it.
    _progress(quiet, "starting the operator")
    operator_log = root / "operator.log"
    with open(operator_log, "ab") as log:
        host.operator = subprocess.Popen(
            [sys.executable, "-m", "octavo.cli.main", "operator", "run", "--kubeconfig", str(root / "kubeconfig"),
             "--poll-interval-s", str(OPERATOR_POLL_INTERVAL_S), "--liveness", f"127.0.0.1:{free_port()}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    record()
    _progress(quiet, f"starting the node agent (3 nodes, pod network on bridge {state['bridge']}) and etcd")
    host.agent = agent = NodeAgent(agent_config(plane, root / AGENT_DIR, bridge=state["bridge"])).start()
    if agent.network is None:
        raise CliError("the node agent started without a pod network")
    gateway = agent.network.node_ip("")  # where pods reach the host
    client_port, peer_port = free_port(), free_port()
    host.etcd = etcd = EtcdProcess(str(root / ETCD_DIR), client_port, peer_port, new_session=True, extra_args=[
        "--listen-client-urls", f"http://127.0.0.1:{client_port},http://{gateway}:{client_port}",
        "--advertise-client-urls", f"http://{gateway}:{client_port}"])
    try:
        etcd.start()
    finally:
        record()
    endpoint = f"{gateway}:{client_port}"
    plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRDS_DIR))
    plane.kubectl("apply", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": example_resources(args.cluster, args.bookies, endpoint)}))
    _progress(quiet, f"waiting for BookieCluster {args.cluster} to be Ready ({args.bookies} bookies)")
    bookies = _wait_ready(plane, args.cluster, host.operator, quiet)
    state.update(ready=True, kubernetes=plane.server, version=pinned_version(), kubeconfig=str(root / "kubeconfig"),
                 etcd=endpoint, etcd_pid=host.etcd.proc.pid, operator_pid=host.operator.pid,
                 operator_log=str(operator_log), agent_log=str(root / "agent.log"), logs=str(plane.logs),
                 bookies=bookies, startup_s=round(time.monotonic() - started, 1), pids=host.pids())
    _write_state(root, state)
    return state


def _progress(quiet: bool, what: str) -> None:
    """What `dev up` starts or waits for now, on stderr, with the seconds since it began."""
    if not quiet or os.environ.get(ENV_PROGRESS):
        print(f"... {time.monotonic() - _BEGAN:5.1f}s {what}", file=sys.stderr, flush=True)


def _wait_ready(plane: Any, cluster: str, operator: subprocess.Popen[bytes], quiet: bool) -> list[dict[str, Any]]:
    deadline = time.monotonic() + READY_TIMEOUT_S
    next_note = time.monotonic() + PROGRESS_INTERVAL_S
    path = f"/apis/octavo.io/v1alpha1/namespaces/{NAMESPACE}/bookieclusters/{cluster}"
    while True:
        status = ((plane.get(path) or {}).get("status")) or {}
        ready: dict[str, Any] = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
        if ready.get("status") == "True":
            return [_bookie(plane, b["id"]) for b in status.get("bookies") or []]
        if operator.poll() is not None:
            raise CliError(f"the operator stopped ({_describe(operator.returncode)}) before the cluster was ready")
        why = ready.get("message") or status.get("specError") or "no status yet"
        if time.monotonic() > deadline:
            raise CliError(f"BookieCluster {cluster} was not ready within {READY_TIMEOUT_S:.0f}s: {why}")
        if time.monotonic() > next_note:
            next_note += PROGRESS_INTERVAL_S
            _progress(quiet, f"still waiting for BookieCluster {cluster}: {why}")
        time.sleep(0.5)


def _bookie(plane: Any, bookie_id: str) -> dict[str, Any]:
    """A bookie's pod (its name is the bookie id), address and the directory of its data volume."""
    pod = plane.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{bookie_id}") or {}
    claim = next((v["persistentVolumeClaim"]["claimName"] for v in (pod.get("spec") or {}).get("volumes") or []
                  if v["name"] == "data" and "persistentVolumeClaim" in v), "")
    pvc = plane.get(f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/{claim}") if claim else None
    volume = ((pvc or {}).get("spec") or {}).get("volumeName")
    pv = plane.get(f"/api/v1/persistentvolumes/{volume}") if volume else None
    return {"id": bookie_id, "pod": bookie_id, "node": (pod.get("spec") or {}).get("nodeName", ""),
            "address": f"{(pod.get('status') or {}).get('podIP', '')}:{BOOKIE_PORT}",
            "data_dir": ((pv or {}).get("spec") or {}).get("local", {}).get("path", "")}


# -- down ----------------------------------------------------------------------------------------------------
def cmd_down(root: Path, state: dict[str, Any], as_json: bool) -> int:
    """SIGTERM the host (it stops everything in order); after a host that died or would not stop, stop what it
    recorded: its processes by pid, then the pod network by its bridge's name."""
    host = state.get("host_pid")
    clean = True
    if host and _alive(int(host)):
        os.kill(int(host), signal.SIGTERM)
        deadline = time.monotonic() + DOWN_TIMEOUT_S
        while _alive(int(host)):
            if time.monotonic() > deadline:
                os.kill(int(host), signal.SIGKILL)
                clean = False
                break
            time.sleep(0.1)
    clean &= _clean_leftovers(root, state)
    _write_state(root, {**_read_state(root), "ready": False, "host_pid": None, "etcd_pid": None,
                        "operator_pid": None, "pids": {}})
    if as_json:
        print_json({"stopped": True, "killed": not clean})
    else:
        print("stopped" if clean else "stopped (some processes had to be killed)")
    return EXIT_OK


def _clean_leftovers(root: Path, state: dict[str, Any]) -> bool:
    """True when nothing was left over. The pod network goes first: removing its namespaces kills the pods."""
    leftovers = False
    bridge = state.get("bridge")
    if bridge and os.geteuid() == 0 and Path(f"/sys/class/net/{bridge}").exists():
        from octavo.cli.kubeagent.network import PodNetwork

        PodNetwork(root / AGENT_DIR / "network", bridge=bridge).stop()
        leftovers = True
    from octavo.cli.localcluster import belongs_to, processes_on

    pids = [int(p) for p in (state.get("pids") or {}).values() if p and belongs_to(int(p), root)]
    # A host that died while starting a component had not recorded it yet: found by its arguments.
    pids += [pid for pid in processes_on(root) if pid not in pids]
    for pid in pids:  # each started in a session of its own (its pid is its group), but the kube etcd
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return not (leftovers or pids)
