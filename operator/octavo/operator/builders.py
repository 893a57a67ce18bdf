"""The Kubernetes objects of a BookieCluster, built from its parsed spec. Pure: plain dicts in, plain dicts out;
the handlers add owner references and apply them.

- a StatefulSet: stable pod names are stable bookie ids (`<name>-0`, `<name>-1`, ...), one PVC per pod (two with
  a separate logs volume), readiness and liveness from the bookie's gRPC health service, a graceful SIGTERM
  (the bookie syncs and stops cleanly within the grace period), the settings from the ConfigMap;
- a headless Service (stable DNS names for the pods, used as the bookies' advertised addresses) and a client
  Service;
- a PodDisruptionBudget (`maxUnavailable`, default 1);
- a ConfigMap holding the bookie settings as the TOML file `octavo node --config` reads.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from octavo.operator.resources import ClusterSpec, CompactionSettings

BOOKIE_PORT = 3181
# Every bookie serves Prometheus metrics here (/metrics); the pods carry the prometheus.io scrape annotations
# (a podTemplate annotation of the same name wins) and the headless Service names the port for ServiceMonitors.
METRICS_PORT = 9181
DATA_DIR = "/data"
LOGS_DIR = "/data/logs"
CONFIG_DIR = "/etc/octavo"
CONFIG_FILE = "bookie.toml"
# Secrets mounted into the bookie pods (cert-manager's keys: tls.crt, tls.key, ca.crt), beside the config
# volume rather than inside it (a mount point inside a read-only ConfigMap volume cannot be made).
TLS_DIR = "/etc/octavo-tls"
ETCD_TLS_DIR = "/etc/octavo-etcd-tls"
ETCD_CREDENTIALS_DIR = "/etc/octavo-etcd-credentials"
# The bookie syncs its logs and the recovery point on SIGTERM: give it time for a full write cache.
TERMINATION_GRACE_S = 120
MANAGED_BY = "octavo-operator"
# On the StatefulSet's own metadata (not its pod template: no roll): the cluster generation its spec was built
# from, so a reconcile that reads a StatefulSet not yet given the newest spec waits instead of taking its pods
# as up to date (observedGeneration moved before a roll had started).
APPLIED_GENERATION = "octavo.io/cluster-generation"


def labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "octavo", "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": "bookie", "app.kubernetes.io/managed-by": MANAGED_BY}


def selector(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "octavo", "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": "bookie"}


def selector_string(name: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector(name).items())


def headless_service_name(name: str) -> str:
    return f"{name}-bookies"


def config_map_name(name: str) -> str:
    return f"{name}-bookie-config"


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string is a JSON string


def bookie_toml(spec: ClusterSpec, compaction: CompactionSettings | None) -> str:
    """The settings file: the policy's compaction settings, then the cluster's own `bookie` settings (which win)."""
    settings: dict[str, Any] = dict(compaction.as_bookie_settings()) if compaction else {}
    settings.update(spec.bookie)
    settings["data_dir"] = DATA_DIR
    settings["port"] = BOOKIE_PORT
    settings["metrics_port"] = METRICS_PORT
    settings["host"] = "0.0.0.0"
    settings["cluster"] = spec.cluster_name
    settings.update(security_settings(spec))
    head = "# Written by the Octavo operator from the BookieCluster and its CompactionPolicy: edit those instead.\n"
    return head + "".join(f"{k} = {toml_value(v)}\n" for k, v in sorted(settings.items()))


def security_settings(spec: ClusterSpec) -> dict[str, Any]:
    """The TLS and etcd credential settings: paths of the mounted Secrets (docs/security.md)."""
    out: dict[str, Any] = {}
    if spec.tls is not None:
        out.update(tls_cert_file=f"{TLS_DIR}/tls.crt", tls_key_file=f"{TLS_DIR}/tls.key",
                   tls_ca_file=f"{TLS_DIR}/ca.crt", tls_client_auth=spec.tls.client_auth,
                   metrics_tls=spec.tls.metrics)
        if spec.tls.admin_identities:
            out["admin_identities"] = ",".join(spec.tls.admin_identities)
    if spec.etcd.tls_secret:
        out["etcd_tls_ca_file"] = f"{ETCD_TLS_DIR}/ca.crt"
        if spec.etcd.tls_client_certificate:
            out.update(etcd_tls_cert_file=f"{ETCD_TLS_DIR}/tls.crt", etcd_tls_key_file=f"{ETCD_TLS_DIR}/tls.key")
    if spec.etcd.credentials_secret:
        out["etcd_password_file"] = f"{ETCD_CREDENTIALS_DIR}/password"  # the user name comes in the environment
    return out


def bookie_server_name(name: str, pod: str, namespace: str) -> str:
    """The DNS name a bookie pod's certificate is checked against: its advertised address's host."""
    return f"{pod}.{headless_service_name(name)}.{namespace}.svc"


def _probes(spec: ClusterSpec) -> dict[str, Any]:
    """Readiness, liveness and start-up from the bookie's health. The kubelet's gRPC probe speaks plaintext
    only: with TLS the probes ask /healthz on the metrics port (HTTPS with tls.metrics; the kubelet does not
    check the certificate of an HTTPS probe), which answers what the gRPC health service does."""
    if spec.tls is None:
        check: dict[str, Any] = {"grpc": {"port": BOOKIE_PORT}}
    else:
        check = {"httpGet": {"path": "/healthz", "port": "metrics",
                             "scheme": "HTTPS" if spec.tls.metrics else "HTTP"}}
    return {
        "readinessProbe": {**check, "periodSeconds": 5, "failureThreshold": 2},
        "livenessProbe": {**check, "periodSeconds": 10, "failureThreshold": 6, "initialDelaySeconds": 30},
        # Recovery replays unflushed logs at start: a generous start-up window before liveness counts.
        "startupProbe": {**check, "periodSeconds": 5, "failureThreshold": 120},
    }


def config_map(name: str, namespace: str, spec: ClusterSpec, compaction: CompactionSettings | None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": config_map_name(name), "namespace": namespace, "labels": labels(name)},
            "data": {CONFIG_FILE: bookie_toml(spec, compaction)}}


def _etcd_env(spec: ClusterSpec) -> dict[str, Any]:
    if spec.etcd.endpoints:
        return {"name": "OCTAVO_NODE_ETCD", "value": spec.etcd.endpoints}
    if spec.etcd.config_map:
        ref_name, key = spec.etcd.config_map
        return {"name": "OCTAVO_NODE_ETCD", "valueFrom": {"configMapKeyRef": {"name": ref_name, "key": key}}}
    assert spec.etcd.secret is not None
    ref_name, key = spec.etcd.secret
    return {"name": "OCTAVO_NODE_ETCD", "valueFrom": {"secretKeyRef": {"name": ref_name, "key": key}}}


def _container(name: str, spec: ClusterSpec, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """The bookie container: `octavo node` reading the ConfigMap's settings, its identity from the pod."""
    container: dict[str, Any] = {
        "name": "bookie",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "args": ["node", "--config", f"{CONFIG_DIR}/{CONFIG_FILE}"],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "OCTAVO_NODE_BOOKIE_ID", "value": "$(POD_NAME)"},
            {"name": "OCTAVO_NODE_ADVERTISED_ADDRESS",
             "value": f"$(POD_NAME).{headless_service_name(name)}.$(POD_NAMESPACE).svc:{BOOKIE_PORT}"},
            _etcd_env(spec),
            *([{"name": "OCTAVO_NODE_ETCD_USERNAME",
                "valueFrom": {"secretKeyRef": {"name": spec.etcd.credentials_secret, "key": "username"}}}]
              if spec.etcd.credentials_secret else []),
        ],
        "ports": [{"name": "bookie", "containerPort": BOOKIE_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        **_probes(spec),
        "volumeMounts": mounts,
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
    }
    if spec.resources:
        container["resources"] = dict(spec.resources)
    return container


def stateful_set(name: str, namespace: str, spec: ClusterSpec, config_hash: str, *, replicas: int,
                 generation: int) -> dict[str, Any]:
    """`config_hash` goes into a pod annotation, so a settings change rolls the pods (one at a time, within the
    PodDisruptionBudget). `replicas` may exceed the spec's while a scale-down decommissions the highest ordinal;
    `generation` is the BookieCluster's generation this is built from (APPLIED_GENERATION)."""
    template = spec.pod_template
    pod_labels = {**labels(name), **dict(template.get("labels", {}))}
    annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT),
                   "prometheus.io/path": "/metrics", **dict(template.get("annotations", {})),
                   "octavo.io/config-hash": config_hash}
    mounts: list[dict[str, Any]] = [{"name": "data", "mountPath": DATA_DIR},
                                    {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                                    {"name": "tmp", "mountPath": "/tmp"}]  # the root filesystem is read-only
    secret_volumes = _secret_volumes(spec)
    mounts += [{"name": v["name"], "mountPath": path, "readOnly": True} for v, path in secret_volumes]
    claims = [_claim("data", spec.storage.size, spec.storage.storage_class, name)]
    if spec.storage.logs_size:
        mounts.append({"name": "logs", "mountPath": LOGS_DIR})
        claims.append(_claim("logs", spec.storage.logs_size, spec.storage.logs_storage_class, name))
    pod_spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "containers": [_container(name, spec, mounts)],
        "volumes": [{"name": "config", "configMap": {"name": config_map_name(name)}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}, *(v for v, _ in secret_volumes)],
        "securityContext": {"fsGroup": 1000, "runAsUser": 1000, "runAsGroup": 1000,
                            "fsGroupChangePolicy": "OnRootMismatch", "runAsNonRoot": True,
                            "seccompProfile": {"type": "RuntimeDefault"}},
    }
    for key in ("nodeSelector", "priorityClassName", "affinity", "tolerations", "topologySpreadConstraints"):
        if key in template:
            pod_spec[key] = template[key]
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(name),
                     "annotations": {APPLIED_GENERATION: str(generation)}},
        "spec": {
            "replicas": replicas,
            "serviceName": headless_service_name(name),
            # Bookies start in parallel (none waits for another). OnDelete: the operator rolls them, one at a time,
            # waiting between two for the restarted bookie to serve and for no ledger to be under-replicated
            # (rolling.py); Kubernetes only recreates each pod it deletes with the current template.
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": selector(name)},
            "template": {"metadata": {"labels": pod_labels, "annotations": annotations}, "spec": pod_spec},
            "volumeClaimTemplates": claims,
            # Volumes outlive a scale-down: a decommissioned bookie's volume is deleted by the operator after it
            # is retired, never by Kubernetes before.
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
        },
    }


