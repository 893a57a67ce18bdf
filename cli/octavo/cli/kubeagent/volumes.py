"""A pod's volumes as directories on this host, and each container's mounts of them.

ConfigMap, Secret, projected (serviceAccountToken by the TokenRequest API, configMap, secret, downwardAPI) and
downwardAPI volumes are written out under the pod's directory (ROOT/pods/<uid>/volumes/<name>) when the pod
starts; emptyDir is a directory there; persistentVolumeClaim is its bound PersistentVolume's local path (the
provisioner's directory under ROOT/volumes); hostPath is the path itself. The launcher (launch.py) then binds
each mount at its absolute path in the container's own mount namespace.

What is not done: a ConfigMap or Secret changed after the pod started is not written again, and a projected token
is not refreshed (the API server issues tokens for a year to a kubelet's 1-hour request,
--service-account-extend-token-expiration)."""

from __future__ import annotations

import base64
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from octavo.cli.kubeagent import api as k
from octavo.cli.kubeagent.podspec import MissingReference, field_value, resource_value

DEFAULT_MODE = 0o644
TOKEN_EXPIRATION_S = 3607  # what the ServiceAccount admission plugin asks for in kube-api-access volumes


@dataclass(frozen=True)
class Mount:
    source: str       # a directory or file on this host
    target: str       # the absolute path the container sees
    read_only: bool


