"""kmock's KubernetesEmulator (0.8), with the API server's bookkeeping the operator and kopf rely on, served on
a real TCP port from a thread of its own.

What kmock 0.8 leaves out and this adds (each was a failure of kopf or of the operator without it):
- metadata on create: the namespace from the URL, generateName, uid, creationTimestamp, generation;
- a resourceVersion bumped on every write (kopf drops watch events it has seen by resourceVersion; without one
  handlers run twice), and one on lists;
- generation bumped when a write touches the spec (so observedGeneration means something);
- the status subresource kept apart from the object (a status write changes only the status, a main write
  never the status), and the scale subresource writing spec.replicas;
- label selectors on lists and watches;
- garbage collection of objects whose owners are all gone (ownerReferences), also of one created with owners
  that are already gone;
- 422, not 500, when a JSON patch's test fails (kopf's optimistic finalizer patches expect it);
- watches that subscribe before replaying, and replay only what is newer than ?resourceVersion (kmock's lose
  changes made right after a list, which stalls kopf);
- /api/v1/namespaces[/name], which kmock's URL parser cannot read (kopf's namespace observer needs it).
It reaches into kmock internals that are private in 0.8; the tests that use it fail loudly if they move.
No admission: the CRDs' schemas are not checked here (the chart's tests check custom resources against them).
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import logging
import os
import tempfile
import threading
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import jsonpatch
import kmock
import yaml
from kmock._internal import enums, parsing

_versions = itertools.count(1000)
_last_version = [999]


def _next_version() -> str:
    _last_version[0] = next(_versions)
    return str(_last_version[0])


def labels_match(labels: Mapping[str, str], selector: str | None) -> bool:
    """Equality-based label selectors (a=b, a==b, a!=b, a, !a), comma-separated, all must hold."""
    for term in (t.strip() for t in (selector or "").split(",")):
        if not term:
            continue
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _version_of(event: Mapping[str, Any]) -> int:
    try:
        return int(_meta(event.get("object") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


@attrs.define(kw_only=True)
class ApiServerEmulator(kmock.KubernetesEmulator):  # type: ignore[misc]
    async def _handle(self, request: Any) -> Any:
        # kmock finds reactions by the request's identity: edit it in place, never replace it.
        data = request.data
        if request.resource is not None and request.action == enums.action.CREATE and isinstance(data, dict):
            self._on_create(request, data)
        elif request.resource is not None and request.action == enums.action.UPDATE and request.name:
            self._on_update(request, data)
        try:
            response = await super()._handle(request)
        except jsonpatch.JsonPatchTestFailed as e:
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(e)) from e
        if request.resource is not None and (request.action in (enums.action.DELETE, enums.action.UPDATE) or (
                request.action == enums.action.CREATE and isinstance(data, dict)
                and (data.get("metadata") or {}).get("ownerReferences"))):
            # Also after a create: an object made with owners already gone (a controller acting on a list read
            # before the owner's deletion) is collected, as Kubernetes' collector does with dangling owners.
            await self._collect_garbage()
        return response

    def _on_create(self, request: Any, data: dict[str, Any]) -> None:
        meta = data.setdefault("metadata", {})
        if request.namespace and not meta.get("namespace"):
            meta["namespace"] = request.namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp",
                        datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        meta["resourceVersion"] = _next_version()
        meta.setdefault("generation", 1)

    def _on_update(self, request: Any, data: Any) -> None:
        version = _next_version()
        if isinstance(data, list):  # a JSON patch
            data.append({"op": "add", "path": "/metadata/resourceVersion", "value": version})
            return
        if not isinstance(data, dict):
            return
        info = self.resources.get(request.resource, None)
        has_status = "status" in set(getattr(info, "subresources", None) or ())
        if request.subresource == "status":
            for key in [k for k in data if k != "status"]:
                del data[key]
        elif request.subresource == "scale":
            replicas = (data.get("spec") or {}).get("replicas")
            data.clear()
            if replicas is not None:
                data["spec"] = {"replicas": replicas}
        elif has_status:
            data.pop("status", None)
        meta = data.setdefault("metadata", {})
        meta["resourceVersion"] = version  # no optimistic-concurrency check: the last write wins
        key = (request.resource, request.namespace, request.name)
        if request.subresource != "status" and "spec" in data and key in self.objects \
                and not self.objects[key].deleted:
            meta["generation"] = int(_meta(self.objects[key]).get("generation") or 1) + 1

    async def _collect_garbage(self) -> None:
        """Delete every object whose owners are all gone, until none is left (owners of owners)."""
        while True:
            live = {_meta(obj).get("uid") for obj in self.objects.values() if not obj.deleted}
            orphans = []
            async with self._lock:
                for (resource, _, _), obj in list(self.objects.items()):
                    owners = _meta(obj).get("ownerReferences") or []
                    if not obj.deleted and owners and all(o.get("uid") not in live for o in owners):
                        raw = obj.raw
                        obj.delete()
                        orphans.append((resource, raw))
            for resource, raw in orphans:
                await self._buses[resource].put({"type": "DELETED", "object": raw})
            if not orphans:
                return

    async def _serve_list(self, request: Any) -> Any:
        result: Any = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        result["items"] = [o for o in result["items"] if labels_match(_meta(o).get("labels") or {}, selector)]
        result["metadata"]["resourceVersion"] = str(_last_version[0])
        info = self.resources.get(request.resource)
        kind = getattr(info, "kind", None) or next((o.get("kind") for o in result["items"] if o.get("kind")), None)
        if kind:  # kubectl needs the list's kind
            result["kind"] = f"{kind}List"
            group, version = request.resource.group, request.resource.version
            result["apiVersion"] = f"{group}/{version}" if group else version
        return result

    async def _serve_watch(self, request: Any) -> Any:
        yield b""  # the headers go out at once, even if nothing happens
        selector = request.params.get("labelSelector")
        try:
            since = int(request.params.get("resourceVersion") or 0)
        except ValueError:
            since = 0
        bus = self._buses[request.resource]
        marker = await bus.mark()  # subscribe first, then replay: nothing between falls through
        check = getattr(self, "_KubernetesEmulator__check")  # noqa: B009 (private in kmock 0.8)
        try:
            async with self._lock:
                existing = [{"type": "ADDED", "object": o.raw}
                            for o in getattr(self, "_KubernetesEmulator__get_objs")(request, strict=False)  # noqa: B009
                            if not o.deleted]
            for event in existing:
                if _version_of(event) > since and labels_match(_meta(event["object"]).get("labels") or {},
                                                                 selector):
                    yield event
            async for event in bus.stream(since=marker):
                meta = _meta(event.get("object") or {})
                if check(request, request.resource, meta.get("namespace"), meta.get("name"), strict=False) \
                        and _version_of(event) > since and labels_match(meta.get("labels") or {}, selector):
                    yield event
        finally:
            await bus.unmark(marker)


_parse_path = parsing.parse_path


def _parse_path_with_namespaces(path: str) -> Any:
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and len(parts) in (3, 4):
        return parsing.ParsedPath("", "v1", "namespaces", None, parts[3] if len(parts) == 4 else None, None)
    return _parse_path(path)


parsing.parse_path = _parse_path_with_namespaces

VERBS = {"list", "watch", "get", "create", "patch", "update", "delete"}
CRD_DIR = Path(__file__).resolve().parents[4] / "charts" / "octavo" / "crds"


def crd_resources(crd_dir: Path = CRD_DIR) -> dict[str, Any]:
    """kmock resource declarations for every CRD in `crd_dir` (each served version)."""
    out = {}
    for path in sorted(crd_dir.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        spec = crd["spec"]
        names = spec["names"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            subresources = set((version.get("subresources") or {}).keys())
            out[f"{spec['group']}/{version['name']}/{names['plural']}"] = kmock.ResourceInfo(
                kind=names["kind"], singular=names.get("singular"), namespaced=spec["scope"] == "Namespaced",
                verbs=VERBS, shortnames=names.get("shortNames") or [], subresources=subresources)
    # kopf's own: peering (one active operator).
    out["kopf.dev/v1/kopfpeerings"] = kmock.ResourceInfo(kind="KopfPeering", namespaced=True, verbs=VERBS)
    out["kopf.dev/v1/clusterkopfpeerings"] = kmock.ResourceInfo(kind="ClusterKopfPeering", namespaced=False,
                                                                verbs=VERBS)
    return out


class ApiServer:
    """The emulator on 127.0.0.1:`port` (0: any free port) in a daemon thread, with a kubeconfig file for it.

        with ApiServer() as api:
            api.url, api.kubeconfig
    """

    def __init__(self, port: int = 0, kubeconfig: str | None = None) -> None:
        self.port = port
        self.url = ""
        self.kubeconfig = kubeconfig or ""
        self.emulator: ApiServerEmulator | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._error: BaseException | None = None

    def start(self, timeout_s: float = 15.0) -> ApiServer:
        ready = threading.Event()
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # a line per request otherwise

        async def main() -> None:
            try:
                async with ApiServerEmulator() as emulator, kmock.Server(emulator, port=self.port or None) as srv:
                    emulator.resources.load_bundled()  # the built-in groups (v1, apps/v1, policy/v1, ...)
                    for key, info in crd_resources().items():
                        emulator.resources[key] = info
                    self.emulator = emulator
                    self.url = str(srv.url).rstrip("/")
                    self._loop = asyncio.get_running_loop()
                    self._stop = asyncio.Event()
                    ready.set()
                    await self._stop.wait()
            except BaseException as e:  # reported by start()
                self._error = e
                ready.set()

        self._thread = threading.Thread(target=lambda: asyncio.run(main()), name="kube-api", daemon=True)
        self._thread.start()
        if not ready.wait(timeout_s) or self._error is not None:
            raise RuntimeError(f"the emulated Kubernetes API did not start: {self._error!r}")
        if not self.kubeconfig:
            self._tmp = tempfile.TemporaryDirectory(prefix="octavo-kube-")
            self.kubeconfig = os.path.join(self._tmp.name, "kubeconfig")
        write_kubeconfig(self.kubeconfig, self.url)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def objects(self, plural: str) -> Iterator[dict[str, Any]]:
        """Every live object of a resource (for assertions), as plain dicts."""
        assert self.emulator is not None
        for (resource, _, _), obj in list(self.emulator.objects.items()):
            if resource.plural == plural and not obj.deleted:
                yield obj.raw


def write_kubeconfig(path: str, url: str, namespace: str = "default") -> None:
    Path(path).write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: octavo-local, cluster: {{server: "{url}"}}}}]
users: [{{name: octavo-local, user: {{token: local}}}}]
contexts: [{{name: octavo-local, context: {{cluster: octavo-local, user: octavo-local, namespace: {namespace}}}}}]
current-context: octavo-local
""")
