"""One pod on a node, as a kubelet runs it: a thread that prepares the pod's volumes and environment, runs its
init containers in order and then its containers, restarts them per restartPolicy with back-off, runs their
probes, reports the pod's status, and on deletion stops them (SIGTERM, the grace period, SIGKILL) and removes
the pod object (a delete with grace 0, as a kubelet does)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from octavo.cli.kubeagent import api as k
from octavo.cli.kubeagent import events, images
from octavo.cli.kubeagent.containers import Container, Launch, rfc3339
from octavo.cli.kubeagent.podspec import MissingReference, environment, expand, service_variables
from octavo.cli.kubeagent.status import pod_status
from octavo.cli.kubeagent.volumes import Mount, Volumes, container_mounts

log = logging.getLogger("octavo.kubeagent")

TICK_S = 0.2
PREPARE_RETRY_S = 1.0
STATUS_RESYNC_S = 30.0
GRACE_S_DEFAULT = 30


@dataclass(frozen=True)
class PodAddress:
    """Where a pod lives on the network: its IP, the network namespace its containers join (None: the host's),
    and files bound into every container (the pod's /etc/hosts and /etc/resolv.conf, for example)."""

    ip: str
    netns: str | None = None
    files: tuple[Mount, ...] = ()


class PodNetwork(Protocol):
    """What the node agent needs of pod networking (network.py, or the loopback fallback in addresses.py)."""

    def node_ip(self, node: str) -> str: ...

    def attach(self, pod: dict[str, Any]) -> PodAddress: ...

    def detach(self, pod: dict[str, Any]) -> None: ...

    def kubernetes_service(self) -> tuple[str, int]: ...


@dataclass(frozen=True)
class NodeContext:
    """What every pod of one node shares."""

    name: str
    api: k.Api
    root: Path
    network: PodNetwork
    allocatable: dict[str, str]


class PodWorker:
    def __init__(self, node: NodeContext, pod: dict[str, Any]) -> None:
        self.node = node
        self.pod = pod
        meta = pod["metadata"]
        self.namespace, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.dir = node.root / "pods" / self.uid
        self.policy = pod["spec"].get("restartPolicy") or "Always"
        self.init = [Container(c, self.dir, init=True) for c in pod["spec"].get("initContainers") or []]
        self.containers = [Container(c, self.dir) for c in pod["spec"]["containers"]]
        self.address: PodAddress | None = None
        self.volume_paths: dict[str, str] | None = None
        self.start_time = rfc3339()
        self.message = ""
        self.reason = ""
        self._deleting = threading.Event()
        self._gone = threading.Event()  # the pod object is gone: stop at once, write nothing
        self._grace_s = float(GRACE_S_DEFAULT)
        self._published: dict[str, Any] | None = None
        self._published_mono = 0.0
        self._thread = threading.Thread(target=self._main, name=f"pod-{self.namespace}-{self.name}", daemon=True)
        self.lock = threading.Lock()

    # -- what the node loop calls --------------------------------------------------------------------------------
    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def update(self, pod: dict[str, Any]) -> None:
        """A newer copy of the pod object (its deletion timestamp, its conditions)."""
        with self.lock:
            self.pod = pod
        deletion = pod["metadata"].get("deletionTimestamp")
        if deletion and not self._deleting.is_set():
            grace = pod["metadata"].get("deletionGracePeriodSeconds")
            self._grace_s = float(grace if grace is not None else
                                  pod["spec"].get("terminationGracePeriodSeconds", GRACE_S_DEFAULT))
            self._deleting.set()

    def gone(self) -> None:
        """The pod object was removed (a forced delete): kill its processes without waiting."""
        self._gone.set()
        self._deleting.set()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def container(self, name: str) -> Container | None:
        return next((c for c in [*self.init, *self.containers] if c.name == name), None)

    # -- the thread ----------------------------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._run()
        except Exception as e:
            log.exception("pod %s/%s: the worker failed", self.namespace, self.name)
            self._kill_all()
            self._waiting_all("CreateContainerError", f"the node agent failed on this pod: {e!r}")
            self._publish(force=True)

    def _run(self) -> None:
        while not self._deleting.is_set() and not self._prepare():
            self._publish()
            self._deleting.wait(PREPARE_RETRY_S)
        next_init = 0
        while not self._deleting.is_set():
            now = time.monotonic()
            if next_init < len(self.init):
                next_init = self._step_init(next_init, now)
            else:
                self._step_containers(now)
            self._publish()
            self._deleting.wait(TICK_S)
        self._terminate()

    def _prepare(self) -> bool:
        """Network, volumes and each container's Launch; False (with the reason in the status) to retry."""
        try:
            if self.address is None:
                self.address = self.node.network.attach(self.pod)
                with self.lock:
                    self.pod = {**self.pod, "status": {**(self.pod.get("status") or {}), "podIP": self.address.ip,
                                                       "podIPs": [{"ip": self.address.ip}],
                                                       "hostIP": self.node.network.node_ip(self.node.name)}}
            if self.volume_paths is None:
                self.volume_paths = Volumes(self.node.api, self.pod, self.dir, self.node.allocatable).prepare()
            for c in [*self.init, *self.containers]:
                c.launch = self._launch(c.spec)
        except MissingReference as e:
            self._waiting_all("CreateContainerConfigError", str(e))
            return False
        except k.ApiError as e:
            self._waiting_all("ContainerCreating", str(e))
            return False
        except (ValueError, OSError) as e:
            self._waiting_all("CreateContainerError", str(e))
            return False
        for c in self.init[:1] or self.containers:
            c.waiting("PodInitializing" if c.init else "ContainerCreating")
        return True

    def _event(self, container: str, reason: str, message: str, kind: str = "Normal") -> None:
        with self.lock:
            pod = self.pod
        events.record(self.node.api, self.node.name, pod, container, reason, message, kind)

    def _waiting_all(self, reason: str, message: str) -> None:
        log.info("pod %s/%s: %s: %s", self.namespace, self.name, reason, message)
        if message != self.message:  # once per distinct trouble, not once per retry
            self.message = message
            self._event("", "Failed", f"{reason}: {message}", "Warning")
        for c in [*self.init, *self.containers]:
            c.waiting(reason, message)

    def _launch(self, spec: dict[str, Any]) -> Launch:
        assert self.address is not None and self.volume_paths is not None
        image = images.resolve(spec.get("image", ""))
        host, port = self.node.network.kubernetes_service()
        base = {"PATH": images.program_path(), "HOME": "/root", "HOSTNAME": self._hostname(), **image.env,
                "KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": str(port),
                "KUBERNETES_SERVICE_PORT_HTTPS": str(port), "KUBERNETES_PORT": f"tcp://{host}:{port}",
                "KUBERNETES_PORT_443_TCP": f"tcp://{host}:{port}", "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
                "KUBERNETES_PORT_443_TCP_PORT": str(port), "KUBERNETES_PORT_443_TCP_ADDR": host}
        if self.pod["spec"].get("enableServiceLinks", True):
            services = [s for s in self.node.api.items(k.core(self.namespace, "services"))
                        if s["metadata"]["name"] != "kubernetes"]
            base = {**service_variables(services), **base}
        volumes = Volumes(self.node.api, self.pod, self.dir, self.node.allocatable)

        def lookup(kind: str, name: str) -> dict[str, str] | None:
            data = volumes.lookup(kind, name)
            return None if data is None else {key: v.decode(errors="replace") for key, v in data.items()}

        env = environment(self.pod, spec, lookup, base, self.node.allocatable)
        argv = [expand(a, env) for a in images.argv(spec)]
        mounts = [*self.address.files, *container_mounts(spec, self.volume_paths)]
        return Launch(argv=argv, env=env, cwd=spec.get("workingDir") or image.working_dir,
                      hostname=self._hostname(), netns=self.address.netns, mounts=mounts)

    def _hostname(self) -> str:
        return str(self.pod["spec"].get("hostname") or self.name)[:63]

    def _step_init(self, index: int, now: float) -> int:
        """Run init container `index` to success; the index of the next one to run."""
        c = self.init[index]
        if c.proc is None:
            assert c.launch is not None
            c.start(c.launch, now)
            self._event(c.name, "Started", f"Started container {c.name}")
            return index
        if c.poll_exit(now) and c.exit_code == 0:
            c.ready = True
            if index + 1 < len(self.init):
                self.init[index + 1].waiting("PodInitializing")
            else:
                for m in self.containers:
                    m.waiting("PodInitializing")
            return index + 1
        if c.exit_code not in (None, 0):
            if self.policy == "Never":
                return index  # the pod has failed; nothing more runs
            if c.restart_due(now):
                c.restart(now)
                self._event(c.name, "Started", f"Started container {c.name} (restart {c.restart_count})")
            else:
                c.waiting("CrashLoopBackOff", f"back-off {c.backoff_s:.0f}s restarting failed container")
        return index

    def _step_containers(self, now: float) -> None:
        ip = self.address.ip if self.address else ""
        for c in self.containers:
            if c.proc is None:
                assert c.launch is not None
                c.start(c.launch, now)
                self._event(c.name, "Started", f"Started container {c.name}")
                continue
            if c.poll_exit(now):
                log.info("pod %s/%s: container %s exited with %s", self.namespace, self.name, c.name, c.exit_code)
                continue
            if not c.running():
                if c.should_restart(self.policy):
                    if c.restart_due(now):
                        c.restart(now)
                        self._event(c.name, "Started", f"Started container {c.name} (restart {c.restart_count})")
                    elif "terminated" in c.state and now - c.exited_mono > TICK_S * 2:
                        c.last_state = c.state
                        c.waiting("CrashLoopBackOff", f"back-off {c.backoff_s:.0f}s restarting failed container")
                        self._event(c.name, "BackOff", f"Back-off {c.backoff_s:.0f}s restarting container {c.name} "
                                    f"(exit code {c.exit_code})", "Warning")
                continue
            if c.run_probes(now, ip) == "restart":
                log.info("pod %s/%s: container %s failed its liveness or start-up probe: restarting",
                         self.namespace, self.name, c.name)
                self._event(c.name, "Unhealthy", f"Container {c.name} failed its liveness or start-up probe, "
                            f"it will be restarted", "Warning")
                self._stop_container(c, float(self.pod["spec"].get("terminationGracePeriodSeconds",
                                                                   GRACE_S_DEFAULT)))
                c.poll_exit(time.monotonic())

    # -- deletion ------------------------------------------------------------------------------------------------
    def _stop_container(self, c: Container, grace_s: float) -> None:
        if not c.running():
            return
        c.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while c.running() and time.monotonic() < deadline and not self._gone.is_set():
            time.sleep(0.05)
        c.kill()

    def _terminate(self) -> None:
        if self._gone.is_set():
            self._kill_all()
        else:
            running = [c for c in [*self.init, *self.containers] if c.running()]
            for c in running:
                self._event(c.name, "Killing", f"Stopping container {c.name} (grace period {self._grace_s:.0f}s)")
                c.signal(signal.SIGTERM)
            deadline = time.monotonic() + self._grace_s
            while any(c.running() for c in running) and time.monotonic() < deadline and not self._gone.is_set():
                time.sleep(0.05)
            self._kill_all()
        now = time.monotonic()
        for c in [*self.init, *self.containers]:
            c.poll_exit(now)
        with self.lock:
            self.node.network.detach(self.pod)
        if self._gone.is_set():
            return
        self._publish(force=True)
        try:
            self.node.api.delete(k.core(self.namespace, "pods", self.name),
                                 {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}})
        except k.ApiError as e:
            log.warning("pod %s/%s: could not remove the pod object: %s", self.namespace, self.name, e)

    def _kill_all(self) -> None:
        for c in [*self.init, *self.containers]:
            c.kill()

    # -- status --------------------------------------------------------------------------------------------------
    def _publish(self, force: bool = False) -> None:
        with self.lock:
            pod = self.pod
        previous = (self._published or {}).get("conditions")
        status = pod_status(pod, self.init, self.containers, self.policy,
                            pod_ip=self.address.ip if self.address else "",
                            host_ip=self.node.network.node_ip(self.node.name), start_time=self.start_time,
                            now=rfc3339(), previous=previous)
        now = time.monotonic()
        if not force and status == self._published and now - self._published_mono < STATUS_RESYNC_S:
            return
        try:
            self.node.api.patch(k.core(self.namespace, "pods", self.name, "status"),
                                {"metadata": {"uid": self.uid}, "status": status})
        except k.ApiError as e:
            if e.status == 404:
                return
            log.warning("pod %s/%s: status not written: %s", self.namespace, self.name, e)
            return
        self._published, self._published_mono = status, now
