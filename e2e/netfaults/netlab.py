"""A private test network of Linux network namespaces, and the faults it can inject (issue 16).

Layout: one "switch" namespace holding a bridge; each host (etcd member, bookie, client process) a namespace of
its own, joined to the bridge by a veth pair, with one address of a private /24 this lab picks (10.X.Y.0/24, a
subnet no route or address of this machine uses) and its own loopback. The namespace the tests run in gets an
observer leg on the bridge (address .254) that is never cut: the checker reads through it after healing. Only
addresses of this lab are ever targeted, and everything is removed on close (deleting a namespace removes its
interfaces; processes started in it are killed first).

Faults, and what each really does on this kernel (tc netem is not available here, so no added delay; loss and a
bandwidth cap come from nftables instead):
- `cut(a, b)`: nftables rules in both hosts drop every packet between their two addresses, both ways. Nothing
  is answered: no RST, no ICMP. Open TCP connections stall; new ones time out. Peers see silence (gRPC
  deadlines, keepalives, etcd lease expiry), never an error. Healed by deleting the two set elements; stalled
  connections resume if neither side gave up.
- `isolate(a)`: `cut` from every other host (the observer leg stays).
- `partition(g1, g2, ...)`: `cut` every pair across groups; `bridge(a, b, c)`: a and c cannot talk, both talk to
  b (Jepsen's "bridge").
- `lossy(a, b)`: nftables drops LOSS_PERCENT of the packets between the two hosts, each way, at random
  (`numgen random`). TCP retransmits: connections stay up and deliver every byte intact, slowly and in bursts
  (retransmission timeouts back off to seconds); gRPC calls near their deadlines fail, keepalives may trip.
- `throttle(a, b)`: each host drops what the other sends it beyond THROTTLE_KBYTES_S (one budget per
  receiving host, shared by every peer throttled towards it), so TCP slows to about that rate: a congested link.
- `link_down(a)`: the host's interface goes down: its own sends fail at once (no route: ENETUNREACH), the others
  see silence. Different from `isolate` from the host's own side.
- Processes: SIGKILL (a crash) and SIGSTOP/SIGCONT (a pause: the process holds its sockets but answers nothing,
  like a long GC pause or a frozen VM) are the test's, on the Popen objects `start` returns.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

TABLE = "octavo_netlab"
LOSS_PERCENT = 10  # of the packets between two hosts made `lossy`, each way
THROTTLE_KBYTES_S = 256  # what a host receives from the peers throttled towards it, at most


class NetLabUnavailable(RuntimeError):
    pass


def _run(*argv: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, input=input)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


def unavailable() -> str:
    """Why this machine cannot run the lab ("" when it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (the tests run as root on CI)"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command (Debian's iproute2 / nftables: `make system-packages` installs them as root)"
    probe = f"octprobe{os.getpid()}"
    done = _run("ip", "netns", "add", probe, check=False)
    if done.returncode != 0:
        return f"`ip netns add` refused: {done.stderr.strip()}"
    try:
        nft = _run("ip", "netns", "exec", probe, "nft", "add", "table", "inet", TABLE, check=False)
        if nft.returncode != 0:
            return f"nftables refused in a namespace: {nft.stderr.strip()}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return ""


def _free_subnet() -> ipaddress.IPv4Network:
    used = _run("ip", "-4", "-o", "addr").stdout + _run("ip", "-4", "route").stdout
    nets = []
    for word in used.split():
        try:
            nets.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            continue
    rng = random.Random(os.getpid() ^ time.time_ns())
    for _ in range(200):
        candidate = ipaddress.ip_network(f"10.{rng.randint(200, 250)}.{rng.randint(0, 255)}.0/24")
        if not any(candidate.overlaps(n) for n in nets if n.prefixlen > 0):
            return candidate
    raise NetLabUnavailable("no free 10.x.y.0/24 subnet on this machine")


@dataclass
class Host:
    name: str
    namespace: str
    address: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)


