"""The node agent's client of the Kubernetes API: JSON over HTTPS with a client certificate, thread-safe
(urllib3's pool), dicts in and out. Each node of the agent has its own (system:node:<name>, as a kubelet has),
the storage provisioner the admin's."""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass
from typing import Any

import urllib3

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
REQUEST_TIMEOUT_S = 15.0


class ApiError(RuntimeError):
    """The API answered with an error status (`status`), or could not be reached (status 0)."""

    def __init__(self, status: int, method: str, path: str, text: str) -> None:
        super().__init__(f"{method} {path}: {status or 'unreachable'} {text[:400]}")
        self.status = status


@dataclass(frozen=True)
class Identity:
    """Who the client is: a client certificate of the cluster CA."""

    cert_file: str
    key_file: str


class Api:
    def __init__(self, server: str, ca_file: str, identity: Identity, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.server = server.rstrip("/")
        self.http = urllib3.PoolManager(num_pools=4, maxsize=8, cert_reqs="CERT_REQUIRED", ca_certs=ca_file,
                                        cert_file=identity.cert_file, key_file=identity.key_file,
                                        timeout=urllib3.Timeout(total=timeout_s), retries=False)

    def request(self, method: str, path: str, body: Any = None, content_type: str = JSON,
                query: dict[str, Any] | None = None) -> Any:
        url = self.server + path + (("?" + urllib.parse.urlencode(query)) if query else "")
        data = json.dumps(body).encode() if body is not None else None
        try:
            response = self.http.request(method, url, body=data, headers={"Content-Type": content_type,
                                                                          "Accept": JSON})
        except urllib3.exceptions.HTTPError as e:
            raise ApiError(0, method, path, str(e)) from e
        text = response.data.decode(errors="replace")
        if response.status >= 300:
            raise ApiError(response.status, method, path, text)
        return json.loads(text) if text else None

    def get(self, path: str, query: dict[str, Any] | None = None) -> Any:
        """The object, or None when it does not exist."""
        try:
            return self.request("GET", path, query=query)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def items(self, path: str, query: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return list((self.request("GET", path, query=query) or {}).get("items") or [])

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The created object, or None when one of that name exists."""
        try:
            return dict(self.request("POST", path, body))
        except ApiError as e:
            if e.status == 409:
                return None
            raise

    def patch(self, path: str, body: dict[str, Any], content_type: str = MERGE_PATCH) -> Any:
        return self.request("PATCH", path, body, content_type)

    def delete(self, path: str, body: dict[str, Any] | None = None) -> bool:
        """True when this call deleted it (or began to), False when it was gone already."""
        try:
            self.request("DELETE", path, body)
        except ApiError as e:
            if e.status in (404, 409):  # gone, or its uid precondition names an earlier object
                return False
            raise
        return True


def core(namespace: str | None, plural: str, name: str = "", sub: str = "") -> str:
    """The path of a core (v1) resource."""
    return _path("/api/v1", namespace, plural, name, sub)


def group(api_version: str, namespace: str | None, plural: str, name: str = "", sub: str = "") -> str:
    return _path(f"/apis/{api_version}", namespace, plural, name, sub)


def _path(base: str, namespace: str | None, plural: str, name: str, sub: str) -> str:
    ns = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{ns}/{plural}" + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")
