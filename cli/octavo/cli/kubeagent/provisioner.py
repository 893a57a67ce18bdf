"""Local PersistentVolumes for the claims of the `standard` StorageClass, as kind's local-path provisioner makes
them: the class is the cluster's default and binds on the first consumer (WaitForFirstConsumer), so the scheduler
picks the pod's node first and annotates the claim with it; then a PersistentVolume is made for the claim: a
directory ROOT/volumes/<pv name> with node affinity to that node, reclaim policy Delete. The data outlives its
pods; when the claim is deleted the PV controller releases the volume, and the directory and the PV go.

It works as the cluster admin (a node's identity may not create PersistentVolumes)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from octavo.cli.kubeagent import api as k

log = logging.getLogger("octavo.kubeagent")

STORAGE_CLASS = "standard"
PROVISIONER = "octavo.io/local-path"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"


def storage_class() -> dict[str, Any]:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": STORAGE_CLASS,
                         "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": PROVISIONER, "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer"}


def volume_for(claim: dict[str, Any], node: str, path: Path) -> dict[str, Any]:
    meta, spec = claim["metadata"], claim["spec"]
    return {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": path.name, "annotations": {PROVISIONED_BY: PROVISIONER},
                     "labels": {"octavo.io/node": node}},
        "spec": {
            "capacity": {"storage": spec["resources"]["requests"]["storage"]},
            "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete", "storageClassName": STORAGE_CLASS,
            "volumeMode": spec.get("volumeMode") or "Filesystem",
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": meta["namespace"],
                         "name": meta["name"], "uid": meta["uid"]},
            "local": {"path": str(path)},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}},
        },
    }


class Provisioner:
    def __init__(self, api: k.Api, root: Path, nodes: set[str]) -> None:
        self.api = api
        self.volumes = root / "volumes"
        self.nodes = nodes

    def ensure_class(self) -> None:
        self.api.create(k.group("storage.k8s.io/v1", None, "storageclasses"), storage_class())

    def step(self) -> None:
        """Provision what waits for a volume on one of our nodes; remove what the PV controller released."""
        for claim in self.api.items(k.core(None, "persistentvolumeclaims")):
            meta, spec = claim["metadata"], claim["spec"]
            node = (meta.get("annotations") or {}).get(SELECTED_NODE)
            if (spec.get("storageClassName") != STORAGE_CLASS or spec.get("volumeName") or node not in self.nodes
                    or (claim.get("status") or {}).get("phase") != "Pending" or meta.get("deletionTimestamp")):
                continue
            path = self.volumes / f"pvc-{meta['uid']}"
            path.mkdir(parents=True, exist_ok=True)
            if self.api.create(k.core(None, "persistentvolumes"), volume_for(claim, node, path)) is not None:
                log.info("provisioned %s for claim %s/%s on %s", path.name, meta["namespace"], meta["name"], node)
        for pv in self.api.items(k.core(None, "persistentvolumes")):
            meta, spec = pv["metadata"], pv["spec"]
            if ((meta.get("annotations") or {}).get(PROVISIONED_BY) != PROVISIONER
                    or (pv.get("status") or {}).get("phase") not in ("Released", "Failed")
                    or spec.get("persistentVolumeReclaimPolicy") != "Delete"):
                continue
            path = Path((spec.get("local") or {}).get("path", ""))
            if path.parent == self.volumes:  # never delete outside our own directory
                shutil.rmtree(path, ignore_errors=True)
            self.api.delete(k.core(None, "persistentvolumes", meta["name"]))
            log.info("deleted %s (its claim is gone)", meta["name"])
