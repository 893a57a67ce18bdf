"""The operator's apply step against the emulated API, without bookies."""

from __future__ import annotations

import asyncio
from typing import Any

from octavo.localk8s.apiserver import ApiServer
from octavo.operator import builders
from octavo.operator.handlers import apply_owned
from octavo.operator.kube import Kube, load_api_client
from octavo.operator.resources import parse_cluster

OWNER = {"apiVersion": "octavo.io/v1alpha1", "kind": "BookieCluster",
         "metadata": {"name": "logs", "namespace": "default", "uid": "u-1"}}
SPEC = {"replicas": 4, "image": "octavo:dev", "storage": {"size": "1Gi"}, "etcd": {"endpoints": "127.0.0.1:1"}}


def objects(replicas: int) -> list[dict[str, Any]]:
    built = builders.owned_objects("logs", "default", parse_cluster("logs", SPEC), None)
    built[-1]["spec"]["replicas"] = replicas
    return built


def test_apply_is_idempotent_and_restores_replicas_changed_behind_its_back() -> None:
    """A scale-down shrinks the StatefulSet outside the applied hash; a scale-up right after (before any poll
    applied the smaller size) must still grow it again (it did not: the hash was the same as before)."""
    async def scenario(kube: Kube) -> tuple[list[str], list[str], int]:
        await kube.create({**OWNER, "spec": SPEC})  # the owner exists, or its objects are collected
        owner = await kube.get("octavo.io/v1alpha1", "bookieclusters", "default", "logs")
        assert owner is not None and owner["metadata"]["uid"] == "u-1"
        first = await apply_owned(kube, OWNER, objects(4))
        again = await apply_owned(kube, OWNER, objects(4))
        await kube.patch("apps/v1", "statefulsets", "default", "logs", {"spec": {"replicas": 3}})
        await apply_owned(kube, OWNER, objects(4))
        sts = await kube.get("apps/v1", "statefulsets", "default", "logs")
        assert sts is not None
        return first, again, sts["spec"]["replicas"]

    with ApiServer() as api:
        first, again, replicas = asyncio.run(scenario(Kube(load_api_client(api.kubeconfig))))
    assert sorted(first) == ["ConfigMap/logs-bookie-config", "PodDisruptionBudget/logs", "Service/logs",
                             "Service/logs-bookies", "StatefulSet/logs"]
    assert again == [], "a second apply of the same objects patched something"
    assert replicas == 4


def test_objects_applied_after_their_owner_was_deleted_are_collected() -> None:
    """A reconcile working from a read made before its BookieCluster's deletion creates the cluster's objects
    with an owner that is gone: Kubernetes' garbage collector removes them, and so must the emulated API (a
    chart uninstall once left such objects behind)."""
    async def scenario(kube: Kube) -> dict[str, list[str]]:
        await kube.create({**OWNER, "spec": SPEC})
        await apply_owned(kube, OWNER, objects(4))
        await kube.delete("octavo.io/v1alpha1", "bookieclusters", "default", "logs")
        after_delete = [o["metadata"]["name"] for o in await kube.list("apps/v1", "statefulsets", "default")]
        await apply_owned(kube, OWNER, objects(4))  # the late reconcile
        late = {plural: [o["metadata"]["name"] for o in await kube.list(api_version, plural, "default")]
                for api_version, plural in (("apps/v1", "statefulsets"), ("v1", "services"), ("v1", "configmaps"),
                                            ("policy/v1", "poddisruptionbudgets"))}
        return {"after delete": after_delete, **{k: v for k, v in late.items() if v}}

    with ApiServer() as api:
        left = asyncio.run(scenario(Kube(load_api_client(api.kubeconfig))))
    assert left == {"after delete": []}, left
