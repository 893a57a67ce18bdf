"""The chart's monitoring objects: the alert rules pass `promtool check rules` and promtool's unit tests (each
alert fires on the series that should raise it and not on healthy ones); the dashboard is valid JSON whose every
query is valid PromQL; every metric the alerts and the dashboard name is served by a real bookie of a real
cluster (or the operator); the ServiceMonitors select the Services the operator makes, on their metrics port; the
pods carry the scrape annotations."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from helmtool import CHART, ROOT, render
from prometheus_client.parser import text_string_to_metric_families

from octavo.cli.localcluster import LocalCluster
from octavo.node.testing import BookieConnection
from octavo.operator import builders
from octavo.operator.operatormetrics import OperatorMetrics
from octavo.operator.resources import parse_cluster
from octavo.telemetry import Telemetry

ALERTS = Path(__file__).resolve().parent / "alerts"
DASHBOARD = CHART / "dashboards" / "octavo-overview.json"
ALL_ON = ["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true",
          "--set", "metrics.grafanaDashboard.enabled=true"]
METRIC = re.compile(r"\b(octavo_(?:bookie|operator)_[a-z_]+)")


@pytest.fixture(scope="session")
def promtool() -> str:
    for candidate in (os.environ.get("OCTAVO_PROMTOOL"), str(ROOT / ".tools" / "bin" / "promtool"),
                      shutil.which("promtool")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail("no promtool: run `make promtool` (unpacks it from Debian's prometheus package into .tools/bin), "
                "or set OCTAVO_PROMTOOL")


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def rule_groups(helm: str, *values: str) -> list[dict[str, Any]]:
    rules = by_kind(render(helm, *ALL_ON, *values), "PrometheusRule")
    assert len(rules) == 1
    return rules[0]["spec"]["groups"]  # type: ignore[no-any-return]


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if isinstance(v.get("query"), dict)]
    return exprs


def as_promql(expr: str) -> str:
    """A dashboard query with Grafana's variables replaced as Grafana would."""
    return expr.replace("$__rate_interval", "2m").replace("$namespace", ".*")



def _sts(spec: Any, config_hash: str) -> dict[str, Any]:
    """The StatefulSet the operator builds for a fresh cluster of this spec."""
    return builders.stateful_set("octavo", "octavo", spec, config_hash, replicas=spec.replicas, generation=1)

