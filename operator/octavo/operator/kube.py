"""The operator's one door to the Kubernetes API: plain dicts in and out, over the `kubernetes` client's
transport (its configuration: in-cluster service account or a kubeconfig), run in threads so the operator's
event loop never blocks. Only this module talks to Kubernetes; the handlers decide, the builders build.

Objects are addressed by (apiVersion, kind's plural, namespace, name). A missing object reads as None; every
other failure raises `KubeError` with the API's status and message.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import kubernetes

# Every call is bounded: (connect, read) seconds.
REQUEST_TIMEOUT_S = (5.0, 30.0)
MERGE_PATCH = "application/merge-patch+json"


class KubeError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Kubernetes API answered {status}: {message}")
        self.status = status


def load_api_client(kubeconfig: str | None = None) -> kubernetes.client.ApiClient:
    """In a pod: its service account. Elsewhere: `kubeconfig`, $KUBECONFIG, or ~/.kube/config."""
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        configuration = kubernetes.client.Configuration()
        kubernetes.config.load_incluster_config(client_configuration=configuration)
        return kubernetes.client.ApiClient(configuration)
    path = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    client: kubernetes.client.ApiClient = kubernetes.config.new_client_from_config(config_file=path)
    return client


def path_of(api_version: str, plural: str, namespace: str | None, name: str | None = None,
            subresource: str | None = None) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    parts = [base]
    if namespace:
        parts.append(f"namespaces/{namespace}")
    parts.append(plural)
    if name:
        parts.append(name)
    if subresource:
        parts.append(subresource)
    return "/".join(parts)


# The plural of each kind the operator creates (a kind's object carries its kind, not its resource name).
PLURALS: Mapping[str, str] = MappingProxyType({
    "ConfigMap": "configmaps", "Service": "services", "PodDisruptionBudget": "poddisruptionbudgets",
    "StatefulSet": "statefulsets", "Pod": "pods", "PersistentVolumeClaim": "persistentvolumeclaims",
    "Secret": "secrets", "Event": "events", "BookieCluster": "bookieclusters",
    "CompactionPolicy": "compactionpolicies"})


class Kube:
    def __init__(self, api_client: kubernetes.client.ApiClient) -> None:
        self.api = api_client

    def _call(self, method: str, path: str, body: Any = None, query: Mapping[str, str] | None = None,
              content_type: str = "application/json") -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        method, url, headers, body, _ = self.api.param_serialize(
            method, path, query_params=list((query or {}).items()), header_params=headers, body=body,
            auth_settings=["BearerToken"])
        try:
            response = self.api.call_api(method, url, headers, body, _request_timeout=REQUEST_TIMEOUT_S)
            response.read()
        except kubernetes.client.ApiException as e:
            raise KubeError(e.status or 0, str(e.body or e.reason)) from None
        except OSError as e:
            raise KubeError(0, f"cannot reach the API server: {e}") from None
        raw = response.data
        data = raw.decode() if isinstance(raw, bytes) else str(raw or "")
        if response.status >= 300:
            try:
                message = json.loads(data).get("message", data)
            except (ValueError, AttributeError):
                message = data
            raise KubeError(response.status, str(message))
        return json.loads(data) if data else None

    async def call(self, method: str, path: str, body: Any = None, query: Mapping[str, str] | None = None,
                   content_type: str = "application/json") -> Any:
        return await asyncio.to_thread(self._call, method, path, body, query, content_type)

    async def get(self, api_version: str, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return dict(await self.call("GET", path_of(api_version, plural, namespace, name)))
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    async def list(self, api_version: str, plural: str, namespace: str | None,
                   label_selector: str = "") -> list[dict[str, Any]]:
        query = {"labelSelector": label_selector} if label_selector else None
        result = await self.call("GET", path_of(api_version, plural, namespace), query=query)
        return list((result or {}).get("items") or [])

    async def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return dict(await self.call("POST", path_of(obj["apiVersion"], PLURALS[obj["kind"]], meta.get("namespace")),
                                    body=obj))

    async def patch(self, api_version: str, plural: str, namespace: str | None, name: str, patch: Mapping[str, Any],
                    subresource: str | None = None) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386): None deletes a key."""
        return dict(await self.call("PATCH", path_of(api_version, plural, namespace, name, subresource), body=patch,
                                    content_type=MERGE_PATCH))

    async def delete(self, api_version: str, plural: str, namespace: str | None, name: str) -> bool:
        """True when it was deleted, False when there was nothing to delete."""
        try:
            await self.call("DELETE", path_of(api_version, plural, namespace, name))
        except KubeError as e:
            if e.status == 404:
                return False
            raise
        return True