class NetLab:
    def __init__(self, root: str | Path) -> None:
        reason = unavailable()
        if reason:
            raise NetLabUnavailable(reason)
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.tag = f"o{os.getpid() % 10000}{random.randrange(16 ** 3):03x}"
        self.subnet = _free_subnet()
        self.hosts: dict[str, Host] = {}
        self.cuts: set[frozenset[str]] = set()
        self.lossy_pairs: set[frozenset[str]] = set()
        self.throttled_pairs: set[frozenset[str]] = set()
        self.down: set[str] = set()
        self.switch = f"{self.tag}-sw"
        self._namespaces: list[str] = []
        self._links = 0
        self._namespace(self.switch)
        _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        # The observer leg, in the tests' own namespace.
        self.observer = str(self.subnet[254])
        self._observer_link = self._veth(None, self.observer)

    # -- building --------------------------------------------------------------------------------------------
    def _namespace(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self._namespaces.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")

    def _veth(self, namespace: str | None, address: str) -> str:
        """A veth pair: one end (eth0, or a named link in the tests' namespace) with `address`, the other on
        the bridge."""
        self._links += 1
        inner, outer = f"{self.tag}a{self._links}", f"{self.tag}b{self._links}"
        _run("ip", "link", "add", inner, "type", "veth", "peer", "name", outer)
        _run("ip", "link", "set", outer, "netns", self.switch)
        _run("ip", "-n", self.switch, "link", "set", outer, "master", "br0")
        _run("ip", "-n", self.switch, "link", "set", outer, "up")
        if namespace is None:
            _run("ip", "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", inner)
            _run("ip", "link", "set", inner, "up")
            return inner
        _run("ip", "link", "set", inner, "netns", namespace)
        _run("ip", "-n", namespace, "link", "set", inner, "name", "eth0")
        _run("ip", "-n", namespace, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
        _run("ip", "-n", namespace, "link", "set", "eth0", "up")
        return "eth0"

    def add_host(self, name: str) -> Host:
        if name in self.hosts or len(self.hosts) >= 200:
            raise ValueError(f"host {name!r} exists, or the lab is full")
        namespace = f"{self.tag}-{name}"
        address = str(self.subnet[len(self.hosts) + 1])
        self._namespace(namespace)
        self._veth(namespace, address)
        _run("ip", "netns", "exec", namespace, "nft", "-f", "-", input=(
            f"table inet {TABLE} {{\n"
            "  set blocked { type ipv4_addr; }\n"
            "  set lossy { type ipv4_addr; }\n"
            "  set throttled { type ipv4_addr; }\n"
            "  chain input { type filter hook input priority 0; policy accept;\n"
            "    ip saddr @blocked drop\n"
            f"    ip saddr @lossy numgen random mod 100 < {LOSS_PERCENT} counter drop comment \"loss\"\n"
            f"    ip saddr @throttled limit rate over {THROTTLE_KBYTES_S} kbytes/second counter drop"
            " comment \"throttle\"\n  }\n"
            "  chain output { type filter hook output priority 0; policy accept;\n"
            "    ip daddr @blocked drop\n"
            f"    ip daddr @lossy numgen random mod 100 < {LOSS_PERCENT} counter drop comment \"loss\"\n  }}\n"
            "}\n"))
        host = Host(name, namespace, address)
        self.hosts[name] = host
        return host

    # -- processes -------------------------------------------------------------------------------------------
    def start(self, host: str, argv: Sequence[str], log: str | Path, env: dict[str, str] | None = None
              ) -> subprocess.Popen[bytes]:
        """Run argv in the host's namespace (its own process group), output to `log`."""
        h = self.hosts[host]
        with open(log, "ab") as out:
            proc = subprocess.Popen(["ip", "netns", "exec", h.namespace, *argv], stdout=out,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True)
        h.procs.append(proc)
        return proc

    def run(self, host: str, argv: Sequence[str], timeout_s: float = 120,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.hosts[host].namespace, *argv], capture_output=True,
                              text=True, timeout=timeout_s, env=env)

    # -- faults ----------------------------------------------------------------------------------------------
    def _block(self, a: str, b: str, on: bool, kind: str = "blocked") -> None:
        for here, there in ((a, b), (b, a)):
            verb = "add" if on else "delete"
            _run("ip", "netns", "exec", self.hosts[here].namespace, "nft", verb, "element", "inet", TABLE,
                 kind, f"{{ {self.hosts[there].address} }}", check=on)

    def lossy(self, a: str, b: str) -> None:
        """Drop LOSS_PERCENT of the packets between a and b, each way, at random."""
        pair = frozenset((a, b))
        if a != b and pair not in self.lossy_pairs:
            self._block(a, b, True, "lossy")
            self.lossy_pairs.add(pair)

    def throttle(self, a: str, b: str) -> None:
        """Cap what a and b receive from each other at THROTTLE_KBYTES_S (excess dropped)."""
        pair = frozenset((a, b))
        if a != b and pair not in self.throttled_pairs:
            self._block(a, b, True, "throttled")
            self.throttled_pairs.add(pair)

    def dropped(self, host: str) -> dict[str, int]:
        """Packets the host's loss and throttle rules dropped so far (by rule comment, summed over chains)."""
        listing = _run("ip", "netns", "exec", self.hosts[host].namespace, "nft", "-j", "list", "table", "inet",
                       TABLE).stdout
        counts: dict[str, int] = {"loss": 0, "throttle": 0}
        for item in json.loads(listing)["nftables"]:
            rule = item.get("rule")
            if rule and rule.get("comment") in counts:
                counts[rule["comment"]] += sum(e["counter"]["packets"] for e in rule["expr"] if "counter" in e)
        return counts

    def cut(self, a: str, b: str) -> None:
        pair = frozenset((a, b))
        if a != b and pair not in self.cuts:
            self._block(a, b, True)
            self.cuts.add(pair)

    def heal(self, a: str, b: str) -> None:
        pair = frozenset((a, b))
        if pair in self.cuts:
            self._block(a, b, False)
            self.cuts.discard(pair)

    def isolate(self, a: str, keep: Iterable[str] = ()) -> None:
        """Cut `a` from every other host except `keep`."""
        kept = set(keep)
        for other in self.hosts:
            if other != a and other not in kept:
                self.cut(a, other)

    def partition(self, *groups: Iterable[str]) -> None:
        sets = [set(g) for g in groups]
        for i, g in enumerate(sets):
            for other in sets[i + 1:]:
                for a in g:
                    for b in other:
                        self.cut(a, b)

    def bridge(self, a: str, b: str, c: str) -> None:
        """a and c cannot talk; both talk to b."""
        self.cut(a, c)
        self.heal(a, b)
        self.heal(b, c)

    def link_down(self, a: str) -> None:
        _run("ip", "-n", self.hosts[a].namespace, "link", "set", "eth0", "down")
        self.down.add(a)

    def link_up(self, a: str) -> None:
        _run("ip", "-n", self.hosts[a].namespace, "link", "set", "eth0", "up")
        self.down.discard(a)

    def heal_all(self) -> None:
        for pair in list(self.cuts):
            a, b = sorted(pair)
            self.heal(a, b)
        for kind, pairs in (("lossy", self.lossy_pairs), ("throttled", self.throttled_pairs)):
            for pair in list(pairs):
                a, b = sorted(pair)
                self._block(a, b, False, kind)
                pairs.discard(pair)
        for a in list(self.down):
            self.link_up(a)

    # -- teardown --------------------------------------------------------------------------------------------
    def close(self) -> None:
        for host in self.hosts.values():
            for proc in host.procs:
                if proc.poll() is None:
                    try:
                        os.killpg(proc.pid, signal.SIGCONT)
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    proc.wait(10)
        _run("ip", "link", "del", self._observer_link, check=False)
        for namespace in reversed(self._namespaces):
            _run("ip", "netns", "del", namespace, check=False)
        self._namespaces.clear()

    def __enter__(self) -> NetLab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
