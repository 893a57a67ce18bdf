"""The operator's apply step against the local control plane's API server, without an operator running
(conftest.py: the `local_kube` fixture gives the API, with our CRDs, and empties the namespace afterwards)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import kopf

from octavo.operator import builders
from octavo.operator.config import OperatorConfig, OperatorState
from octavo.operator.handlers import apply_owned, reconcile
from octavo.operator.kube import Kube, load_api_client
from octavo.operator.resources import parse_cluster

sys.path.insert(0, str(Path(__file__).resolve().parent))
from localplane import KEPT

LocalKube = Any  # the local_kube fixture (conftest.py)
SPEC = {"replicas": 4, "image": "octavo:dev", "storage": {"size": "1Gi"}, "etcd": {"endpoints": "127.0.0.1:1"}}
KINDS = (("apps/v1", "statefulsets"), ("v1", "services"), ("v1", "configmaps"), ("policy/v1", "poddisruptionbudgets"))


def objects(replicas: int) -> list[dict[str, Any]]:
    return builders.owned_objects("logs", "default", parse_cluster("logs", SPEC), None, replicas=replicas,
                                  generation=1)


async def create_owner(kube: Kube) -> dict[str, Any]:
    """The BookieCluster, as the owner the objects name: the server gives it its uid (the emulated API kept the
    one a client sent; a real API server does not, so the owner reference carries the server's)."""
    await kube.create({"apiVersion": "octavo.io/v1alpha1", "kind": "BookieCluster",
                       "metadata": {"name": "logs", "namespace": "default"}, "spec": SPEC})
    owner = await kube.get("octavo.io/v1alpha1", "bookieclusters", "default", "logs")
    assert owner is not None and owner["metadata"]["uid"]
    return {"apiVersion": "octavo.io/v1alpha1", "kind": "BookieCluster",
            "metadata": {"name": "logs", "namespace": "default", "uid": owner["metadata"]["uid"]}}


def test_apply_is_idempotent_and_restores_replicas_changed_behind_its_back(local_kube: LocalKube) -> None:
    """A scale-down shrinks the StatefulSet outside the applied hash; a scale-up right after (before any poll
    applied the smaller size) must still grow it again (it did not: the hash was the same as before)."""
    async def scenario(kube: Kube) -> tuple[list[str], list[str], int]:
        owner = await create_owner(kube)  # the owner exists, or its objects are collected
        first = (await apply_owned(kube, owner, objects(4))).changed
        again = (await apply_owned(kube, owner, objects(4))).changed
        await kube.patch("apps/v1", "statefulsets", "default", "logs", {"spec": {"replicas": 3}})
        await apply_owned(kube, owner, objects(4))
        sts = await kube.get("apps/v1", "statefulsets", "default", "logs")
        assert sts is not None
        return first, again, sts["spec"]["replicas"]

    first, again, replicas = asyncio.run(scenario(Kube(load_api_client(local_kube.kubeconfig))))
    assert sorted(first) == ["ConfigMap/logs-bookie-config", "PodDisruptionBudget/logs", "Service/logs",
                             "Service/logs-bookies", "StatefulSet/logs"]
    assert again == [], "a second apply of the same objects patched something"
    assert replicas == 4


def test_objects_applied_after_their_owner_was_deleted_are_collected(local_kube: LocalKube) -> None:
    """A reconcile working from a read made before its BookieCluster's deletion creates the cluster's objects
    with an owner that is gone: Kubernetes' garbage collector removes them (a chart uninstall once left such
    objects behind on the emulated API, which had to do the same). The collector works in the background: the
    objects go within seconds, not at once as they did on the emulation."""
    async def owned(kube: Kube) -> dict[str, list[str]]:
        return {plural: names for api_version, plural in KINDS
                if (names := [o["metadata"]["name"] for o in await kube.list(api_version, plural, "default")
                              if o["metadata"]["name"] not in KEPT.get(plural, ())])}

    async def scenario(kube: Kube) -> None:
        owner = await create_owner(kube)
        await apply_owned(kube, owner, objects(4))
        await kube.delete("octavo.io/v1alpha1", "bookieclusters", "default", "logs")
        await apply_owned(kube, owner, objects(4))  # the late reconcile

    kube = Kube(load_api_client(local_kube.kubeconfig))
    asyncio.run(scenario(kube))
    # The real garbage collector works in the background and the pods go through their graceful deletion: a
    # loaded 2-core machine once took over 30 s in a full run.
    local_kube.eventually(lambda: asyncio.run(owned(Kube(load_api_client(local_kube.kubeconfig)))) == {}, 120,
                          "the late objects collected")


class ChangingUnderfoot(Kube):
    """The API server, and the cluster changed by a user while a poll is under way: kopf replaces a timer's live
    body in place when the watch event arrives, here as the poll reads the StatefulSet."""

    def __init__(self, kube: Kube, body: kopf.Body, changed: dict[str, Any]) -> None:
        super().__init__(kube.api)
        self.body, self.changed = body, changed

    async def get(self, api_version: str, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        if plural == "statefulsets" and self.changed:
            self.body._replace_with(self.changed)
            self.changed = {}
        return await super().get(api_version, plural, namespace, name)


def test_a_poll_builds_from_one_reading_of_a_cluster_changed_under_it(local_kube: LocalKube) -> None:
    """A CI run saw status.observedGeneration at a new generation before its roll had started: the poll read the
    spec before an image change and the generation after it (kopf's live body), so the StatefulSet got the old
    template under the new generation's annotation, and the next poll found every pod current for it."""
    async def scenario() -> tuple[dict[str, Any], int]:
        from kopf._core.engines import posting  # the Events the handlers post go to a queue no one posts from

        posting.settings_var.set(kopf.OperatorSettings())
        posting.event_queue_var.set(asyncio.Queue())
        posting.event_queue_loop_var.set(asyncio.get_running_loop())
        kube = Kube(load_api_client(local_kube.kubeconfig))
        await create_owner(kube)
        before = await kube.get("octavo.io/v1alpha1", "bookieclusters", "default", "logs")
        after = await kube.patch("octavo.io/v1alpha1", "bookieclusters", "default", "logs",
                                 {"spec": {"image": "octavo:dev-2"}})
        assert before is not None and after["metadata"]["generation"] == 2
        body = kopf.Body(before)
        config = OperatorConfig(admin_timeout_s=2.0, kubeconfig=local_kube.kubeconfig).validate()
        state = OperatorState.start(config)
        state._kube = ChangingUnderfoot(kube, body, after)
        patch = kopf.Patch()
        await reconcile(config, state, "logs", "default", body, body.status, patch, poll=True)
        sts = await kube.get("apps/v1", "statefulsets", "default", "logs")
        assert sts is not None and body.metadata["generation"] == 2, "the body was not changed under the poll"
        return sts, int((patch.get("status") or {}).get("observedGeneration") or 0)

    sts, observed = asyncio.run(scenario())
    image = sts["spec"]["template"]["spec"]["containers"][0]["image"]
    built_from = sts["metadata"]["annotations"][builders.APPLIED_GENERATION]
    assert (image, built_from) == ("octavo:dev", "1"), (
        f"the StatefulSet has image {image} under generation {built_from}: one reading is octavo:dev and 1")
    assert observed in (0, 1), f"the poll showed generation {observed} as rolled out"
