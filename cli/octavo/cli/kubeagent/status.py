"""A pod's status from its containers, as a kubelet computes it (pure): the phase, the conditions
(PodScheduled, Initialized, ContainersReady, Ready) and the container statuses. A condition keeps its
lastTransitionTime while its status stays the same, so an unchanged pod gives an equal status."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class ContainerView(Protocol):
    @property
    def name(self) -> str: ...

    ready: bool
    exit_code: int | None

    def running(self) -> bool: ...

    def should_restart(self, policy: str) -> bool: ...

    def status(self, image_id: str) -> dict[str, Any]: ...


def phase(init: Sequence[ContainerView], containers: Sequence[ContainerView], policy: str) -> str:
    """Pending until the init containers succeeded and a container ran; Succeeded or Failed once every container
    has terminated for good; Running otherwise."""
    if any(c.exit_code not in (None, 0) and policy == "Never" for c in init):
        return "Failed"
    if any(c.exit_code != 0 for c in init):
        return "Pending"
    if all(c.exit_code is None and not c.running() for c in containers):
        return "Pending"
    final = [c for c in containers if c.exit_code is not None and not c.running() and not c.should_restart(policy)]
    if len(final) == len(containers):
        return "Succeeded" if all(c.exit_code == 0 for c in final) else "Failed"
    return "Running"


def conditions(pod: dict[str, Any], previous: list[dict[str, Any]], initialized: bool, ready: bool,
               now: str) -> list[dict[str, Any]]:
    before = {c["type"]: c for c in previous}
    wanted = {"PodScheduled": True, "Initialized": initialized, "ContainersReady": ready, "Ready": ready}
    out = [c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] not in wanted]
    for kind, ok in wanted.items():
        status = "True" if ok else "False"
        old = before.get(kind)
        since = now if old is None or old.get("status") != status else old.get("lastTransitionTime", now)
        condition = {"type": kind, "status": status, "lastProbeTime": None, "lastTransitionTime": since}
        if kind in ("ContainersReady", "Ready") and not ok:
            condition["reason"] = "ContainersNotReady" if initialized else "PodInitializing"
        out.append(condition)
    return out


def pod_status(pod: dict[str, Any], init: Sequence[ContainerView], containers: Sequence[ContainerView],
               policy: str, pod_ip: str, host_ip: str, start_time: str, now: str,
               previous: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    current = phase(init, containers, policy)
    initialized = all(c.exit_code == 0 for c in init)
    ready = current == "Running" and all(c.ready for c in containers)
    status: dict[str, Any] = {
        "phase": current, "startTime": start_time,
        "conditions": conditions(pod, previous if previous is not None else
                                 (pod.get("status") or {}).get("conditions") or [], initialized, ready, now),
        "containerStatuses": [c.status(_image_id(c, pod)) for c in containers],
    }
    if init:
        status["initContainerStatuses"] = [c.status(_image_id(c, pod)) for c in init]
    if pod_ip:
        status.update(podIP=pod_ip, podIPs=[{"ip": pod_ip}])
    if host_ip:
        status.update(hostIP=host_ip, hostIPs=[{"ip": host_ip}])
    return status


def _image_id(c: ContainerView, pod: dict[str, Any]) -> str:
    for spec in [*(pod["spec"].get("initContainers") or []), *pod["spec"]["containers"]]:
        if spec["name"] == c.name:
            return f"octavo-local://{spec.get('image', '')}"
    return ""

