"""The pod runner: the StatefulSet controller and the kubelet, for an emulated Kubernetes API, with real
`octavo node` processes.

Every `POLL_S` (half a second) it reads the API (like a controller, by listing) and, for each StatefulSet:
- creates a pod per ordinal below `spec.replicas` (all at once: the bookies use podManagementPolicy Parallel),
  with its PersistentVolumeClaims; a claim is a directory under the runner's root and outlives the pod, as a
  retained volume does;
- starts each pod's container as a local process on the pod's own loopback address (127.A.B.N, the same port
  for every pod, as in a cluster: Linux routes all of 127.0.0.0/8 to lo), with the container's environment
  resolved as the kubelet does (fieldRef, configMapKeyRef, secretKeyRef, $(VAR)) and its ConfigMap volumes
  written out; the settings a container image fixes by its file system (the data directory, the listening
  host, the advertised address) are passed as flags;
- writes the pod's IP and readiness (the bookie's ready file: it serves) and the StatefulSet's status back;
- restarts a container that exits (restartPolicy Always), stops the highest ordinals on a scale-down (SIGTERM,
  then SIGKILL after the grace period), and rolls pods one at a time when the template changes;
- deletes a claim's directory when the claim is deleted and no pod uses it.
A test can SIGKILL a pod's process (`kill`) to simulate a crash; the runner restarts it.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

POLL_S = 0.5
RESTART_BACKOFF_S = 1.0
STOP_GRACE_S_MAX = 30.0
MERGE_PATCH = "application/merge-patch+json"
VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


class ApiError(RuntimeError):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"API answered {status}: {text[:300]}")
        self.status = status


class Api:
    """A minimal async client of the (emulated) API: dicts in and out."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Api:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.session is not None:
            await self.session.close()

    @staticmethod
    def path(api_version: str, plural: str, namespace: str | None, name: str = "", sub: str = "") -> str:
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        ns = f"/namespaces/{namespace}" if namespace else ""
        return f"{base}{ns}/{plural}" + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    async def _call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        assert self.session is not None
        data = json.dumps(body) if body is not None else None
        async with self.session.request(method, self.url + path, data=data,
                                        headers={"Content-Type": content_type}) as response:
            text = await response.text()
            if response.status >= 300:
                raise ApiError(response.status, text)
            return json.loads(text) if text else None

    async def list(self, api_version: str, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return list((await self._call("GET", self.path(api_version, plural, namespace)) or {}).get("items") or [])

    async def get(self, api_version: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return dict(await self._call("GET", self.path(api_version, plural, namespace, name)))
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def create(self, api_version: str, plural: str, namespace: str, obj: dict[str, Any]) -> bool:
        """True when this call created it, False when it existed."""
        try:
            await self._call("POST", self.path(api_version, plural, namespace), obj)
        except ApiError as e:
            if e.status != 409:
                raise
            return False
        return True

    async def patch(self, api_version: str, plural: str, namespace: str, name: str, patch: dict[str, Any],
                    sub: str = "") -> None:
        await self._call("PATCH", self.path(api_version, plural, namespace, name, sub), patch, MERGE_PATCH)

    async def delete(self, api_version: str, plural: str, namespace: str, name: str) -> None:
        try:
            await self._call("DELETE", self.path(api_version, plural, namespace, name))
        except ApiError as e:
            if e.status != 404:
                raise


@dataclass
class Container:
    """One pod's process."""

    pod: str
    namespace: str
    ip: str
    revision: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    ready_file: Path
    grace_s: float
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    exited_at: float = 0.0
    ready: bool = False
    deleted: bool = False
    claims: list[str] = field(default_factory=list)

    def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.ready_file.unlink()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([*self.argv, "--ready-file", str(self.ready_file)], stdout=log,
                                         stderr=subprocess.STDOUT, env={**os.environ, **self.env},
                                         start_new_session=True)
        self.ready = False

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, kill: bool = False) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.proc.wait(self.grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:10]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class PodRunner:
    """Runs the pods of every StatefulSet in the API at `url`; data under `root`."""

    def __init__(self, url: str, root: str, ip_prefix: str | None = None) -> None:
        self.url = url
        self.root = Path(root)
        # 127.A.B.N: a block of loopback addresses of its own, so runners on one machine never collide.
        self.ip_prefix = ip_prefix or f"127.{random.randint(100, 250)}.{random.randint(0, 255)}"
        self.containers: dict[tuple[str, str], Container] = {}
        self._ips: dict[tuple[str, str], str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self.errors: list[str] = []  # the last API errors a pass ran into (it goes on with the next pass)
        self.started: collections.Counter[str] = collections.Counter()  # processes started, per pod

    # -- for tests and `octavo dev up --kubernetes` --------------------------------------------------------
    def start(self) -> PodRunner:
        self.root.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._main, name="pod-runner", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(STOP_GRACE_S_MAX + 10)
        with self._lock:
            containers = list(self.containers.values())
        for c in containers:
            c.stop()

    def __enter__(self) -> PodRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill(self, namespace: str, pod: str) -> None:
        """SIGKILL a pod's process (a crash); the runner restarts it."""
        with self._lock:
            container = self.containers[(namespace, pod)]
        container.stop(kill=True)

    def address(self, namespace: str, pod: str) -> str:
        with self._lock:
            return f"{self.containers[(namespace, pod)].ip}:3181"

    def check(self) -> None:
        """Raise what stopped the runner, if anything did."""
        if self._error is not None:
            raise RuntimeError(f"the pod runner stopped: {self._error!r}") from self._error

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as e:
            self._error = e

    async def _run(self) -> None:
        async with Api(self.url) as api:
            while not self._stop.is_set():
                try:
                    await self.tick(api)
                except (TimeoutError, ApiError, aiohttp.ClientError) as e:
                    self.errors.append(f"{time.strftime('%H:%M:%S')} {e}")
                    del self.errors[:-100]
                    print(f"pod runner: {e}", file=sys.stderr)
                await asyncio.sleep(POLL_S)

    # -- one pass ----------------------------------------------------------------------------------------------
    async def tick(self, api: Api) -> None:
        sets = await api.list("apps/v1", "statefulsets")
        pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in await api.list("v1", "pods")}
        wanted: set[tuple[str, str]] = set()
        for sts in sets:
            wanted |= await self._reconcile_set(api, sts, pods)
        # Pods deleted from the API, or left by a StatefulSet that is gone: stop their processes.
        with self._lock:
            gone = [key for key in self.containers if key not in pods or key not in wanted]
        for key in gone:
            await self._remove(api, key, key in pods)
        await self._collect_claims(api)

    async def _reconcile_set(self, api: Api, sts: dict[str, Any], pods: dict[tuple[str, str], Any]
                             ) -> set[tuple[str, str]]:
        meta, spec = sts["metadata"], sts["spec"]
        namespace, name = meta["namespace"], meta["name"]
        replicas = int(spec.get("replicas") or 0)
        revision = _hash(spec["template"])
        keys = {(namespace, f"{name}-{i}") for i in range(replicas)}
        for i in range(replicas):
            key = (namespace, f"{name}-{i}")
            with self._lock:
                container = self.containers.get(key)
            if key not in pods or container is None:
                if key in pods and container is None:  # left by an earlier runner: replace it
                    await api.delete("v1", "pods", namespace, key[1])
                created = await self._create_pod(api, sts, i, revision)
                if created is None:  # the StatefulSet was deleted since this pass listed it
                    return set()
                pods[key] = created  # not gone: this pass made it
                continue
            await self._supervise(api, container)
        await self._roll(api, sts, revision, replicas)
        with self._lock:
            mine = [c for (ns, pod), c in self.containers.items() if ns == namespace and (ns, pod) in keys]
        ready = sum(1 for c in mine if c.ready)
        updated = sum(1 for c in mine if c.revision == revision)
        status = {"observedGeneration": meta.get("generation", 1), "replicas": len(mine), "readyReplicas": ready,
                  "availableReplicas": ready, "currentReplicas": updated, "updatedReplicas": updated,
                  "currentRevision": f"{name}-{revision}", "updateRevision": f"{name}-{revision}"}
        if any(sts.get("status", {}).get(key) != value for key, value in status.items()):  # writes only changes
            await api.patch("apps/v1", "statefulsets", namespace, name, {"status": status}, sub="status")
        return keys

    async def _set_exists(self, api: Api, sts: dict[str, Any]) -> bool:
        meta = sts["metadata"]
        current = await api.get("apps/v1", "statefulsets", meta["namespace"], meta["name"])
        return current is not None and current["metadata"].get("uid") == meta.get("uid")

    async def _create_pod(self, api: Api, sts: dict[str, Any], ordinal: int, revision: str
                          ) -> dict[str, Any] | None:
        """Create the pod (and its claims) and start its container; None, creating nothing that stays, when the
        StatefulSet is gone. Checked before and after creating: a pass works from a list read earlier, and a
        claim made after an uninstall deleted the claims would be left behind (the controller never acts on a
        deleted set)."""
        if not await self._set_exists(api, sts):
            return None
        meta, spec = sts["metadata"], sts["spec"]
        namespace, pod = meta["namespace"], f"{meta['name']}-{ordinal}"
        template = spec["template"]
        pod_spec = template["spec"]
        ip = self._ips.setdefault((namespace, pod), f"{self.ip_prefix}.{len(self._ips) + 1}")
        claims: list[str] = []
        made_claims: list[str] = []  # created here, not found: removed again if the set turns out gone
        for claim in spec.get("volumeClaimTemplates") or []:
            claim_name = f"{claim['metadata']['name']}-{pod}"
            claims.append(claim_name)
            made = await api.create("v1", "persistentvolumeclaims", namespace, {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim_name, "namespace": namespace,
                             "labels": dict(claim["metadata"].get("labels") or {})},
                "spec": claim["spec"], "status": {"phase": "Bound"}})
            if made:
                made_claims.append(claim_name)
            (self.root / namespace / "volumes" / claim_name).mkdir(parents=True, exist_ok=True)
        labels = {**dict(template["metadata"].get("labels") or {}), "controller-revision-hash": revision,
                  "statefulset.kubernetes.io/pod-name": pod}
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": namespace, "labels": labels, "uid": str(uuid.uuid4()),
                             "annotations": dict(template["metadata"].get("annotations") or {}),
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                                                  "name": meta["name"], "uid": meta["uid"], "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "spec": {**pod_spec, "hostname": pod, "subdomain": spec.get("serviceName", "")},
                "status": {"phase": "Pending", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": ip}}
        await api.delete("v1", "pods", namespace, pod)
        await api.create("v1", "pods", namespace, body)
        if not await self._set_exists(api, sts):
            await api.delete("v1", "pods", namespace, pod)
            for claim_name in made_claims:
                await api.delete("v1", "persistentvolumeclaims", namespace, claim_name)
            return None
        container = await self._container(api, body, ip, revision, claims)
        container.start()
        with self._lock:
            self.containers[(namespace, pod)] = container
            self.started[pod] += 1
        return body

    async def _container(self, api: Api, pod: dict[str, Any], ip: str, revision: str,
                         claims: list[str]) -> Container:
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        spec = pod["spec"]
        c = spec["containers"][0]
        home = self.root / namespace / "pods" / name
        home.mkdir(parents=True, exist_ok=True)
        mounts: dict[str, Path] = {}
        files: dict[Path, bytes] = {}
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        for mount in c.get("volumeMounts") or []:
            volume = volumes.get(mount["name"])
            if volume is not None and ("configMap" in volume or "secret" in volume):
                where = home / "volumes" / mount["name"]
                mounts[mount["mountPath"]] = where
                if "configMap" in volume:
                    cm = await api.get("v1", "configmaps", namespace, volume["configMap"]["name"])
                    contents = {k: v.encode() for k, v in ((cm or {}).get("data") or {}).items()}
                    items = volume["configMap"].get("items")
                else:  # a Secret's data is base64; a missing Secret keeps the pod from starting, as the kubelet does
                    secret = await api.get("v1", "secrets", namespace, volume["secret"]["secretName"])
                    if secret is None:
                        raise ApiError(404, f"pod {name}: secret {volume['secret']['secretName']} does not exist")
                    contents = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
                    items = volume["secret"].get("items")
                for key, value in contents.items():
                    path = next((i["path"] for i in items if i["key"] == key), None) if items else key
                    if path is not None:
                        files[where / path] = value
            elif volume is not None and "emptyDir" in volume:
                mounts[mount["mountPath"]] = home / "volumes" / mount["name"]
            else:  # a claim from the volumeClaimTemplates
                mounts[mount["mountPath"]] = self.root / namespace / "volumes" / f"{mount['name']}-{name}"
        for path, value in files.items():
            # The process sees the pod's paths as this host's: paths inside a mounted file (a settings file
            # naming a certificate under another mount) are translated too, as a container's namespace would.
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(self._translate(value, mounts))
            path.chmod(0o600)
        env = await self._env(api, pod, c.get("env") or [], ip)
        args = [self._real_path(a, mounts) for a in [*(c.get("command") or [])[1:], *(c.get("args") or [])]]
        data = next((path for mount, path in mounts.items() if mount == "/data"), home / "data")
        for mount, path in mounts.items():  # a volume mounted inside another (a logs volume under /data)
            if mount.startswith("/data/"):
                link = data / mount[len("/data/"):]
                if not link.exists():
                    link.parent.mkdir(parents=True, exist_ok=True)
                    link.symlink_to(path, target_is_directory=True)
        argv = [sys.executable, "-m", "octavo.cli.main", *args, "--data-dir", str(data), "--host", ip,
                "--advertised-address", f"{ip}:3181"]
        return Container(pod=name, namespace=namespace, ip=ip, revision=revision, argv=argv, env=env,
                         log_path=home / "container.log", ready_file=home / "ready",
                         grace_s=min(float(spec.get("terminationGracePeriodSeconds") or 30), STOP_GRACE_S_MAX),
                         claims=claims)

    @staticmethod
    def _translate(data: bytes, mounts: dict[str, Path]) -> bytes:
        """Quoted paths under a mount, in one pass (a translated path is never translated again)."""
        if not mounts:
            return data
        longest_first = sorted(mounts, key=len, reverse=True)
        pattern = rb'(?<=")(' + b"|".join(re.escape(m.encode()) for m in longest_first) + rb')(?=[/"])'
        return re.sub(pattern, lambda m: str(mounts[m.group(1).decode()]).encode(), data)

    @staticmethod
    def _real_path(arg: str, mounts: dict[str, Path]) -> str:
        for mount, path in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
            if arg == mount or arg.startswith(mount + "/"):
                return str(path) + arg[len(mount):]
        return arg

    async def _env(self, api: Api, pod: dict[str, Any], specs: list[dict[str, Any]], ip: str) -> dict[str, str]:
        fields = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"]["namespace"],
                  "status.podIP": ip}
        env: dict[str, str] = {}
        for item in specs:
            if "value" in item:
                value = VAR.sub(lambda m: env.get(m.group(1), m.group(0)), str(item["value"]))
            else:
                source = item.get("valueFrom") or {}
                if "fieldRef" in source:
                    value = fields.get(source["fieldRef"]["fieldPath"], "")
                else:
                    kind, ref = (("configmaps", source["configMapKeyRef"]) if "configMapKeyRef" in source
                                 else ("secrets", source["secretKeyRef"]))
                    obj = await api.get("v1", kind, pod["metadata"]["namespace"], ref["name"])
                    value = ((obj or {}).get("data") or {}).get(ref["key"], "")
                    if kind == "secrets" and value:
                        value = base64.b64decode(value).decode()
            env[item["name"]] = value
        return env

    async def _supervise(self, api: Api, c: Container) -> None:
        """Restart an exited container; publish readiness changes."""
        if not c.running():
            if c.exited_at == 0.0:
                c.exited_at = time.monotonic()
            elif time.monotonic() - c.exited_at >= RESTART_BACKOFF_S:
                c.restarts += 1
                c.exited_at = 0.0
                c.start()
                with self._lock:
                    self.started[c.pod] += 1
            ready = False
        else:
            ready = c.ready_file.exists()
        if ready != c.ready or c.exited_at:
            c.ready = ready
            condition = {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": _now()}
            await api.patch("v1", "pods", c.namespace, c.pod, {"status": {
                "phase": "Running" if c.running() else "Pending", "podIP": c.ip, "conditions": [condition],
                "containerStatuses": [{"name": "bookie", "ready": ready, "restartCount": c.restarts,
                                       "started": c.running()}]}}, sub="status")

    async def _roll(self, api: Api, sts: dict[str, Any], revision: str, replicas: int) -> None:
        """One pod at a time, highest ordinal first, only while every other pod is ready."""
        namespace, name = sts["metadata"]["namespace"], sts["metadata"]["name"]
        with self._lock:
            mine = [self.containers.get((namespace, f"{name}-{i}")) for i in range(replicas)]
        if any(c is None or not c.ready for c in mine):
            return
        stale = [c for c in mine if c is not None and c.revision != revision]
        if stale:
            await self._remove(api, (namespace, stale[-1].pod), True)

    async def _remove(self, api: Api, key: tuple[str, str], delete_pod: bool) -> None:
        with self._lock:
            container = self.containers.pop(key, None)
        if container is not None:
            await asyncio.to_thread(container.stop)
        if delete_pod:
            await api.delete("v1", "pods", key[0], key[1])

    async def _collect_claims(self, api: Api) -> None:
        claims = {(c["metadata"]["namespace"], c["metadata"]["name"])
                  for c in await api.list("v1", "persistentvolumeclaims")}
        with self._lock:
            used = {(c.namespace, claim) for c in self.containers.values() for claim in c.claims}
        for namespace_dir in (d for d in self.root.iterdir() if d.is_dir()) if self.root.exists() else ():
            volumes = namespace_dir / "volumes"
            for volume in (volumes.iterdir() if volumes.exists() else ()):
                key = (namespace_dir.name, volume.name)
                if key not in claims and key not in used:
                    shutil.rmtree(volume, ignore_errors=True)