class Volumes:
    """Prepares the volumes of one pod. `api` is the node's client (the Node authorizer lets it read only what
    pods bound to its node use)."""

    def __init__(self, api: k.Api, pod: dict[str, Any], pod_dir: Path,
                 allocatable: dict[str, str]) -> None:
        self.api = api
        self.pod = pod
        self.namespace = pod["metadata"]["namespace"]
        self.dir = pod_dir / "volumes"
        self.allocatable = allocatable
        self.paths: dict[str, str] = {}  # volume name -> host path

    def prepare(self) -> dict[str, str]:
        for volume in self.pod["spec"].get("volumes") or []:
            self.paths[volume["name"]] = self._prepare(volume)
        return self.paths

    def _prepare(self, volume: dict[str, Any]) -> str:
        name = volume["name"]
        where = self.dir / name
        if "emptyDir" in volume:
            where.mkdir(parents=True, exist_ok=True)
            return str(where)
        if "persistentVolumeClaim" in volume:
            return self._claim_path(volume["persistentVolumeClaim"]["claimName"])
        if "hostPath" in volume:
            path = volume["hostPath"]["path"]
            if volume["hostPath"].get("type") in ("DirectoryOrCreate",):
                os.makedirs(path, exist_ok=True)
            return str(path)
        files: dict[str, tuple[bytes, int]] = {}
        if "configMap" in volume:
            self._object_files(files, "configmaps", volume["configMap"], volume["configMap"].get("defaultMode"))
        elif "secret" in volume:
            source = {**volume["secret"], "name": volume["secret"]["secretName"]}
            self._object_files(files, "secrets", source, volume["secret"].get("defaultMode"))
        elif "downwardAPI" in volume:
            downward = volume["downwardAPI"]
            self._downward_files(files, downward.get("items") or [], downward.get("defaultMode"))
        elif "projected" in volume:
            mode = volume["projected"].get("defaultMode")
            for source in volume["projected"].get("sources") or []:
                if "configMap" in source:
                    self._object_files(files, "configmaps", source["configMap"], mode)
                elif "secret" in source:
                    self._object_files(files, "secrets", source["secret"], mode)
                elif "downwardAPI" in source:
                    self._downward_files(files, source["downwardAPI"].get("items") or [], mode)
                elif "serviceAccountToken" in source:
                    token = source["serviceAccountToken"]
                    files[token["path"]] = (self._token(token).encode(), _mode(mode, None))
                else:
                    raise ValueError(f"volume {name!r}: projected source {sorted(source)} is not supported")
        else:
            raise ValueError(f"volume {name!r}: type {sorted(set(volume) - {'name'})} is not supported by the "
                             f"node agent (docs/kubernetes.md lists the supported ones)")
        _write_fresh(where, files)
        return str(where)

    def _claim_path(self, claim: str) -> str:
        pvc = self.api.get(k.core(self.namespace, "persistentvolumeclaims", claim))
        if pvc is None:
            raise MissingReference(f"persistentvolumeclaim {claim!r} does not exist")
        volume_name = (pvc.get("spec") or {}).get("volumeName")
        if not volume_name or (pvc.get("status") or {}).get("phase") != "Bound":
            raise MissingReference(f"persistentvolumeclaim {claim!r} is not bound yet")
        pv = self.api.get(k.core(None, "persistentvolumes", volume_name))
        if pv is None:
            raise MissingReference(f"persistentvolume {volume_name!r} of claim {claim!r} does not exist")
        spec = pv["spec"]
        path = (spec.get("local") or {}).get("path") or (spec.get("hostPath") or {}).get("path")
        if not path:
            raise ValueError(f"persistentvolume {volume_name!r} is neither local nor hostPath: this node cannot "
                             f"mount it")
        if not os.path.isdir(path):
            raise MissingReference(f"persistentvolume {volume_name!r}: {path} is not a directory on this node")
        return str(path)

    def lookup(self, kind: str, name: str) -> dict[str, bytes] | None:
        obj = self.api.get(k.core(self.namespace, kind, name))
        if obj is None:
            return None
        data = {key: base64.b64decode(v) for key, v in (obj.get("data") or {}).items()} if kind == "secrets" \
            else {key: v.encode() for key, v in (obj.get("data") or {}).items()}
        data.update({key: base64.b64decode(v) for key, v in (obj.get("binaryData") or {}).items()})
        return data

    def _object_files(self, files: dict[str, tuple[bytes, int]], kind: str, source: dict[str, Any],
                      default_mode: int | None) -> None:
        data = self.lookup(kind, source["name"])
        if data is None:
            if source.get("optional"):
                return
            raise MissingReference(f"{kind[:-1]} {source['name']!r} does not exist")
        items = source.get("items")
        if items is None:
            for key, value in data.items():
                files[key] = (value, _mode(default_mode, None))
            return
        for item in items:
            if item["key"] not in data:
                if source.get("optional"):
                    continue
                raise MissingReference(f"{kind[:-1]} {source['name']!r} has no key {item['key']!r}")
            files[item["path"]] = (data[item["key"]], _mode(default_mode, item.get("mode")))

    def _downward_files(self, files: dict[str, tuple[bytes, int]], items: list[dict[str, Any]],
                        default_mode: int | None) -> None:
        for item in items:
            if "fieldRef" in item:
                value = field_value(self.pod, item["fieldRef"]["fieldPath"])
            else:
                ref = item["resourceFieldRef"]
                container = next(c for c in self.pod["spec"]["containers"] if c["name"] == ref["containerName"])
                value = resource_value(container, ref, self.allocatable)
            files[item["path"]] = (value.encode(), _mode(default_mode, item.get("mode")))

    def _token(self, source: dict[str, Any]) -> str:
        meta = self.pod["metadata"]
        account = self.pod["spec"].get("serviceAccountName") or "default"
        spec: dict[str, Any] = {"expirationSeconds": int(source.get("expirationSeconds") or TOKEN_EXPIRATION_S),
                                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                                   "uid": meta["uid"]}}
        if source.get("audience"):
            spec["audiences"] = [source["audience"]]
        answer = self.api.request("POST", k.core(self.namespace, "serviceaccounts", account, "token"),
                                  {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
        return str(answer["status"]["token"])


def container_mounts(container: dict[str, Any], paths: dict[str, str]) -> list[Mount]:
    """The container's volumeMounts as host paths (subPath included), parents before what they contain."""
    mounts = []
    for m in container.get("volumeMounts") or []:
        if m["name"] not in paths:
            raise ValueError(f"container {container['name']!r} mounts volume {m['name']!r}, which the pod lacks")
        source = paths[m["name"]]
        if m.get("subPath"):
            sub = os.path.normpath(m["subPath"])
            if sub.startswith("..") or os.path.isabs(sub):
                raise ValueError(f"subPath {m['subPath']!r} leaves its volume")
            source = os.path.join(source, sub)
            if not os.path.exists(source):
                os.makedirs(source, exist_ok=True)
        mounts.append(Mount(source, m["mountPath"], bool(m.get("readOnly"))))
    return sorted(mounts, key=lambda mount: mount.target.rstrip("/").count("/"))


def _mode(default_mode: int | None, mode: int | None) -> int:
    return int(mode if mode is not None else default_mode if default_mode is not None else DEFAULT_MODE)


def _write_fresh(where: Path, files: dict[str, tuple[bytes, int]]) -> None:
    """The volume's files, replacing what an earlier start of the pod wrote."""
    if where.exists():
        shutil.rmtree(where)
    where.mkdir(parents=True)
    for rel, (data, mode) in files.items():
        path = where / os.path.normpath(rel)
        if not str(path).startswith(str(where) + os.sep):
            raise ValueError(f"volume file {rel!r} leaves its volume")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.chmod(path, mode & 0o777)

