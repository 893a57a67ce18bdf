"""The objects a BookieCluster owns, built from its spec; the settings file they carry is read by the real
`octavo node` configuration path."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any

from octavo.cli.main import resolve_node_config
from octavo.operator.builders import (
    APPLIED_GENERATION,
    BOOKIE_PORT,
    CONFIG_FILE,
    bookie_ids,
    bookie_toml,
    owned_objects,
    selector_string,
)
from octavo.operator.resources import CompactionSettings, parse_cluster

SPEC = {"image": "octavo:0.1", "replicas": 4, "storage": {"size": "20Gi", "storageClassName": "fast"},
        "etcd": {"endpointsFrom": {"secretKeyRef": {"name": "etcd", "key": "endpoints"}}},
        "bookie": {"lost_bookie_delay_s": 120, "compaction_rate_bytes_per_s": 1000},
        "podTemplate": {"annotations": {"team": "logs"}, "tolerations": [{"key": "storage", "operator": "Exists"}]},
        "podDisruptionBudget": {"maxUnavailable": 2}}


def objects(spec: dict[str, Any] = SPEC, compaction: CompactionSettings | None = None) -> dict[str, dict[str, Any]]:
    return {f"{o['kind']}/{o['metadata']['name']}": o
            for o in owned_objects("logs", "prod", parse_cluster("logs", spec), compaction, replicas=4, generation=7)}


def test_the_statefulset_takes_the_replicas_and_the_generation_it_is_given_not_the_specs() -> None:
    """A scale-down keeps the StatefulSet above spec.replicas until the highest bookie is retired; the generation
    marks the StatefulSet's own metadata, never its pod template (which would roll every pod)."""
    spec = parse_cluster("logs", SPEC)
    built = {o["kind"]: o for o in owned_objects("logs", "prod", spec, None, replicas=6, generation=12)}
    sts = built["StatefulSet"]
    assert spec.replicas == 4 and sts["spec"]["replicas"] == 6
    assert sts["metadata"]["annotations"] == {APPLIED_GENERATION: "12"}
    again = owned_objects("logs", "prod", spec, None, replicas=6, generation=13)[-1]
    assert again["spec"]["template"] == sts["spec"]["template"], "a new generation alone changed the pods"


