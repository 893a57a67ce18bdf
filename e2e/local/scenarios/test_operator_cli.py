"""`octavo operator run` as a process: its flags refused with a message, its liveness endpoint, and its work
against the local control plane's API server (conftest.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from octavo.cli.localcluster import free_port

LocalKube = Any  # the local_kube fixture (conftest.py)


def run(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "octavo.cli.main", "operator", "run", *args], capture_output=True,
                          text=True, timeout=timeout_s)


@pytest.mark.parametrize(("args", "message"), [
    (["--poll-interval-s", "0"], "poll_interval_s must be in [0.1, 3600]"),
    (["--liveness", "nowhere"], "--liveness must be HOST:PORT"),
    (["--admin-timeout-s", "-1"], "admin_timeout_s must be in"),
    (["--decommission-rate-bytes-per-s", "-5"], "decommission_rate_bytes_per_s must be >= 0"),
    (["--roll-ready-timeout-s", "0"], "--roll-ready-timeout-s must be in [1, 86400]"),
    (["--metrics-tls"], "--metrics-tls serves the operator's certificate: set OCTAVO_TLS_CERT_FILE"),
])
def test_bad_flags_are_refused_with_a_message(args: list[str], message: str) -> None:
    out = run(*args)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_the_operator_process_answers_liveness_and_reconciles(local_kube: LocalKube, tmp_path: Path) -> None:
    port = free_port()
    k = local_kube.k
    log = open(tmp_path / "operator.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "octavo.cli.main", "operator", "run", "--kubeconfig",
                             local_kube.kubeconfig, "--poll-interval-s", "0.5", "--liveness", f"127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    assert r.status == 200
                    break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, (tmp_path / "operator.log").read_text()
                assert time.monotonic() < deadline, "no liveness endpoint within 60 s"
                time.sleep(0.2)
        body = {"apiVersion": "octavo.io/v1alpha1", "kind": "BookieCluster",
                "metadata": {"name": "logs", "namespace": "default"},
                "spec": {"replicas": 3, "image": "octavo:dev", "storage": {"size": "1Gi"},
                         "etcd": {"endpoints": "127.0.0.1:1"}}}
        k.create("octavo.io/v1alpha1", "bookieclusters", body)
        while k.get("apps/v1", "statefulsets", "logs") is None:
            assert time.monotonic() < deadline + 30, "no StatefulSet from the operator process"
            time.sleep(0.2)
        while True:  # the liveness probe reports the last poll once there was one
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                probes = json.loads(r.read())
            if probes["poll"]["lastPoll"]:
                break
            assert time.monotonic() < deadline + 60, probes
            time.sleep(0.2)
    finally:
        proc.terminate()
        assert proc.wait(30) == 0, (tmp_path / "operator.log").read_text()
        log.close()
