"""Container probes as a kubelet runs them: httpGet, tcpSocket, grpc and exec, each with initialDelaySeconds,
periodSeconds, timeoutSeconds, successThreshold and failureThreshold. `ProbeState` is the counting (pure: the
time is passed in); `run` is the IO. An exec probe runs in the container's mount, network and UTS namespaces
(nsenter into its process), with its environment."""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
from dataclasses import dataclass
from typing import Any

from octavo.cli.kubeagent.podspec import container_port

PERIOD_S_DEFAULT = 10
TIMEOUT_S_DEFAULT = 1
FAILURE_THRESHOLD_DEFAULT = 3


@dataclass
class ProbeState:
    """One probe of one container run. `result` is None until the thresholds first decide it."""

    probe: dict[str, Any]
    started_at: float
    result: bool | None = None
    successes: int = 0
    failures: int = 0
    next_at: float = 0.0

    def __post_init__(self) -> None:
        self.next_at = self.started_at + float(self.probe.get("initialDelaySeconds") or 0)

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def record(self, now: float, ok: bool) -> bool | None:
        """Count one probe's outcome; the probe's result (None while undecided)."""
        self.next_at = now + float(self.probe.get("periodSeconds") or PERIOD_S_DEFAULT)
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= int(self.probe.get("successThreshold") or 1):
                self.result = True
        else:
            self.failures, self.successes = self.failures + 1, 0
            if self.failures >= int(self.probe.get("failureThreshold") or FAILURE_THRESHOLD_DEFAULT):
                self.result = False
        return self.result


def run(probe: dict[str, Any], container: dict[str, Any], pod_ip: str, pid: int, env: dict[str, str]) -> bool:
    """One probe now: True when it passed."""
    timeout_s = float(probe.get("timeoutSeconds") or TIMEOUT_S_DEFAULT)
    try:
        if "httpGet" in probe:
            return _http(probe["httpGet"], container, pod_ip, timeout_s)
        if "tcpSocket" in probe:
            port = container_port(container, probe["tcpSocket"]["port"])
            with socket.create_connection((probe["tcpSocket"].get("host") or pod_ip, port), timeout=timeout_s):
                return True
        if "grpc" in probe:
            return _grpc(probe["grpc"], pod_ip, timeout_s)
        if "exec" in probe:
            out = subprocess.run(["nsenter", f"--target={pid}", "--mount", "--net", "--uts", "--",
                                  *probe["exec"]["command"]], env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout_s, check=False)
            return out.returncode == 0
    except (OSError, subprocess.TimeoutExpired, ValueError, http.client.HTTPException):
        return False
    raise ValueError(f"probe {sorted(probe)} has no handler the node agent knows")


def _http(get: dict[str, Any], container: dict[str, Any], pod_ip: str, timeout_s: float) -> bool:
    host, port = get.get("host") or pod_ip, container_port(container, get["port"])
    if get.get("scheme", "HTTP").upper() == "HTTPS":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, port, timeout=timeout_s, context=ssl._create_unverified_context())  # the kubelet does not verify
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
        headers.setdefault("User-Agent", "kube-probe/octavo")
        conn.request("GET", get.get("path") or "/", headers=headers)
        return 200 <= conn.getresponse().status < 400
    finally:
        conn.close()


def _grpc(spec: dict[str, Any], pod_ip: str, timeout_s: float) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"{pod_ip}:{int(spec['port'])}") as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=spec.get("service") or ""), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)
