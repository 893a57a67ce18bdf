"""The Helm chart, checked offline with a real helm: `helm lint --strict`; `helm template` over a matrix of value
files, every rendered manifest validated against the Kubernetes schemas (kubernetes-validate, strict) and every
custom resource against its CRD (schema, defaults and CEL rules, as the API server would); every bad value file
refused with its message; the rendered commands parsed by the real `octavo` parser; the CRDs matching what the
operator code expects; labels; the README generated from the values."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import crschema
import kubernetes_validate
import pytest
import readme
import yaml
from helmtool import CHART, VALUES, render, run_helm

from octavo.cli.main import build_parser
from octavo.operator import builders, handlers, resources

GOOD = sorted((VALUES / "good").glob("*.yaml"))
BAD = sorted((VALUES / "bad").glob("*.yaml"))
# The chart's kubeVersion is >=1.27: validate against the oldest and the newest schemas there are.
KUBE_VERSIONS = ["1.27", "1.37"]
STANDARD_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                   "app.kubernetes.io/managed-by", "app.kubernetes.io/component", "helm.sh/chart")


def expected_message(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name}: the first line must be '# expect: <message>'"
    return first.removeprefix("# expect: ")


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


@pytest.mark.parametrize("values", GOOD, ids=lambda p: p.stem)
def test_lint_strict(helm: str, values: Path) -> None:
    done = run_helm(helm, "lint", "--strict", str(CHART), "-f", str(values))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("values", GOOD, ids=lambda p: p.stem)
def test_every_rendered_manifest_is_valid(helm: str, values: Path) -> None:
    docs = render(helm, "-f", str(values))
    schemas = crschema.load_crds()
    custom = crschema.custom_resources(docs, schemas)
    for doc in docs:
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # the Prometheus Operator's kinds: checked by test_monitoring.py (promtool, selectors)
        if doc["apiVersion"].startswith("cert-manager.io/"):
            continue  # cert-manager's kinds: checked by test_tls_chart.py
        if doc in custom:
            assert crschema.validate(doc, schemas) == [], name
            continue
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)  # raises with the field on failure
        labels = doc["metadata"].get("labels") or {}
        missing = [label for label in STANDARD_LABELS if label not in labels]
        assert not missing, f"{name} lacks the labels {missing}"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        if doc["metadata"].get("namespace") is not None:
            assert doc["metadata"]["namespace"] in ("octavo", "pipelines")


def test_the_validators_can_fail(helm: str) -> None:
    """The two validators above refuse what a real API server refuses."""
    docs = render(helm)
    deployment = copy.deepcopy(by_kind(docs, "Deployment")[0])
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.37", strict=True)
    deployment = copy.deepcopy(by_kind(docs, "Deployment")[0])
    deployment["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.37", strict=True)
    schemas = crschema.load_crds()
    cluster = copy.deepcopy(by_kind(docs, "BookieCluster")[0])
    cluster["spec"]["replicas"] = 2
    assert crschema.validate(cluster, schemas) == [
        "<root>.spec: replicas must be at least minWritableBookies (the bookies a new ledger needs)"]
    cluster["spec"]["etcd"]["endpoints"] = "etcd:2379"
    assert any("exactly one of etcd.endpoints and etcd.endpointsFrom" in e
               for e in crschema.validate(cluster, schemas))
    policy = copy.deepcopy(by_kind(docs, "CompactionPolicy")[0])
    del policy["spec"]["writableRatio"]  # the default (0.8) applies, as on the API server
    policy["spec"]["readOnlyRatio"] = 0.7
    policy["spec"]["warnRatio"] = 0.6
    assert crschema.validate(policy, schemas) == [
        "<root>.spec: writableRatio must be below readOnlyRatio (the bookie is released only well below where it "
        "was forced read-only)"]


@pytest.mark.parametrize("values", BAD, ids=lambda p: p.stem)
def test_bad_values_are_refused_with_a_clear_message(helm: str, values: Path) -> None:
    """`helm install` (and template) refuse each with its message. `helm lint` reports them all too, but exits 0
    on the chart's own cross-value checks (Helm's lint does not count a template's `fail` as an error)."""
    message = expected_message(values)
    for command in (["install", "--dry-run=client", "octavo", str(CHART)], ["template", "octavo", str(CHART)]):
        done = run_helm(helm, *command, "-f", str(values))
        assert done.returncode != 0, f"helm {command[0]} accepted {values.name}"
        assert message in done.stdout + done.stderr, done.stdout + done.stderr
    linted = run_helm(helm, "lint", "--strict", str(CHART), "-f", str(values))
    assert message in linted.stdout + linted.stderr


