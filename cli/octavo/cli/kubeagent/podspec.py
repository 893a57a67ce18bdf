"""What a kubelet derives from a pod's spec before it starts anything, as pure functions: `$(VAR)` expansion,
the environment (value, fieldRef, resourceFieldRef, configMapKeyRef, secretKeyRef, envFrom), field values of the
downward API, and resource quantities. Reading ConfigMaps and Secrets is passed in (`Lookup`); a missing one is
`MissingReference`, which keeps the container from starting (unless the reference is optional), as the kubelet
does ("CreateContainerConfigError")."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

# kind ("configmaps" or "secrets"), name -> the object's data decoded to text, or None when it does not exist.
Lookup = Callable[[str, str], "dict[str, str] | None"]

_SUFFIXES: dict[str, Decimal | int] = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
             "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")


class MissingReference(RuntimeError):
    """A ConfigMap, Secret or key that the pod needs does not exist (yet)."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: a defined VAR is replaced, an undefined one left as written, and `$$`
    escapes a `$` (`$$(VAR)` gives `$(VAR)`)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            if text[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            if text[i + 1] == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2:end]
                    out.append(env[name] if name in env else text[i:end + 1])
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


def quantity(value: str | int | float) -> Decimal:
    """A resource quantity ("500m", "1Gi", "2") as a number of its unit (cores, bytes)."""
    match = _QUANTITY.match(str(value).strip())
    if match is None or match.group(2) not in _SUFFIXES:
        raise ValueError(f"not a resource quantity: {value!r}")
    return Decimal(match.group(1)) * Decimal(_SUFFIXES[match.group(2)])


def field_value(pod: dict[str, Any], path: str) -> str:
    """A downward-API fieldRef: metadata.name/namespace/uid, metadata.labels['k'] and annotations['k'] (or all of
    them, one `k="v"` a line), spec.nodeName, spec.serviceAccountName, status.podIP(s), status.hostIP(s)."""
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name", ""), "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""), "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": status.get("podIP", ""), "status.hostIP": status.get("hostIP", ""),
        "status.podIPs": ",".join(i["ip"] for i in status.get("podIPs") or []),
        "status.hostIPs": ",".join(i["ip"] for i in status.get("hostIPs") or []),
    }
    if path in simple:
        return str(simple[path])
    match = re.fullmatch(r"metadata\.(labels|annotations)(?:\['(.+)'\])?", path)
    if match is None:
        raise ValueError(f"unsupported fieldRef {path!r}")
    values = meta.get(match.group(1)) or {}
    if match.group(2) is not None:
        return str(values.get(match.group(2), ""))
    return "".join(f'{k}="{v}"\n' for k, v in sorted(values.items()))


def resource_value(container: dict[str, Any], ref: dict[str, Any], allocatable: Mapping[str, str]) -> str:
    """A resourceFieldRef (limits.cpu, requests.memory, ...) divided by its divisor and rounded up, as the kubelet
    does; a limit that is not set is the node's allocatable."""
    kind, _, resource = ref["resource"].partition(".")
    resources = container.get("resources") or {}
    raw = (resources.get(kind) or {}).get(resource)
    if raw is None and kind == "requests":
        raw = (resources.get("limits") or {}).get(resource)
    if raw is None:
        raw = allocatable.get(resource, "0") if kind == "limits" else "0"
    divisor = quantity(ref.get("divisor") or "1") or Decimal(1)  # the API server defaults it to "0"
    return str(max(0 if kind == "requests" else 1, math.ceil(quantity(raw) / divisor)))


def environment(pod: dict[str, Any], container: dict[str, Any], lookup: Lookup, base: Mapping[str, str],
                allocatable: Mapping[str, str]) -> dict[str, str]:
    """The container's environment: `base` (the image's and the service variables), then envFrom, then env in
    order, each value expanded against what came before it."""
    env = dict(base)
    for source in container.get("envFrom") or []:
        kind, ref = (("configmaps", source["configMapRef"]) if "configMapRef" in source
                     else ("secrets", source["secretRef"]))
        data = lookup(kind, ref["name"])
        if data is None:
            if ref.get("optional"):
                continue
            raise MissingReference(f"{kind[:-1]} {ref['name']!r} (envFrom) does not exist")
        prefix = source.get("prefix", "")
        env.update({prefix + k: v for k, v in data.items()})
    for item in container.get("env") or []:
        name = item["name"]
        if "valueFrom" not in item:
            env[name] = expand(str(item.get("value", "")), env)
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            env[name] = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            ref = source["resourceFieldRef"]
            named = container
            if ref.get("containerName"):
                named = next(c for c in pod["spec"]["containers"] if c["name"] == ref["containerName"])
            env[name] = resource_value(named, ref, allocatable)
        else:
            kind, ref = (("configmaps", source["configMapKeyRef"]) if "configMapKeyRef" in source
                         else ("secrets", source["secretKeyRef"]))
            data = lookup(kind, ref["name"])
            if data is None or ref["key"] not in data:
                if ref.get("optional"):
                    continue
                what = f"{kind[:-1]} {ref['name']!r}" + ("" if data is None else f" has no key {ref['key']!r}")
                raise MissingReference(f"{what} (env {name})" + (" does not exist" if data is None else ""))
            env[name] = data[ref["key"]]
    return env


def service_variables(services: list[dict[str, Any]]) -> dict[str, str]:
    """The Docker-link variables a kubelet gives every container of a namespace (enableServiceLinks)."""
    env: dict[str, str] = {}
    for svc in services:
        ip = svc["spec"].get("clusterIP")
        if not ip or ip == "None":
            continue
        name = svc["metadata"]["name"].upper().replace("-", "_")
        ports = svc["spec"].get("ports") or []
        env[f"{name}_SERVICE_HOST"] = ip
        if not ports:
            continue
        env[f"{name}_SERVICE_PORT"] = str(ports[0]["port"])
        for port in ports:
            if port.get("name"):
                env[f"{name}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}"] = str(port["port"])
            proto = port.get("protocol", "TCP")
            prefix = f"{name}_PORT_{port['port']}_{proto}"
            env.update({prefix: f"{proto.lower()}://{ip}:{port['port']}", f"{prefix}_PROTO": proto.lower(),
                        f"{prefix}_PORT": str(port["port"]), f"{prefix}_ADDR": ip})
        first = ports[0]
        env[f"{name}_PORT"] = f"{first.get('protocol', 'TCP').lower()}://{ip}:{first['port']}"
    return env


def container_port(container: dict[str, Any], port: int | str) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"container {container['name']!r} has no port named {port!r}")
