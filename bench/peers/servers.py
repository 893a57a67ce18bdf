"""The peers as processes on 127.0.0.1: jars from Maven, Kafka's three brokers, ZooKeeper and bookies, the load
drivers, and each process's CPU time and peak RSS read from /proc."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import configs

HERE = Path(__file__).resolve().parent
# Compiled driver classes and resolved classpaths; ignored by git (bench/peers/.gitignore). The jars themselves
# stay in Maven's local repository (~/.m2).
CACHE = HERE / ".cache"
POMS = {"kafka": HERE / "pom-kafka.xml", "bookkeeper": HERE / "pom-bookkeeper.xml"}
# Extra JVM options for the load driver, e.g. -Dpeers.kafka.prime=false (see PeerDriver.java).
DRIVER_EXTRA_JVM_ARGS = os.environ.get("OCTAVO_PEERS_DRIVER_JVM_ARGS", "").split()
SERVER_START_TIMEOUT_S = 300.0  # a loaded 2-core machine has taken over 90 s to start a broker


# -- jars -----------------------------------------------------------------------------------------------------
def classpath(system: str) -> str:
    """The classpath of `system`'s jars, resolved by Maven into its local repository (downloaded on first use)."""
    out = CACHE / f"{system}.classpath"
    pom = POMS[system]
    if not out.exists() or out.stat().st_mtime < pom.stat().st_mtime:
        CACHE.mkdir(exist_ok=True)
        print(f"resolving {system} jars with Maven ({pom.name}; the first run downloads them from Maven "
              "Central into ~/.m2)", flush=True)
        result = subprocess.run(["mvn", "-B", "-q", "-f", str(pom), "dependency:build-classpath",
                                 f"-Dmdep.outputFile={out}"], capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"mvn could not resolve {pom.name}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return out.read_text().strip()


def driver_classpath(system: str) -> str:
    """`system`'s jars plus the compiled PeerDriver (built with javac against both systems' jars)."""
    source = HERE / "PeerDriver.java"
    classes = CACHE / "driver"
    stamp = classes / "PeerDriver.class"
    if not stamp.exists() or stamp.stat().st_mtime < source.stat().st_mtime:
        classes.mkdir(parents=True, exist_ok=True)
        both = classpath("kafka") + os.pathsep + classpath("bookkeeper")
        subprocess.run(["javac", "-d", str(classes), "-cp", both, str(source)], check=True)
    return str(classes) + os.pathsep + classpath(system)


# -- processes ------------------------------------------------------------------------------------------------
def wait_port(port: int, proc: subprocess.Popen[bytes], log: str, timeout_s: float = SERVER_START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} before listening on {port}; see {log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"not listening on {port} after {timeout_s:.0f} s; see {log}")
        time.sleep(0.2)


def spawn(command: list[str], log: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        return subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


class KafkaCluster:
    """Three combined broker+controller processes in KRaft mode."""

    def __init__(self, root: str, ports: list[tuple[int, int]]) -> None:
        self.root = root
        self.nodes = [configs.KafkaNode(i + 1, p, c, os.path.join(root, f"k{i}")) for i, (p, c) in enumerate(ports)]
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self) -> None:
        cp = classpath("kafka")
        cluster_id = configs.kafka_cluster_id(os.urandom(16))
        os.makedirs(self.root, exist_ok=True)
        for node in self.nodes:
            props = os.path.join(self.root, f"k{node.node_id - 1}.properties")
            Path(props).write_text(configs.kafka_properties(node, self.nodes))
            subprocess.run(configs.java_command(cp, ["-Xmx256m"], configs.KAFKA_STORAGE_TOOL, "format", "-t",
                                                cluster_id, "-c", props), check=True, capture_output=True)
        for node in self.nodes:
            props = os.path.join(self.root, f"k{node.node_id - 1}.properties")
            log = os.path.join(self.root, f"k{node.node_id - 1}.log")
            self.procs.append(spawn(configs.java_command(cp, configs.KAFKA_JVM_ARGS, configs.KAFKA_MAIN, props), log))
        for node, proc in zip(self.nodes, self.procs, strict=True):
            wait_port(node.port, proc, os.path.join(self.root, f"k{node.node_id - 1}.log"))

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stop(self) -> None:
        stop_all(self.procs)


class ZooKeeper:
    def __init__(self, root: str, port: int) -> None:
        self.root = root
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        os.makedirs(os.path.join(self.root, "data"), exist_ok=True)
        cfg = os.path.join(self.root, "zoo.cfg")
        Path(cfg).write_text(configs.zookeeper_config(self.port, os.path.join(self.root, "data")))
        log = os.path.join(self.root, "zk.log")
        self.proc = spawn(configs.java_command(classpath("bookkeeper"), configs.ZOOKEEPER_JVM_ARGS,
                                               configs.ZOOKEEPER_MAIN, cfg), log)
        wait_port(self.port, self.proc, log)

    def stop(self) -> None:
        if self.proc is not None:
            stop_all([self.proc])


class Bookies:
    """Three bookies under one ledgers root of a shared ZooKeeper, with `journalSyncData` on or off."""

    def __init__(self, root: str, zk_port: int, ledgers_root: str, ports: list[int], journal_sync_data: bool) -> None:
        self.root = root
        self.zk_port = zk_port
        self.ledgers_root = ledgers_root
        self.ports = ports
        self.journal_sync_data = journal_sync_data
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def metadata_service_uri(self) -> str:
        return configs.metadata_service_uri(self.zk_port, self.ledgers_root)

    def start(self) -> None:
        cp = classpath("bookkeeper")
        confs = []
        for i, port in enumerate(self.ports):
            d = os.path.join(self.root, f"b{i}")
            for sub in ("journal", "ledgers"):
                os.makedirs(os.path.join(d, sub), exist_ok=True)
            conf = os.path.join(self.root, f"b{i}.conf")
            Path(conf).write_text(configs.bookie_config(port, self.zk_port, self.ledgers_root,
                                                        os.path.join(d, "journal"), os.path.join(d, "ledgers"),
                                                        self.journal_sync_data))
            confs.append(conf)
        # The cluster's metadata in ZooKeeper (what `bookkeeper shell initnewcluster` does).
        init = subprocess.run(configs.java_command(cp, ["-Xmx256m"], configs.BOOKIE_SHELL, "-conf", confs[0],
                                                   "initnewcluster"), capture_output=True, text=True)
        if init.returncode != 0:
            raise RuntimeError(f"initnewcluster failed:\n{init.stdout[-2000:]}{init.stderr[-2000:]}")
        for i, conf in enumerate(confs):
            log = os.path.join(self.root, f"b{i}.log")
            self.procs.append(spawn(configs.java_command(cp, configs.BOOKIE_JVM_ARGS, configs.BOOKIE_MAIN,
                                                         "--conf", conf), log))
        for i, (port, proc) in enumerate(zip(self.ports, self.procs, strict=True)):
            wait_port(port, proc, os.path.join(self.root, f"b{i}.log"))

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stop(self) -> None:
        stop_all(self.procs)


def driver_command(system: str, target: str) -> list[str]:
    """The load driver of `system`: PeerDriver.java for Kafka and BookKeeper, jsdriver.py for JetStream."""
    if system == "jetstream":
        return [sys.executable, str(HERE / "jsdriver.py"), target]
    return configs.java_command(driver_classpath(system), [*configs.DRIVER_JVM_ARGS, *DRIVER_EXTRA_JVM_ARGS],
                                "PeerDriver", system, target)


class Driver:
    """The load driver for one system, as its own process (so its CPU and memory are its own): one command per
    line on stdin, one JSON line per command on stdout."""

    def __init__(self, system: str, target: str, log: str) -> None:
        self.log = open(log, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(driver_command(system, target), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log)
        try:
            if self.read().get("ready") is not True:
                raise RuntimeError(f"the {system} driver did not start; see {log}")
        except BaseException:
            self.proc.kill()  # not left running: the caller never got this driver to stop
            self.proc.wait()
            self.log.close()
            raise

    def read(self) -> dict[str, object]:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the driver exited with {self.proc.wait()}; see {self.log.name}")
            if line.startswith(b"{"):  # anything else is a library's logging that reached stdout
                result: dict[str, object] = json.loads(line)
                return result

    def call(self, *words: object) -> dict[str, object]:
        assert self.proc.stdin is not None
        self.proc.stdin.write((" ".join(str(w) for w in words) + "\n").encode())
        self.proc.stdin.flush()
        result = self.read()
        if "error" in result:
            raise RuntimeError(f"driver: {result['error']}; see {self.log.name}")
        return result

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"quit\n")
            self.proc.stdin.flush()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# -- CPU and memory -------------------------------------------------------------------------------------------
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of the process `pid`, all its threads (not its children: the benchmark's own
    process is the parent of every server). 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14 and 15 of stat)


def peak_rss_bytes(pid: int) -> int:
    """The peak resident set (VmHWM) of the process `pid` (not its children); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def self_pid() -> int:
    return os.getpid()


if __name__ == "__main__":  # print the classpaths (resolving them first)
    for name in POMS:
        print(name, len(classpath(name).split(os.pathsep)), "jars", file=sys.stderr)