def test_the_alert_rules_pass_promtool_check_and_its_unit_tests(helm: str, promtool: str, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups(helm)}))
    checked = subprocess.run([promtool, "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    shutil.copy(ALERTS / "octavo_alerts_test.yaml", tmp_path)
    tested = subprocess.run([promtool, "test", "rules", "octavo_alerts_test.yaml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr
    # Every alert of the chart has a unit test.
    alerts = {r["alert"] for g in rule_groups(helm) for r in g["rules"]}
    assert alerts == set(re.findall(r"alertname: (\w+)", (ALERTS / "octavo_alerts_test.yaml").read_text()))


def test_the_unit_tests_can_fail(helm: str, promtool: str, tmp_path: Path) -> None:
    """A threshold moved by a value changes what fires: the unit tests catch it."""
    groups = rule_groups(helm, "--set", "metrics.prometheusRule.underReplicatedMinutes=60")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    shutil.copy(ALERTS / "octavo_alerts_test.yaml", tmp_path)
    tested = subprocess.run([promtool, "test", "rules", "octavo_alerts_test.yaml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert tested.returncode != 0 and "OctavoUnderReplicatedLedgers" in tested.stdout + tested.stderr


def test_every_dashboard_query_is_valid_promql(promtool: str, tmp_path: Path) -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 20
    rules = [{"record": f"dashboard:query_{i}", "expr": as_promql(e)} for i, e in enumerate(exprs)
             if not e.startswith("label_values(")]  # Grafana's own function, not PromQL
    (tmp_path / "dashboard.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = subprocess.run([promtool, "check", "rules", "dashboard.yaml"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # And a broken query would be caught.
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump({"groups": [{"name": "b", "rules": [
        {"record": "x:y", "expr": "sum by (pod (rate(octavo_bookie_add_entries_total[2m]))"}]}]}))
    assert subprocess.run([promtool, "check", "rules", "broken.yaml"], cwd=tmp_path, capture_output=True,
                          timeout=60).returncode != 0


def scraped_names(address: str) -> set[str]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def scraped_samples(address: str) -> dict[str, float]:
    """sample name -> value (the last one of the name: enough for the unlabelled gauges compared here)."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def operator_names() -> set[str]:
    telemetry = Telemetry("octavo-operator")
    metrics = OperatorMetrics(telemetry)
    metrics.actions.add(1, {"kind": "ForceReadOnly", "result": "ok"})
    metrics.objects_applied.add(1)
    with metrics.reconciling("poll"):
        pass
    metrics.windows[("ns", "policy")] = True
    text = telemetry.text().decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_every_metric_the_alerts_and_the_dashboard_name_is_served(helm: str, tmp_path: Path) -> None:
    named = {m for expr in dashboard_exprs() for m in METRIC.findall(expr)}
    named |= {m for g in rule_groups(helm) for r in g["rules"] for m in METRIC.findall(r["expr"])}
    assert len(named) >= 20
    with LocalCluster(str(tmp_path / "cluster"), bookies=3, bookie_args=["--metrics-port", "0"]) as cluster:
        from octavo.client import SyncClient

        with SyncClient(cluster.etcd_endpoint) as client:
            handle = client.create_ledger(3, 3, 2, password=b"pw")
            for _ in range(3):
                handle.append_many([b"m" * 500] * 100)
            reader = client.open_ledger(handle.ledger_id, password=b"pw")
            assert len(list(reader.read(0, 299))) == 300
        with BookieConnection(cluster.bookies["bookie-0"].address) as conn:
            refused = conn.add(handle.ledger_id, b"wrong", [1000], [b"x"])  # an UNAUTHORIZED refusal
            assert refused.results[0].codes
        served: set[str] = set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the auditor counts the under-replication marks on its first tick
            served = set().union(*(scraped_names(b.metrics_address) for b in cluster.bookies.values()))
            if "octavo_bookie_underreplicated_ledgers" in served:
                break
            time.sleep(0.5)
        # `octavo cluster status` names where each bookie's metrics are, and tells the same figures.
        run = subprocess.run([sys.executable, "-m", "octavo.cli.main", "cluster", "status", "--json", "--etcd",
                              cluster.etcd_endpoint], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        status = json.loads(run.stdout)
        for row in status["bookies"]:
            bookie = cluster.bookies[row["id"]]
            assert row["metrics_address"] == bookie.metrics_address
            samples = scraped_samples(bookie.metrics_address)
            assert abs(samples["octavo_bookie_disk_usage_ratio"] - row["disk_usage_ratio"]) < 0.01
            assert samples["octavo_bookie_ledgers"] == row["ledgers"]
            if "octavo_bookie_underreplicated_ledgers" in samples:  # the auditor
                assert row["id"] == status["auditor"]
                assert samples["octavo_bookie_underreplicated_ledgers"] == status["underreplicated"]["ledgers"]
    served |= operator_names()
    assert sorted(named - served) == []


def test_the_service_monitors_select_the_services_the_operator_makes(helm: str) -> None:
    docs = render(helm, *ALL_ON)
    monitors = {m["metadata"]["name"]: m for m in by_kind(docs, "ServiceMonitor")}
    assert set(monitors) == {"octavo-bookies", "octavo-operator"}
    spec = parse_cluster("octavo", by_kind(docs, "BookieCluster")[0]["spec"])
    headless = builders.headless_service("octavo", "octavo")
    client = builders.client_service("octavo", "octavo")
    bookies = monitors["octavo-bookies"]["spec"]
    selector = bookies["selector"]["matchLabels"]
    for service in (headless, client):
        assert selector.items() <= service["metadata"]["labels"].items()
    ports = {p["name"] for p in headless["spec"]["ports"]}
    assert [e["port"] for e in bookies["endpoints"]] == ["metrics"] and "metrics" in ports
    stateful_set = _sts(spec, "hash")
    container = stateful_set["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "metrics", "containerPort": builders.METRICS_PORT, "protocol": "TCP"} in container["ports"]
    annotations = stateful_set["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(builders.METRICS_PORT)
    assert "metrics_port = 9181" in builders.bookie_toml(spec, None)
    operator_service = next(s for s in by_kind(docs, "Service") if s["metadata"]["name"] == "octavo-operator")
    assert monitors["octavo-operator"]["spec"]["selector"]["matchLabels"].items() <= \
        operator_service["metadata"]["labels"].items()
    deployment = by_kind(docs, "Deployment")[0]
    assert deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "9180"
    assert "--metrics-port=9180" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    # A podTemplate annotation wins over the operator's default.
    custom = parse_cluster("octavo", {**by_kind(docs, "BookieCluster")[0]["spec"],
                                      "podTemplate": {"annotations": {"prometheus.io/scrape": "false"}}})
    assert _sts(custom, "h")["spec"]["template"]["metadata"]["annotations"][
        "prometheus.io/scrape"] == "false"


def test_monitoring_objects_are_off_by_default_and_the_dashboard_is_shipped_whole(helm: str) -> None:
    docs = render(helm)
    assert not by_kind(docs, "ServiceMonitor") and not by_kind(docs, "PrometheusRule")
    assert not [c for c in by_kind(docs, "ConfigMap") if c["metadata"]["name"].endswith("-dashboard")]
    config_map = next(c for c in by_kind(render(helm, *ALL_ON), "ConfigMap")
                      if c["metadata"]["name"].endswith("-dashboard"))
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["octavo-overview.json"]) == json.loads(DASHBOARD.read_text())


def test_network_policies_select_the_pods_they_guard_and_admit_who_needs_each_port(helm: str) -> None:
    values = str(Path(__file__).resolve().parent / "values" / "good" / "network-policy.yaml")
    docs = render(helm, "-f", values)
    policies = {p["metadata"]["name"]: p["spec"] for p in by_kind(docs, "NetworkPolicy")}
    assert set(policies) == {"octavo-bookies", "octavo-etcd", "octavo-operator"}
    spec = parse_cluster("octavo", by_kind(docs, "BookieCluster")[0]["spec"])
    bookie_pod = _sts(spec, "h")["spec"]["template"]["metadata"]["labels"]
    operator_pod = by_kind(docs, "Deployment")[0]["spec"]["template"]["metadata"]["labels"]
    etcd_pod = by_kind(docs, "StatefulSet")[0]["spec"]["template"]["metadata"]["labels"]
    test_pod = by_kind(docs, "Pod")[0]["metadata"]["labels"]

    def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
        return selector["matchLabels"].items() <= labels.items()

    def admitted(rule: dict[str, Any], labels: dict[str, str]) -> bool:
        return any("namespaceSelector" not in peer and "podSelector" in peer and selects(peer["podSelector"], labels)
                   for peer in rule.get("from", []))

    bookies = policies["octavo-bookies"]
    assert selects(bookies["podSelector"], bookie_pod) and not selects(bookies["podSelector"], operator_pod)
    grpc_rule = next(r for r in bookies["ingress"] if r["ports"][0]["port"] == 3181)
    for who in (bookie_pod, operator_pod, test_pod):
        assert admitted(grpc_rule, who)
    assert not admitted(grpc_rule, etcd_pod)
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "pipelines"}},
            "podSelector": {"matchLabels": {"app": "spark"}}} in grpc_rule["from"]
    metrics_rule = next(r for r in bookies["ingress"] if r["ports"][0]["port"] == builders.METRICS_PORT)
    assert metrics_rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name":
                                                                            "monitoring"}}}]
    etcd = policies["octavo-etcd"]
    assert selects(etcd["podSelector"], etcd_pod)
    client_rule = next(r for r in etcd["ingress"] if r["ports"][0]["port"] == 2379)
    assert all(admitted(client_rule, who) for who in (bookie_pod, operator_pod, test_pod))
    peer_rule = next(r for r in etcd["ingress"] if r["ports"][0]["port"] == 2380)
    assert admitted(peer_rule, etcd_pod) and not admitted(peer_rule, bookie_pod)
    assert selects(policies["octavo-operator"]["podSelector"], operator_pod)
    # Off by default; without metricsFrom nobody reaches the metrics ports.
    assert not by_kind(render(helm), "NetworkPolicy")
    bare = {p["metadata"]["name"]: p["spec"] for p in by_kind(render(helm, "--set", "networkPolicy.enabled=true"),
                                                                "NetworkPolicy")}
    assert [r["ports"][0]["port"] for r in bare["octavo-bookies"]["ingress"]] == [3181]


def test_bookie_pods_run_locked_down() -> None:
    spec = parse_cluster("octavo", {"replicas": 3, "image": "octavo:dev", "storage": {"size": "1Gi"},
                                    "etcd": {"endpoints": "e:2379"}})
    pod = _sts(spec, "h")["spec"]["template"]["spec"]
    container = pod["containers"][0]["securityContext"]
    assert container == {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "readOnlyRootFilesystem": True,
                         "capabilities": {"drop": ["ALL"]}}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsUser"] != 0
    assert {"name": "tmp", "mountPath": "/tmp"} in pod["containers"][0]["volumeMounts"]
