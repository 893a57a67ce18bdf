"""`octavo dev up|down|restart`: the local cluster as a user runs it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from octavo.cli.localcluster import EtcdProcess, free_port
from octavo.client import SyncClient

OCTAVO = [sys.executable, "-m", "octavo.cli.main"]
OCTAVO_WITH_CTRL_C = [sys.executable, "-c", "import runpy, signal, sys; "
                      "signal.signal(signal.SIGINT, signal.default_int_handler); sys.argv[0] = 'octavo'; "
                      "runpy.run_module('octavo.cli.main', run_name='__main__')"]  # Ctrl-C as a terminal sends it


def test_detached_cluster_up_write_down_up_read(tmp_path: Path) -> None:
    root = tmp_path / "dev"
    up = subprocess.run([*OCTAVO, "dev", "up", "--data-dir", str(root), "--bookies", "3", "--detach", "--json"],
                        capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    info = json.loads(up.stdout)
    assert [b["id"] for b in info["bookies"]] == ["bookie-0", "bookie-1", "bookie-2"]
    assert all(b["address"].startswith("127.0.0.1:") and b["pid"] for b in info["bookies"])
    try:
        again = subprocess.run([*OCTAVO, "dev", "up", "--data-dir", str(root), "--detach"], capture_output=True,
                               text=True, timeout=60)
        assert again.returncode == 1 and "already runs" in again.stderr
        with SyncClient(info["etcd"]) as client, client.create_ledger(3, 3, 2, password=b"p") as writer:
            writer.append_many([b"kept across restarts %d" % i for i in range(100)])
            ledger = writer.ledger_id
    finally:
        down = subprocess.run([*OCTAVO, "dev", "down", "--data-dir", str(root)], capture_output=True, text=True,
                              timeout=120)
    assert down.returncode == 0 and "stopped" in down.stdout
    up = subprocess.run([*OCTAVO, "dev", "up", "--data-dir", str(root), "--bookies", "3", "--detach", "--json"],
                        capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    try:
        info2 = json.loads(up.stdout)
        assert info2["etcd"] == info["etcd"]  # the same etcd, its data reused
        with SyncClient(info2["etcd"]) as client:
            reader = client.open_ledger(ledger, password=b"p")
            assert [e.data for e in reader.read(0, reader.last_entry_id)] == [
                b"kept across restarts %d" % i for i in range(100)]
    finally:
        subprocess.run([*OCTAVO, "dev", "down", "--data-dir", str(root)], capture_output=True, timeout=120)


def test_foreground_cluster_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    root = tmp_path / "dev"
    proc = subprocess.Popen([*OCTAVO, "dev", "up", "--data-dir", str(root), "--bookies", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if "running:" in line or not line:  # not line: `dev up` exited, say why below instead of spinning
            break
    assert any(line.startswith("etcd ") for line in lines) and sum(line.startswith("bookie ") for line in lines) == 2, (
        "".join(lines) + (proc.stderr.read() if proc.poll() is not None and proc.stderr else ""))
    state = json.loads((root / "cluster.json").read_text())
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "stopped" in out, err
    for pid in state["pids"]:
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    log = (root / "bookie-0.log").read_text()
    assert "stopped cleanly" in log


def test_restart_keeps_port_and_data_and_the_watcher_says_each_thing_once(tmp_path: Path) -> None:
    """A foreground cluster: a SIGKILLed bookie is reported once, with its signal; `dev restart` brings it
    back on the same port with its data; the watcher says so; stopping the foreground stops it too. A second
    `dev up` keeps every port."""
    root = tmp_path / "dev"
    proc = subprocess.Popen([*OCTAVO, "dev", "up", "--data-dir", str(root), "--bookies", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, f"`dev up` exited before it was running: {proc.stderr.read() if proc.stderr else ''}"
        if "running:" in line:
            break
    state = json.loads((root / "cluster.json").read_text())
    victim = state["bookies"][1]
    with SyncClient(state["etcd"]) as client, client.create_ledger(3, 3, 2, password=b"p") as writer:
        writer.append_many([b"before the restart"] * 10)
        ledger = writer.ledger_id
    os.kill(victim["pid"], signal.SIGKILL)
    time.sleep(3.5)  # three turns of the watcher: the death must be said once only
    restarted = subprocess.run([*OCTAVO, "dev", "restart", "--data-dir", str(root), "--bookie", victim["id"],
                                "--json"], capture_output=True, text=True, timeout=120)
    assert restarted.returncode == 0, restarted.stderr
    info = json.loads(restarted.stdout)
    assert info["address"] == victim["address"] and info["pid"] != victim["pid"]
    with SyncClient(state["etcd"]) as client:
        deadline = time.monotonic() + 10
        while victim["id"] not in client.bookies():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        with client.create_ledger(3, 3, 2, password=b"p") as writer:  # all three bookies, the restarted one too
            writer.append_many([b"after"] * 10)
        assert [e.data for e in client.open_ledger(ledger, b"p").read(0, 9)] == [b"before the restart"] * 10
    time.sleep(1.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert err.count(f"note: {victim['id']} stopped (killed by SIGKILL)") == 1, err
    assert f"note: {victim['id']} is serving again (pid {info['pid']})" in err
    assert not Path(f"/proc/{info['pid']}").exists() or \
        Path(f"/proc/{info['pid']}/stat").read_text().split()[2] == "Z", "the restarted bookie outlived dev up"
    again = subprocess.run([*OCTAVO, "dev", "up", "--data-dir", str(root), "--bookies", "3", "--detach", "--json"],
                           capture_output=True, text=True, timeout=120)
    try:
        assert again.returncode == 0, again.stderr
        second = json.loads(again.stdout)
        assert second["etcd"] == state["etcd"]
        assert [b["address"] for b in second["bookies"]] == [b["address"] for b in state["bookies"]]
    finally:
        down = subprocess.run([*OCTAVO, "dev", "down", "--data-dir", str(root), "--json"], capture_output=True,
                              text=True, timeout=120)
    assert json.loads(down.stdout)["stopped"] is True


def test_down_without_a_cluster_says_so(tmp_path: Path) -> None:
    run = subprocess.run([*OCTAVO, "dev", "down", "--data-dir", str(tmp_path)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 1 and "nothing to stop" in run.stderr


def test_dev_up_tls_runs_every_bookie_with_mutual_tls(tmp_path: Path) -> None:
    """`dev up --tls`: a throwaway CA and certificates; the commands given --data-dir use the client
    certificate; a plaintext client is refused; ClientOptions with the files writes and reads."""
    from octavo.client import ClientOptions
    from octavo.meta.errors import OctavoError

    root = tmp_path / "dev"
    up = subprocess.run([*OCTAVO, "dev", "up", "--data-dir", str(root), "--bookies", "3", "--detach", "--tls"],
                        capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    try:
        state = json.loads((root / "cluster.json").read_text())
        tls = state["tls"]
        assert all(os.path.exists(tls[k]) for k in ("ca_file", "cert_file", "key_file"))
        assert oct(os.stat(tls["key_file"]).st_mode & 0o777) == "0o600"
        check = subprocess.run([*OCTAVO, "cluster", "check", "--data-dir", str(root)], capture_output=True,
                               text=True, timeout=60)
        assert check.returncode == 0 and check.stdout.startswith("ok:"), check.stderr
        etcd_tls = {"etcd_tls_ca_file": tls["ca_file"], "etcd_tls_cert_file": tls["cert_file"],
                    "etcd_tls_key_file": tls["key_file"]}
        options = ClientOptions(tls_ca_file=tls["ca_file"], tls_cert_file=tls["cert_file"],
                                tls_key_file=tls["key_file"], **etcd_tls)
        with SyncClient(state["etcd"], options=options) as client, \
                client.create_ledger(3, 3, 2, password=b"p") as writer:
            writer.append_many([b"over tls"] * 10)
        # Plaintext to the bookies (etcd over TLS): the adds are refused.
        plain = ClientOptions(add_timeout_s=1.0, ensemble_change_wait_s=0.0, **etcd_tls)
        with SyncClient(state["etcd"], options=plain) as client:
            try:
                with client.create_ledger(3, 3, 2, password=b"p") as writer:
                    writer.append_many([b"refused"])
                raise AssertionError("a plaintext client wrote to TLS bookies")
            except OctavoError as e:
                assert "UNAVAILABLE" in str(e)
        # Without a client certificate, etcd itself refuses.
        no_etcd_cert = ClientOptions(metadata_timeout_s=2.0, etcd_tls_ca_file=tls["ca_file"])
        with SyncClient(state["etcd"], options=no_etcd_cert) as client:
            try:
                client.create_ledger(3, 3, 2, password=b"p")
                raise AssertionError("etcd served a client without a certificate")
            except OctavoError as e:
                assert "etcd" in str(e)
    finally:
        subprocess.run([*OCTAVO, "dev", "down", "--data-dir", str(root)], capture_output=True, timeout=120)


def test_etcd_on_ports_it_picked_retries_when_one_is_taken_before_it_binds(tmp_path: Path) -> None:
    """The OS hands the ephemeral ports we pick to outgoing connections too: a port taken between picking it and
    etcd binding it must not fail the start (it failed a CI run)."""
    etcd = EtcdProcess(str(tmp_path / "etcd" / "data"))
    taken = etcd.client_port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        try:
            endpoint = etcd.start()
            assert endpoint != f"127.0.0.1:{taken}" and etcd.client_port != taken
            assert "address already in use" in Path(etcd.log_path).read_text()
            assert etcd._serving()
        finally:
            etcd.stop()


def test_etcd_on_a_port_the_caller_chose_says_it_is_taken(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        etcd = EtcdProcess(str(tmp_path / "etcd" / "data"), client_port=taken, peer_port=free_port())
        with pytest.raises(RuntimeError, match="etcd exited with 1"):
            etcd.start()
        assert etcd.client_port == taken


def test_etcd_on_another_host_address_listens_there_only(tmp_path: Path) -> None:
    """The local control plane's pods reach the host on its gateway address, never on 127.0.0.1: an etcd for them
    listens on the address it is given (here 127.0.0.2, which every Linux routes to lo) and says so."""
    etcd = EtcdProcess(str(tmp_path / "etcd" / "data"), host="127.0.0.2")
    endpoint = etcd.start()
    try:
        assert endpoint == f"127.0.0.2:{etcd.client_port}"
        socket.create_connection(("127.0.0.2", etcd.client_port), timeout=2).close()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", etcd.client_port), timeout=2).close()
    finally:
        etcd.stop()


def test_free_ports_lie_outside_the_ephemeral_range_and_are_never_handed_out_twice() -> None:
    low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert not [p for p in ports if low <= p <= high], "ports an outgoing connection could take"
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0]))  # and free now


# -- issue 29: interrupted, killed and resumed `dev up` ----------------------------------------------------
def _cluster_processes(root: Path) -> dict[int, str]:
    """Every process whose arguments name a path inside root (etcd, bookies), read from /proc: independent of
    what `dev up` recorded."""
    inside = str(root.resolve()) + "/"
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(a.startswith(inside) for a in argv) and "up" not in argv[:5]:
            found[int(entry)] = " ".join(argv[:4])
    return found


def _wait_for_bookie_processes(root: Path, count: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while sum("node" in cmd for cmd in _cluster_processes(root).values()) < count:
        assert proc.poll() is None, f"`dev up` ended before its bookies started: {proc.communicate()}"
        assert time.monotonic() < deadline, "the bookies never started"
        time.sleep(0.02)


def _gone(root: Path, timeout_s: float = 30) -> dict[int, str]:
    deadline = time.monotonic() + timeout_s
    while (left := _cluster_processes(root)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_ctrl_c_while_dev_up_starts_stops_what_it_started(tmp_path: Path) -> None:
    """SIGINT (Ctrl-C) while the bookies start: `dev up` stops etcd and the bookies it had started, says so
    (exit 130), and the next `dev up` on the folder starts at once. It used to leave them all running with no
    cluster.json, so that `dev down` found nothing to stop and the next `dev up` waited 30 s for an etcd that
    could not lock its data."""
    root = tmp_path / "dev"
    # SIGINT as a terminal delivers it: a shell that runs the suite in the background ignores SIGINT, and its
    # children would inherit that (Python then installs no KeyboardInterrupt handler).
    proc = subprocess.Popen([*OCTAVO_WITH_CTRL_C, "dev", "up", "--data-dir", str(root), "--bookies", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_bookie_processes(root, 3, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted" in err and "stopped the 4 processes" in err, err
    assert "Traceback" not in err
    assert not _gone(root), "an interrupted `dev up` left processes running"
    started = time.monotonic()
    up = subprocess.run([*OCTAVO, "dev", "up", "--data-dir", str(root), "--bookies", "3", "--detach", "--json"],
                        capture_output=True, text=True, timeout=120)
    try:
        assert up.returncode == 0, up.stderr
        assert time.monotonic() - started < 60
    finally:
        subprocess.run([*OCTAVO, "dev", "down", "--data-dir", str(root)], capture_output=True, timeout=120)


def test_a_killed_dev_up_is_refused_at_once_and_dev_down_stops_what_it_left(tmp_path: Path) -> None:
    """A `dev up` SIGKILLed while starting leaves its processes (started in sessions of their own): the next
    `dev up` refuses at once, naming them and `dev down`; `dev down` (finding the folder in $OCTAVO_DEV_DIR)
    stops them; then the cluster comes up again on its data."""
    root = tmp_path / "dev"
    proc = subprocess.Popen([*OCTAVO, "dev", "up", "--data-dir", str(root), "--bookies", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_bookie_processes(root, 3, proc)
    proc.kill()
    proc.communicate(timeout=60)
    left = _cluster_processes(root)
    assert len(left) == 4, left  # etcd and the bookies, alive
    started = time.monotonic()
    again = subprocess.run([*OCTAVO, "dev", "up", "--data-dir", str(root), "--bookies", "3", "--detach"],
                           capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert again.returncode == 1 and "already runs" in again.stderr and "dev down" in again.stderr, again.stderr
    assert "etcd (pid" in again.stderr and "bookie-0 (pid" in again.stderr, again.stderr
    assert took < 20, f"the refusal took {took:.0f}s"
    down = subprocess.run([*OCTAVO, "dev", "down"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OCTAVO_DEV_DIR": str(root)})
    assert down.returncode == 0 and "stopped" in down.stdout, down.stderr
    assert not _gone(root), "dev down left processes of the killed `dev up`"
    up = subprocess.run([*OCTAVO, "dev", "up", "--data-dir", str(root), "--bookies", "3", "--detach", "--json"],
                        capture_output=True, text=True, timeout=120)
    try:
        assert up.returncode == 0, up.stderr
        with SyncClient(json.loads(up.stdout)["etcd"]) as client, client.create_ledger(3, 3, 2) as writer:
            writer.append_many([b"after the kill"])
    finally:
        subprocess.run([*OCTAVO, "dev", "down", "--data-dir", str(root)], capture_output=True, timeout=120)


def test_dev_commands_find_the_folder_in_octavo_dev_dir_or_ask_for_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OCTAVO_DEV_DIR"}
    for command in (["down"], ["restart", "--bookie", "bookie-0"]):
        run = subprocess.run([*OCTAVO, "dev", *command], capture_output=True, text=True, timeout=60, env=env)
        assert run.returncode == 2 and "--data-dir" in run.stderr and "OCTAVO_DEV_DIR" in run.stderr, run.stderr
    run = subprocess.run([*OCTAVO, "dev", "down"], capture_output=True, text=True, timeout=60,
                         env={**env, "OCTAVO_DEV_DIR": str(tmp_path)})
    assert run.returncode == 1 and str(tmp_path) in run.stderr and "nothing to stop" in run.stderr, run.stderr
    help_text = subprocess.run([*OCTAVO, "dev", "down", "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "--data-dir" in help_text and "OCTAVO_DEV_DIR" in help_text


def test_dev_up_on_a_kubernetes_folder_says_what_it_holds(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text(json.dumps({"kind": "kubernetes", "host_pid": None}))
    run = subprocess.run([*OCTAVO, "dev", "up", "--data-dir", str(tmp_path), "--detach"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and "dev up --kubernetes" in run.stderr and "rm -rf" in run.stderr, run.stderr


def test_a_start_that_takes_a_while_says_what_it_waits_for(tmp_path: Path) -> None:
    """The bookies' wait reports every few seconds which of them it still waits for, with the time so far."""
    from octavo.cli import localcluster
    from octavo.node.testing import BookieProcess

    slow = BookieProcess(str(tmp_path / "bookie-7"))
    slow.proc = subprocess.Popen(["sleep", "30"])  # never writes its ready file
    heard: list[str] = []
    try:
        with pytest.raises(RuntimeError, match="bookie-7 did not serve within 5s"):
            localcluster.wait_bookies_ready({"bookie-7": slow}, timeout_s=5, progress=heard.append)
    finally:
        slow.proc.kill()
        slow.proc.wait()
    assert heard and all(line.startswith("waiting for bookie-7 to serve (") for line in heard), heard