def _secret_volumes(spec: ClusterSpec) -> list[tuple[dict[str, Any], str]]:
    """(volume, mount path) for each Secret the settings point into. Mounted as directories, never with
    subPath: the kubelet then updates renewed files in place and the bookie reads them at the next handshake."""
    out = []
    mode = 0o440  # readable by the bookie's group (fsGroup), by no one else
    if spec.tls is not None:
        out.append(({"name": "tls", "secret": {"secretName": spec.tls.secret_name, "defaultMode": mode}}, TLS_DIR))
    if spec.etcd.tls_secret:
        out.append(({"name": "etcd-tls", "secret": {"secretName": spec.etcd.tls_secret, "defaultMode": mode}},
                    ETCD_TLS_DIR))
    if spec.etcd.credentials_secret:
        out.append(({"name": "etcd-credentials",
                     "secret": {"secretName": spec.etcd.credentials_secret, "defaultMode": mode,
                                "items": [{"key": "password", "path": "password"}]}}, ETCD_CREDENTIALS_DIR))
    return out


def _claim(volume: str, size: str, storage_class: str, name: str) -> dict[str, Any]:
    claim: dict[str, Any] = {"metadata": {"name": volume, "labels": labels(name)},
                             "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}}
    if storage_class:
        claim["spec"]["storageClassName"] = storage_class
    return claim


def headless_service(name: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": headless_service_name(name), "namespace": namespace, "labels": labels(name)},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": selector(name),
                     "ports": [{"name": "bookie", "port": BOOKIE_PORT, "targetPort": "bookie"},
                               {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"}]}}


def client_service(name: str, namespace: str) -> dict[str, Any]:
    """For tools that need any one bookie (status, the admin CLI); writers find bookies through etcd."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": namespace, "labels": labels(name)},
            "spec": {"type": "ClusterIP", "selector": selector(name),
                     "ports": [{"name": "bookie", "port": BOOKIE_PORT, "targetPort": "bookie"}]}}


def pod_disruption_budget(name: str, namespace: str, spec: ClusterSpec) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace, "labels": labels(name)},
            "spec": {"maxUnavailable": spec.max_unavailable, "selector": {"matchLabels": selector(name)}}}


def owned_objects(name: str, namespace: str, spec: ClusterSpec, compaction: CompactionSettings | None, *,
                  replicas: int, generation: int) -> list[dict[str, Any]]:
    """Everything a BookieCluster owns, in the order to apply them (the config before the pods that read it).
    `replicas` and `generation`: the StatefulSet's (stateful_set)."""
    cm = config_map(name, namespace, spec, compaction)
    digest = hashlib.sha256(json.dumps(cm["data"], sort_keys=True).encode()).hexdigest()[:16]
    return [cm, headless_service(name, namespace), client_service(name, namespace),
            pod_disruption_budget(name, namespace, spec),
            stateful_set(name, namespace, spec, digest, replicas=replicas, generation=generation)]


def bookie_ids(name: str, replicas: int) -> list[str]:
    """The StatefulSet's pod names, which are the bookie ids."""
    return [f"{name}-{i}" for i in range(replicas)]


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch applied to a copy (RFC 7386): how the handlers compare what is with what should be."""
    out = dict(base)
    for k, v in override.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out
