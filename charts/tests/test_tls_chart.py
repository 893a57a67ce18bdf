"""The chart with tls.enabled: cert-manager's objects (or the user's Secrets) line up with what every pod mounts,
the certificates name what clients dial, the environment the operator and the test pod get is what the code reads,
the BookieCluster passes the operator's own parser, and the in-release etcd serves TLS with client certificates.
The bookies' side (mounts, settings, probes) is the operator's, tested in operator/tests/test_builders.py and on
real processes in e2e/local/scenarios/test_operator_tls.py and test_chart_local.py."""

from __future__ import annotations

import fnmatch
from typing import Any

from helmtool import VALUES, render

from octavo.cli.common import etcd_settings
from octavo.meta.tls import TlsFiles
from octavo.operator import builders
from octavo.operator.resources import parse_cluster

NS = "octavo"


def kinds(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


def mounted_files(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """mount path -> the Secret mounted there."""
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod.get("volumes") or [] if "secret" in v}
    return {m["mountPath"]: secrets[m["name"]] for m in container.get("volumeMounts") or [] if m["name"] in secrets}


def secret_behind(path: str, mounts: dict[str, str]) -> str:
    directory = path.rsplit("/", 1)[0]
    assert directory in mounts, f"{path} is not in a mounted Secret ({mounts})"
    return mounts[directory]


def test_cert_manager_certificates_are_what_every_pod_mounts(helm: str) -> None:
    docs = render(helm, "-f", str(VALUES / "good" / "tls-cert-manager.yaml"))
    certificates = kinds(docs, "Certificate")
    issuers = kinds(docs, "Issuer")
    assert issuers["octavo-selfsigned"]["spec"] == {"selfSigned": {}}
    assert issuers["octavo-ca"]["spec"]["ca"]["secretName"] == certificates["octavo-ca"]["spec"]["secretName"]
    assert certificates["octavo-ca"]["spec"]["isCA"] is True
    by_secret = {c["spec"]["secretName"]: c["spec"] for c in certificates.values()}
    for name, doc in certificates.items():
        spec = doc["spec"]
        if name != "octavo-ca":
            assert spec["issuerRef"] == {"kind": "Issuer", "name": "octavo-ca"}, name
            assert {"server auth", "client auth"} <= set(spec["usages"]), name
            assert spec["privateKey"]["rotationPolicy"] == "Always"

    # The BookieCluster: its Secret is the bookie certificate, which names what the operator checks and what
    # clients dial (each pod's advertised DNS name, the client Service); the operator's name is an admin.
    (cluster,) = kinds(docs, "BookieCluster").values()
    parsed = parse_cluster(cluster["metadata"]["name"], cluster["spec"])
    assert parsed.tls is not None and parsed.tls.metrics
    bookie_cert = by_secret[parsed.tls.secret_name]
    for pod in builders.bookie_ids("octavo", 3):
        name = builders.bookie_server_name("octavo", pod, NS)
        assert any(fnmatch.fnmatch(name, pattern) for pattern in bookie_cert["dnsNames"]), name
    assert f"octavo.{NS}.svc" in bookie_cert["dnsNames"]
    assert set(parsed.tls.admin_identities) == {by_secret["octavo-operator-tls"]["commonName"], "ops-admin"}
    assert by_secret["octavo-client-tls"]["commonName"] not in parsed.tls.admin_identities
    # The bookies reach the release's etcd with their own certificate (one CA).
    assert parsed.etcd.tls_secret == parsed.tls.secret_name and parsed.etcd.tls_client_certificate

    # The operator: OCTAVO_TLS_* and OCTAVO_ETCD_TLS_* name files of its mounted certificate, as the code reads
    # them; its pods may read the files (fsGroup, 0440).
    deployment = kinds(docs, "Deployment")["octavo-operator"]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env, mounts = env_of(container), mounted_files(pod, container)
    tls = TlsFiles.from_env(env)
    for path in (tls.cert_file, tls.key_file, tls.ca_file):
        assert secret_behind(path, mounts) == "octavo-operator-tls"
    etcd = etcd_settings(environ=env)
    for key in ("etcd_tls_ca_file", "etcd_tls_cert_file", "etcd_tls_key_file"):
        assert secret_behind(etcd[key], mounts) == "octavo-operator-tls"
    assert pod["securityContext"]["fsGroup"] == 1000
    assert all(v["secret"]["defaultMode"] == 0o440 for v in pod["volumes"] if "secret" in v)
    assert all("subPath" not in m for m in container["volumeMounts"])  # renewals reach the files

    # The test pod: the client certificate, for bookies and etcd.
    (test_pod,) = (d for d in docs if d["kind"] == "Pod")
    container = test_pod["spec"]["containers"][0]
    env, mounts = env_of(container), mounted_files(test_pod["spec"], container)
    assert secret_behind(TlsFiles.from_env(env).cert_file, mounts) == "octavo-client-tls"
    assert secret_behind(etcd_settings(environ=env)["etcd_tls_cert_file"], mounts) == "octavo-client-tls"

    # etcd: HTTPS for clients and peers, client certificates required on both, its certificate names the
    # endpoints the ConfigMap gives everyone.
    sts = kinds(docs, "StatefulSet")["octavo-etcd"]
    etcd_pod = sts["spec"]["template"]["spec"]
    args = etcd_pod["containers"][0]["command"]
    assert "--client-cert-auth" in args and "--peer-client-cert-auth" in args
    assert all("https://" in a for a in args if a.startswith(("--listen-client", "--advertise-client",
                                                                "--listen-peer", "--initial-advertise-peer")))
    assert "--listen-metrics-urls=http://0.0.0.0:2381" in args  # the probes stay plain HTTP
    etcd_mounts = mounted_files(etcd_pod, etcd_pod["containers"][0])
    flags = dict(a.split("=", 1) for a in args if a.startswith("--") and "=" in a)
    for flag in ("--cert-file", "--key-file", "--trusted-ca-file", "--peer-cert-file", "--peer-trusted-ca-file"):
        assert secret_behind(flags[flag], etcd_mounts) == "octavo-etcd-tls"
    endpoints = kinds(docs, "ConfigMap")["octavo-etcd-endpoints"]["data"]["endpoints"].split(",")
    for endpoint in endpoints:
        host = endpoint.rsplit(":", 1)[0]
        assert any(fnmatch.fnmatch(host, p) for p in by_secret["octavo-etcd-tls"]["dnsNames"]), host
    assert all(e.startswith("https://") for e in flags["--initial-cluster"].split(",") for e in [e.split("=")[1]])

    # /metrics over TLS: the ServiceMonitor scrapes HTTPS against the CA and a name the certificate carries.
    monitor = kinds(docs, "ServiceMonitor")["octavo-bookies"]["spec"]["endpoints"][0]
    assert monitor["scheme"] == "https" and monitor["tlsConfig"]["serverName"] in bookie_cert["dnsNames"]
    operator_monitor = kinds(docs, "ServiceMonitor")["octavo-operator"]["spec"]["endpoints"][0]
    assert operator_monitor["scheme"] == "https"
    assert operator_monitor["tlsConfig"]["serverName"] in by_secret["octavo-operator-tls"]["dnsNames"]
    assert "--metrics-tls" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_own_secrets_and_an_external_etcd_with_tls_and_a_password(helm: str) -> None:
    docs = render(helm, "-f", str(VALUES / "good" / "tls-own-secrets.yaml"))
    assert not kinds(docs, "Certificate") and not kinds(docs, "Issuer")
    (cluster,) = kinds(docs, "BookieCluster").values()
    spec = parse_cluster(cluster["metadata"]["name"], cluster["spec"])
    assert spec.tls is not None and spec.tls.secret_name == "octavo-bookie-tls"
    assert (spec.etcd.tls_secret, spec.etcd.credentials_secret) == ("etcd-client-tls", "etcd-octavo-user")
    deployment = kinds(docs, "Deployment")["octavo-operator"]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env, mounts = env_of(container), mounted_files(pod, container)
    assert secret_behind(TlsFiles.from_env(env).cert_file, mounts) == "octavo-operator-tls"
    etcd = etcd_settings(environ=env)
    assert secret_behind(etcd["etcd_tls_cert_file"], mounts) == "etcd-client-tls"
    assert secret_behind(etcd["etcd_password_file"], mounts) == "etcd-octavo-user"
    user = next(e for e in container["env"] if e["name"] == "OCTAVO_ETCD_USERNAME")
    assert user["valueFrom"] == {"secretKeyRef": {"name": "etcd-octavo-user", "key": "username"}}
    assert not kinds(docs, "StatefulSet")  # no etcd of the release


def test_without_tls_nothing_of_it_is_rendered(helm: str) -> None:
    docs = render(helm)
    assert not kinds(docs, "Certificate") and not kinds(docs, "Issuer")
    (cluster,) = kinds(docs, "BookieCluster").values()
    assert "tls" not in cluster["spec"] and "tls" not in cluster["spec"]["etcd"]
    container = kinds(docs, "Deployment")["octavo-operator"]["spec"]["template"]["spec"]["containers"][0]
    assert not [e for e in container["env"] if e["name"].startswith(("OCTAVO_TLS", "OCTAVO_ETCD"))]
    args = kinds(docs, "StatefulSet")["octavo-etcd"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--client-cert-auth" not in args and not any("https://" in a for a in args)
