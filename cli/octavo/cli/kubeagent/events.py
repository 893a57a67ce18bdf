"""Events about a pod, as a kubelet records them (`kubectl describe pod`, `kubectl get events`): Started,
Killing, Unhealthy, BackOff, Failed. Best effort: an event that cannot be written is logged, and the pod goes on."""

from __future__ import annotations

import logging
import time
from typing import Any

from octavo.cli.kubeagent import api as k

log = logging.getLogger("octavo.kubeagent")


def record(api: k.Api, node: str, pod: dict[str, Any], container: str, reason: str, message: str,
           kind: str = "Normal") -> None:
    meta = pod["metadata"]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    involved = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "namespace": meta["namespace"],
                "uid": meta["uid"]}
    if container:
        involved["fieldPath"] = f"spec.containers{{{container}}}"
    body = {"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": involved, "reason": reason, "message": message[:1024], "type": kind,
            "source": {"component": "kubelet", "host": node}, "reportingComponent": "kubelet",
            "reportingInstance": node, "firstTimestamp": now, "lastTimestamp": now, "count": 1}
    try:
        api.create(k.core(meta["namespace"], "events"), body)
    except k.ApiError as e:
        log.warning("pod %s/%s: event %s not recorded: %s", meta["namespace"], meta["name"], reason, e)