def test_the_operator_deployment_runs_what_the_operator_code_expects(helm: str) -> None:
    docs = render(helm, "-f", str(VALUES / "good" / "production.yaml"))
    deployment = by_kind(docs, "Deployment")[0]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == ["octavo"]
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert 'octavo = "octavo.cli.main:main"' in pyproject  # the console script on the image's PATH
    args = build_parser().parse_args(container["args"])  # the real parser: unknown flags fail here
    assert (args.command, args.operator_cmd) == ("operator", "run")
    assert args.namespace == ["octavo", "pipelines"]
    assert args.poll_interval_s == 15.0 and args.peering == "octavo" and args.log_level == "WARNING"
    assert args.decommission_rate_bytes_per_s == 4194304
    liveness_port = int(args.liveness.rpartition(":")[2])
    assert container["ports"][0]["containerPort"] == liveness_port
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["serviceAccountName"] == "octavo"
    assert deployment["spec"]["replicas"] == 2 and deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    # Peering needs its object in each watched namespace (kopf does not create it).
    peerings = by_kind(docs, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["octavo", "pipelines"]
    assert {p["metadata"]["name"] for p in peerings} == {args.peering}
    # One replica: standalone, and never two at once.
    single = by_kind(render(helm), "Deployment")[0]
    single_args = build_parser().parse_args(single["spec"]["template"]["spec"]["containers"][0]["args"])
    assert single_args.peering is None and single["spec"]["strategy"]["type"] == "Recreate"
    assert not by_kind(render(helm), "ClusterKopfPeering")


def test_the_cluster_name_reaches_the_cluster_and_the_test_pod(helm: str) -> None:
    docs = render(helm, "-f", str(VALUES / "good" / "production.yaml"))
    cluster = by_kind(docs, "BookieCluster")[0]
    assert resources.parse_cluster("logs", cluster["spec"]).cluster_name == "prod-logs"
    test_args = build_parser().parse_args(by_kind(docs, "Pod")[0]["spec"]["containers"][0]["args"])
    assert test_args.cluster == "prod-logs"
    # No example cluster: no test pod (it would have nothing to test).
    assert by_kind(render(helm, "--set", "bookieCluster.create=false"), "Pod") == []


def test_hook_and_test_pods_run_real_commands(helm: str) -> None:
    docs = render(helm, "-f", str(VALUES / "good" / "single-node.yaml"))
    test_pod = by_kind(docs, "Pod")[0]
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    container = test_pod["spec"]["containers"][0]
    args = build_parser().parse_args(container["args"])
    assert (args.command, args.cluster_cmd) == ("cluster", "check")
    assert args.cluster == "octavo" and (args.ensemble, args.write_quorum, args.ack_quorum) == (3, 3, 2)
    assert container["env"][0]["name"] == "OCTAVO_ETCD"  # the variable the CLI reads
    config_maps = {c["metadata"]["name"]: c for c in by_kind(docs, "ConfigMap")}
    ref = container["env"][0]["valueFrom"]["configMapKeyRef"]
    assert config_maps[ref["name"]]["data"][ref["key"]] == "octavo-etcd-0.octavo-etcd-peers.octavo.svc:2379"
    job = by_kind(docs, "Job")[0]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    job_args = build_parser().parse_args(job["spec"]["template"]["spec"]["containers"][0]["args"])
    assert (job_args.command, job_args.operator_cmd) == ("operator", "uninstall")
    assert job_args.bookie_cluster == ["octavo"] and job_args.compaction_policy == ["octavo"]
    # The selectors name the volumes of this release's bookies and etcd, as the operator labels them.
    cluster_spec = resources.parse_cluster("octavo", by_kind(docs, "BookieCluster")[0]["spec"])
    cluster_claims = builders.stateful_set("octavo", "octavo", cluster_spec, "x", replicas=cluster_spec.replicas,
                                           generation=1)["spec"]["volumeClaimTemplates"]
    bookie_selector = dict(kv.split("=") for kv in job_args.delete_volumes[0].split(","))
    assert bookie_selector.items() <= cluster_claims[0]["metadata"]["labels"].items()
    etcd_claims = by_kind(docs, "StatefulSet")[0]["spec"]["volumeClaimTemplates"]
    etcd_selector = dict(kv.split("=") for kv in job_args.delete_volumes[1].split(","))
    assert etcd_selector.items() <= etcd_claims[0]["metadata"]["labels"].items()
    # The BookieCluster reads etcd from the same ConfigMap.
    etcd_ref = by_kind(docs, "BookieCluster")[0]["spec"]["etcd"]["endpointsFrom"]["configMapKeyRef"]
    assert etcd_ref == ref
    # The finished test pod goes too (Helm keeps hook pods for their logs).
    test_selector = dict(kv.split("=") for kv in job_args.delete_pods[0].split(","))
    assert test_selector.items() <= test_pod["metadata"]["labels"].items()
    # Without volume deletion, the hook keeps every volume.
    kept = build_parser().parse_args(by_kind(render(helm), "Job")[0]["spec"]["template"]["spec"]["containers"][0][
        "args"])
    assert kept.delete_volumes == []


def test_the_crds_are_what_the_operator_serves(helm: str) -> None:
    done = run_helm(helm, "template", "octavo", str(CHART), "--include-crds")
    crds = {d["metadata"]["name"]: d for d in yaml.safe_load_all(done.stdout)
            if d and d["kind"] == "CustomResourceDefinition"}
    assert set(crds) == {"bookieclusters.octavo.io", "compactionpolicies.octavo.io", "kopfpeerings.kopf.dev",
                         "clusterkopfpeerings.kopf.dev"}
    for plural in ("bookieclusters", "compactionpolicies"):
        spec = crds[f"{plural}.{resources.GROUP}"]["spec"]
        assert spec["group"] == resources.GROUP and spec["names"]["plural"] == plural
        served = [v["name"] for v in spec["versions"] if v["served"]]
        storage = [v["name"] for v in spec["versions"] if v["storage"]]
        assert served == storage == [resources.VERSION]
    assert f"{resources.GROUP}/{resources.VERSION}" == handlers.API_VERSION
    # The example resources use the served version.
    docs = render(helm)
    assert {d["apiVersion"] for d in docs if d["kind"] in ("BookieCluster", "CompactionPolicy")} == {
        handlers.API_VERSION}


# Every grant of the operator's role, and why. A change to rbac.yaml must change this table (and its reason).
OPERATOR_GRANTS = {
    ("octavo.io", "bookieclusters"): ({"get", "list", "watch", "patch"}, "kopf watches them, patches its finalizer "
                                      "and annotations"),
    ("octavo.io", "compactionpolicies"): ({"get", "list", "watch", "patch"}, "the same; a cluster reads its policy"),
    ("octavo.io", "bookieclusters/status"): ({"get", "patch"}, "what the operator observed and decided"),
    ("octavo.io", "compactionpolicies/status"): ({"get", "patch"}, "windows, validity, last runs"),
    ("apps", "statefulsets"): ({"get", "create", "patch"}, "the bookies; the garbage collector deletes them"),
    ("", "services"): ({"get", "create", "patch"}, "the headless and client Services"),
    ("", "configmaps"): ({"get", "create", "patch"}, "the bookie settings; etcd endpoints from a ConfigMap"),
    ("policy", "poddisruptionbudgets"): ({"get", "create", "patch"}, "the bookies' PDB"),
    ("", "pods"): ({"list", "delete"}, "the bookies' addresses, for their admin API; a roll deletes one at a time"),
    ("", "persistentvolumeclaims"): ({"delete"}, "a decommissioned bookie's volumes on scale-down"),
    ("", "secrets"): ({"get"}, "etcd endpoints kept in a Secret (spec.etcd.endpointsFrom.secretKeyRef)"),
    ("", "events"): ({"create"}, "ForceReadOnly, OpenCompactionWindow, ScaleDown, InvalidSpec, ..."),
    ("apiextensions.k8s.io", "customresourcedefinitions"): ({"list", "watch"}, "kopf notices CRDs come and go"),
    ("", "namespaces"): ({"list", "watch"}, "kopf follows the namespaces it serves"),
}
PEERING_GRANTS = {
    ("kopf.dev", "clusterkopfpeerings"): ({"get", "list", "watch", "patch"}, "electing the active operator"),
    ("kopf.dev", "kopfpeerings"): ({"get", "list", "watch", "patch"}, "the same, per namespace"),
}
HOOK_GRANTS = {
    ("octavo.io", "bookieclusters"): ({"get", "delete", "patch"}, "delete, wait, drop a stuck finalizer"),
    ("octavo.io", "compactionpolicies"): ({"get", "delete", "patch"}, "the same"),
    ("", "persistentvolumeclaims"): ({"list", "delete"}, "deleteVolumesOnUninstall"),
    ("", "pods"): ({"list", "delete"}, "the finished helm test pod, which Helm keeps"),
}


def grants(*roles: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for role in roles:
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_rbac_grants_exactly_what_the_table_lists(helm: str) -> None:
    docs = render(helm)
    cluster_roles = by_kind(docs, "ClusterRole")
    assert len(cluster_roles) == 1 and by_kind(docs, "Role")[0]["metadata"]["annotations"]["helm.sh/hook"]
    assert grants(*cluster_roles) == {k: v[0] for k, v in OPERATOR_GRANTS.items()}
    assert not any("*" in rule["verbs"] or "*" in rule["resources"] for rule in cluster_roles[0]["rules"])
    hook_roles = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-uninstall")]
    assert grants(*hook_roles) == {k: v[0] for k, v in HOOK_GRANTS.items()}
    # Listed namespaces: a Role in each with the namespaced grants; only kopf's cluster-wide reads stay in the
    # ClusterRole. With peering, the per-namespace peering grant.
    docs = render(helm, "-f", str(VALUES / "good" / "production.yaml"))
    cluster_wide = {("apiextensions.k8s.io", "customresourcedefinitions"), ("", "namespaces")}
    assert grants(*by_kind(docs, "ClusterRole")) == {k: v[0] for k, v in OPERATOR_GRANTS.items() if k in cluster_wide}
    roles = {r["metadata"]["namespace"]: r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith(
        "-operator")}
    assert sorted(roles) == ["octavo", "pipelines"]
    expected = {k: v[0] for k, v in OPERATOR_GRANTS.items() if k not in cluster_wide}
    expected[("kopf.dev", "kopfpeerings")] = PEERING_GRANTS[("kopf.dev", "kopfpeerings")][0]
    for role in roles.values():
        assert grants(role) == expected
    bindings = {b["metadata"]["namespace"]: b for b in by_kind(docs, "RoleBinding")
                if b["metadata"]["name"].endswith("-operator")}
    assert sorted(bindings) == ["octavo", "pipelines"]
    assert all(b["subjects"] == [{"kind": "ServiceAccount", "name": "octavo", "namespace": "octavo"}]
               for b in bindings.values())
    # Cluster-wide peering.
    docs = render(helm, "--set", "operator.replicas=2")
    assert grants(*by_kind(docs, "ClusterRole"))[("kopf.dev", "clusterkopfpeerings")] == {
        "get", "list", "watch", "patch"}
    assert [p["metadata"]["name"] for p in by_kind(docs, "ClusterKopfPeering")] == ["octavo"]


def test_the_operator_role_covers_every_call_the_operator_makes(helm: str) -> None:
    """The resources the operator code calls (handlers.py, kube.PLURALS) all have a grant."""
    from octavo.operator.kube import PLURALS

    granted = grants(*by_kind(render(helm), "ClusterRole"))
    for kind, plural in PLURALS.items():
        group = {"StatefulSet": "apps", "PodDisruptionBudget": "policy", "BookieCluster": "octavo.io",
                 "CompactionPolicy": "octavo.io"}.get(kind, "")
        assert (group, plural) in granted, f"{kind} ({plural}) is used by the operator but not granted"


def test_schema_bookie_settings_are_the_crds(helm: str) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    crd = yaml.safe_load((CHART / "crds" / "bookieclusters.octavo.io.yaml").read_text())
    crd_bookie = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["bookie"]
    assert schema["properties"]["bookieCluster"]["properties"]["bookie"]["properties"] == crd_bookie["properties"]


def test_every_value_has_a_schema_entry_and_the_readme_is_current() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(schema_part: dict[str, Any], value: Any, path: str) -> None:
        if not isinstance(value, dict) or schema_part.get("additionalProperties") is not False:
            return
        for key, sub in value.items():
            assert key in schema_part["properties"], f"values.yaml has {path}{key}, which the schema lacks"
            walk(schema_part["properties"][key], sub, f"{path}{key}.")

    walk(schema, values, "")
    committed = (CHART / "README.md").read_text()
    assert committed == readme.render(), "charts/octavo/README.md is stale: python charts/tests/readme.py --write"
    docs = readme.DOCS.read_text()
    assert docs == readme.render_docs(docs), "docs/kubernetes.md's values are stale: python charts/tests/readme.py " \
                                             "--write"
    for path, *_ in readme.rows(schema, values):
        assert f"`{path}`" in committed


def test_notes_say_what_was_installed_and_how_to_check(helm: str) -> None:
    done = run_helm(helm, "install", "--dry-run=client", "demo", str(CHART), "--namespace", "data")
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    for line in ("release demo in namespace data", "Deployment demo-octavo-operator (1 pod)",
                 "StatefulSet demo-octavo-etcd (3 members", "BookieCluster octavo: 3 bookies",
                 "kubectl -n data get bookiecluster octavo", "helm test demo -n data",
                 "OCTAVO_ETCD=demo-octavo-etcd-0.demo-octavo-etcd-peers.data.svc:2379"):
        assert line in notes, line


def test_the_chart_packages(helm: str, tmp_path: Path) -> None:
    done = run_helm(helm, "package", str(CHART), "--destination", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "octavo-0.1.0.tgz").stat().st_size > 1000