def test_a_cluster_owns_a_statefulset_two_services_a_pdb_and_its_config() -> None:
    objs = objects()
    assert list(objs) == ["ConfigMap/logs-bookie-config", "Service/logs-bookies", "Service/logs",
                          "PodDisruptionBudget/logs", "StatefulSet/logs"]
    sts = objs["StatefulSet/logs"]["spec"]
    assert sts["replicas"] == 4 and sts["serviceName"] == "logs-bookies"
    assert sts["selector"]["matchLabels"] == dict(kv.split("=") for kv in selector_string("logs").split(","))
    assert [c["metadata"]["name"] for c in sts["volumeClaimTemplates"]] == ["data"]
    assert sts["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "fast"
    assert sts["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "20Gi"
    pod = sts["template"]["spec"]
    container = pod["containers"][0]
    assert container["readinessProbe"]["grpc"]["port"] == BOOKIE_PORT
    assert pod["terminationGracePeriodSeconds"] >= 60
    assert pod["tolerations"] == [{"key": "storage", "operator": "Exists"}]
    assert sts["template"]["metadata"]["annotations"]["team"] == "logs"
    env = {e["name"]: e for e in container["env"]}
    assert env["OCTAVO_NODE_ETCD"]["valueFrom"] == {"secretKeyRef": {"name": "etcd", "key": "endpoints"}}
    assert env["OCTAVO_NODE_BOOKIE_ID"]["value"] == "$(POD_NAME)"
    assert objs["Service/logs-bookies"]["spec"]["clusterIP"] == "None"
    assert objs["PodDisruptionBudget/logs"]["spec"]["maxUnavailable"] == 2
    assert bookie_ids("logs", 3) == ["logs-0", "logs-1", "logs-2"]


def test_a_separate_logs_volume_gets_its_own_claim_and_mount() -> None:
    spec = {**SPEC, "storage": {"size": "5Gi", "logs": {"size": "50Gi"}}}
    sts = objects(spec)["StatefulSet/logs"]["spec"]
    assert [c["metadata"]["name"] for c in sts["volumeClaimTemplates"]] == ["data", "logs"]
    mounts = {m["name"]: m["mountPath"] for m in sts["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["logs"].startswith(mounts["data"] + "/")


def test_the_settings_file_is_what_octavo_node_reads(tmp_path: Path) -> None:
    """The ConfigMap's TOML through the real `octavo node` configuration (file plus the pod's environment): the
    cluster's own settings win over the policy's compaction settings."""
    spec = parse_cluster("logs", SPEC)
    text = bookie_toml(spec, CompactionSettings(minor_threshold=0.1, major_threshold=0.7, rate_bytes_per_s=5000))
    assert tomllib.loads(text)["cluster"] == "logs"
    path = tmp_path / CONFIG_FILE
    path.write_text(text)
    args = argparse.Namespace(config=str(path))
    config = resolve_node_config(args, environ={"OCTAVO_NODE_BOOKIE_ID": "logs-2", "OCTAVO_NODE_ETCD": "etcd:2379"})
    assert (config.bookie_id, config.cluster, config.port, config.data_dir) == ("logs-2", "logs", BOOKIE_PORT, "/data")
    assert config.lost_bookie_delay_s == 120.0 and config.compaction_minor_threshold == 0.1
    assert config.compaction_rate_bytes_per_s == 1000  # the cluster's bookie settings win


def test_a_settings_change_rolls_the_pods_and_nothing_else_does() -> None:
    def config_hash(spec: dict[str, Any], compaction: CompactionSettings | None = None) -> str:
        sts = objects(spec, compaction)["StatefulSet/logs"]
        return str(sts["spec"]["template"]["metadata"]["annotations"]["octavo.io/config-hash"])

    base = config_hash(SPEC)
    assert config_hash({**SPEC, "replicas": 5}) == base
    assert config_hash({**SPEC, "bookie": {"lost_bookie_delay_s": 30}}) != base
    assert config_hash(SPEC, CompactionSettings(rate_bytes_per_s=1)) != base
    assert CONFIG_FILE in objects()["ConfigMap/logs-bookie-config"]["data"]


TLS_SPEC = {**SPEC, "tls": {"secretName": "logs-tls", "adminIdentities": ["octavo-operator"], "metrics": True},
            "bookie": {"tenant_prefixes": "spark-sales=sales."},
            "etcd": {"endpoints": "etcd:2379", "tls": {"secretName": "etcd-client"},
                     "credentials": {"secretName": "etcd-user"}}}


def test_tls_and_etcd_secrets_are_mounted_and_named_in_the_settings(tmp_path: Path) -> None:
    """spec.tls and spec.etcd.tls/credentials: each Secret mounted read-only as a directory (so renewals reach the
    files), the settings point into them, the etcd user comes from the Secret, and the probes leave gRPC (which
    the kubelet cannot probe over TLS) for /healthz on the metrics port over HTTPS."""
    objs = objects(TLS_SPEC)
    pod = objs["StatefulSet/logs"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "logs-tls"
    assert volumes["etcd-tls"]["secret"]["secretName"] == "etcd-client"
    assert volumes["etcd-credentials"]["secret"] == {"secretName": "etcd-user", "defaultMode": 0o440,
                                                     "items": [{"key": "password", "path": "password"}]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert all(mounts[n]["readOnly"] and "subPath" not in mounts[n] for n in ("tls", "etcd-tls", "etcd-credentials"))
    env = {e["name"]: e for e in container["env"]}
    assert env["OCTAVO_NODE_ETCD_USERNAME"]["valueFrom"] == {"secretKeyRef": {"name": "etcd-user", "key": "username"}}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics", "scheme": "HTTPS"}
    # The settings file, through the real configuration path, names files under the mounts.
    path = tmp_path / CONFIG_FILE
    path.write_text(objs["ConfigMap/logs-bookie-config"]["data"][CONFIG_FILE])
    config = resolve_node_config(argparse.Namespace(config=str(path)),
                                 environ={"OCTAVO_NODE_ETCD_USERNAME": "bookies", "OCTAVO_NODE_ETCD": "etcd:2379"})
    where = {m["mountPath"] for m in container["volumeMounts"]}
    for value in (config.tls_cert_file, config.tls_key_file, config.tls_ca_file, config.etcd_tls_ca_file,
                  config.etcd_tls_cert_file, config.etcd_tls_key_file, config.etcd_password_file):
        assert value.rsplit("/", 1)[0] in where, value
    assert (config.tls_client_auth, config.admin_identities, config.metrics_tls) == ("require", "octavo-operator",
                                                                                      True)
    assert config.etcd_username == "bookies"
    assert config.tenant_prefixes == "spark-sales=sales."  # a tenant needs the operator's TLS: accepted with it


def test_without_tls_nothing_changes() -> None:
    """A cluster without spec.tls keeps plaintext, gRPC probes and no Secret volumes."""
    container = objects()["StatefulSet/logs"]["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["grpc"] == {"port": BOOKIE_PORT}
    assert "tls" not in objects()["ConfigMap/logs-bookie-config"]["data"][CONFIG_FILE]
    server_ca_only = {**SPEC, "etcd": {"endpoints": "e:2379", "tls": {"secretName": "ca", "clientCertificate": False}}}
    text = objects(server_ca_only)["ConfigMap/logs-bookie-config"]["data"][CONFIG_FILE]
    assert "etcd_tls_ca_file" in text and "etcd_tls_cert_file" not in text
