"""The CRDs (charts/octavo/crds/) and the operator's reading of them agree: the same fields, the same defaults,
the same bookie settings as `octavo node`; and specs the operator cannot apply are refused with a message
naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from octavo.operator.policy import Policy, Watermarks
from octavo.operator.resources import (
    CLUSTER_FIELDS,
    POD_TEMPLATE_FIELDS,
    POLICY_FIELDS,
    CompactionSettings,
    SpecError,
    bookie_settings,
    parse_cluster,
    parse_policy,
)

CRDS = Path(__file__).resolve().parents[2] / "charts" / "octavo" / "crds"


def crd(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((CRDS / f"{name}.octavo.io.yaml").read_text())
    return doc


def spec_schema(name: str) -> dict[str, Any]:
    version = crd(name)["spec"]["versions"][0]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def test_the_crds_name_the_group_kinds_and_short_names_users_type() -> None:
    for name, kind, short in (("bookieclusters", "BookieCluster", "bkc"),
                              ("compactionpolicies", "CompactionPolicy", "cpol")):
        doc = crd(name)
        assert doc["metadata"]["name"] == f"{name}.octavo.io" and doc["spec"]["group"] == "octavo.io"
        assert doc["spec"]["names"]["kind"] == kind and doc["spec"]["names"]["shortNames"] == [short]
        assert doc["spec"]["scope"] == "Namespaced"
        assert [v["name"] for v in doc["spec"]["versions"]] == ["v1alpha1"]
    scale = crd("bookieclusters")["spec"]["versions"][0]["subresources"]["scale"]
    assert scale["specReplicasPath"] == ".spec.replicas"
    columns = [c["name"] for c in crd("bookieclusters")["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns == ["Ready", "Writable", "Read-Only", "Disk-Max", "Etcd-DB", "Age"]


def test_the_policy_fields_and_defaults_agree() -> None:
    props = spec_schema("compactionpolicies")["properties"]
    assert set(props) == POLICY_FIELDS
    parsed = parse_policy({})
    wm = Watermarks()
    assert (props["warnRatio"]["default"], props["readOnlyRatio"]["default"], props["writableRatio"]["default"]) == (
        wm.warn_ratio, wm.read_only_ratio, wm.writable_ratio)
    assert parsed.policy == Policy()
    assert props["maxConcurrentBookies"]["default"] == Policy().max_concurrent_bookies
    assert props["outsideWindow"]["default"] == Policy().outside_window
    defaults = CompactionSettings()
    assert props["minor"]["properties"]["threshold"]["default"] == defaults.minor_threshold
    assert props["major"]["properties"]["threshold"]["default"] == defaults.major_threshold
    assert props["rateBytesPerSecond"]["default"] == defaults.rate_bytes_per_s
    window = props["windows"]["items"]["properties"]
    assert set(window) == {"schedule", "duration", "timeZone"} and window["timeZone"]["default"] == "UTC"


def test_the_cluster_fields_and_the_bookie_settings_agree() -> None:
    props = spec_schema("bookieclusters")["properties"]
    assert set(props) == CLUSTER_FIELDS
    assert set(props["podTemplate"]["properties"]) == POD_TEMPLATE_FIELDS
    bookie = props["bookie"]
    # A structural schema may not set additionalProperties beside properties (the API server refuses the CRD);
    # unknown settings are refused by the server's strict field validation and by the operator.
    assert "additionalProperties" not in bookie
    settings = bookie_settings()
    assert set(bookie["properties"]) == set(settings), "the CRD's bookie settings differ from octavo node's"
    json_type = {bool: "boolean", int: "integer", float: "number", str: "string"}
    for name, default in settings.items():
        assert bookie["properties"][name]["type"] == json_type[type(default)], name
    assert props["replicas"]["default"] == 3 and props["minWritableBookies"]["default"] == 3
    assert props["podDisruptionBudget"]["properties"]["maxUnavailable"]["default"] == 1


CLUSTER = {"image": "octavo:0.1", "storage": {"size": "10Gi"}, "etcd": {"endpoints": "etcd:2379"}}


def test_a_cluster_spec_parses_with_its_defaults() -> None:
    c = parse_cluster("logs", CLUSTER)
    assert (c.replicas, c.min_writable, c.cluster_name, c.max_unavailable, c.policy_name) == (3, 3, "logs", 1, "")
    c = parse_cluster("logs", {**CLUSTER, "replicas": 5, "bookie": {"lost_bookie_delay_s": 30, "fsync_policy": "none"},
                               "compactionPolicyRef": {"name": "nightly"},
                               "etcd": {"endpointsFrom": {"secretKeyRef": {"name": "etcd", "key": "endpoints"}}}})
    assert c.replicas == 5 and c.bookie == {"lost_bookie_delay_s": 30, "fsync_policy": "none"}
    assert c.policy_name == "nightly" and c.etcd.secret == ("etcd", "endpoints")


def test_the_etcd_quota_defaults_to_etcds_own_in_the_crd_and_the_operator() -> None:
    quota = spec_schema("bookieclusters")["properties"]["etcd"]["properties"]["quotaBytes"]
    assert quota["default"] == parse_cluster("logs", CLUSTER).etcd.quota_bytes == 2 << 30 and quota["minimum"] == 1
    c = parse_cluster("logs", {**CLUSTER, "etcd": {"endpoints": "etcd:2379", "quotaBytes": 8 << 30}})
    assert c.etcd.quota_bytes == 8 << 30 and c.etcd.endpoints == "etcd:2379"


@pytest.mark.parametrize(("change", "message"), [
    ({"replicas": 2}, r"spec.replicas \(2\) must be at least spec.minWritableBookies \(3\)"),
    ({"replicas": "3"}, "spec.replicas must be an integer"),
    ({"image": ""}, "spec.image is required"),
    ({"storage": {"size": "lots"}}, "spec.storage.size must be a size like 100Gi"),
    ({"etcd": {}}, "set exactly one of endpoints and endpointsFrom"),
    ({"etcd": {"endpoints": "etcd"}}, "must be host:port"),
    ({"etcd": {"endpoints": "etcd:2379", "quotaBytes": 0}}, "spec.etcd.quotaBytes must be >= 1"),
    ({"etcd": {"endpoints": "etcd:2379", "quotaBytes": "2Gi"}}, "spec.etcd.quotaBytes must be an integer"),
    ({"bookie": {"no_such_setting": 1}}, "unknown setting no_such_setting"),
    ({"bookie": {"port": 1}}, "spec.bookie.port is set by the operator"),
    ({"bookie": {"lost_bookie_delay_s": "soon"}}, "spec.bookie.lost_bookie_delay_s must be a float"),
    ({"bookie": {"disk_writable_ratio": 0.99}}, "spec.bookie: disk watermarks must satisfy"),
    ({"bookie": {"etcd_compaction_interval_s": -1}}, r"etcd_compaction_interval_s must be in \[0, 604800\]"),
    ({"bookie": {"etcd_compaction_interval_s": 1.5}}, "spec.bookie.etcd_compaction_interval_s must be a int"),
    ({"replicaz": 3}, "unknown field replicaz"),
    ({"podTemplate": {"hostNetwork": True}}, "spec.podTemplate.unknown field hostNetwork"),
    ({"clusterName": "Logs_1"}, "must be a DNS label"),
    ({"bookie": {"tls_cert_file": "/x"}}, "spec.bookie.tls_cert_file is set by the operator"),
    ({"bookie": {"etcd_password_file": "/x"}}, "spec.bookie.etcd_password_file is set by the operator"),
    ({"tls": {}}, "spec.tls.secretName must name a Secret"),
    ({"bookie": {"tenant_prefixes": "spark=sales."}}, "tenant_prefixes needs client certificates"),
    ({"tls": {"secretName": "t"}, "bookie": {"tenant_prefixes": "spark"}}, "is not IDENTITY=PREFIX"),
    ({"tls": {"secretName": "Bad_Name"}}, "spec.tls.secretName must name a Secret"),
    ({"tls": {"secretName": "t", "clientAuth": "optional"}}, "spec.tls.clientAuth must be require or none"),
    ({"tls": {"secretName": "t", "adminIdentities": ["a,b"]}}, "spec.tls.adminIdentities must be a list"),
    ({"tls": {"secretName": "t", "clientAuth": "none", "adminIdentities": ["ops"]}},
     "adminIdentities needs clientAuth require"),
    ({"tls": {"secretName": "t", "metrics": "yes"}}, "spec.tls.metrics must be true or false"),
    ({"tls": {"secretName": "t", "ciphers": "all"}}, "spec.tls.unknown field ciphers"),
    ({"etcd": {"endpoints": "e:2379", "tls": {"secretName": ""}}}, "spec.etcd.tls.secretName must name a Secret"),
    ({"etcd": {"endpoints": "e:2379", "tls": {"secretName": "e", "clientCertificate": 1}}},
     "clientCertificate must be true or false"),
    ({"etcd": {"endpoints": "e:2379", "credentials": {"name": "e"}}}, "spec.etcd.credentials.unknown field name"),
])
def test_bad_cluster_specs_are_refused_naming_the_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_cluster("logs", {**CLUSTER, **change})


@pytest.mark.parametrize(("spec", "message"), [
    ({"windows": [{"schedule": "0 2 * *", "duration": "1h"}]}, r"spec.windows\[0\]: schedule"),
    ({"windows": [{"schedule": "0 2 * * *", "duration": "1d"}]}, r"spec.windows\[0\]: duration '1d'"),
    ({"windows": [{"schedule": "0 2 * * *", "duration": "1h", "timeZone": "Moon/Base"}]}, "not an IANA zone"),
    ({"windows": [{"duration": "1h"}]}, r"spec.windows\[0\].schedule is required"),
    ({"writableRatio": 0.95}, "writableRatio < readOnlyRatio"),
    ({"maxConcurrentBookies": 0}, "maxConcurrentBookies must be >= 1"),
    ({"outsideWindow": "later"}, "outsideWindow must be one of wait, compact"),
    ({"minor": {"threshold": 0.9}}, "spec.minor.threshold .* must be below spec.major.threshold"),
    ({"window": []}, "unknown field window"),
])
def test_bad_policies_are_refused_naming_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_policy(spec)


def test_every_fault_of_a_cluster_spec_is_reported_at_once() -> None:
    """Issue 29: seven mistakes took six rounds of editing; one message now lists them all."""
    bad = {"replicaz": 3, "image": "", "storage": {"size": "lots"}, "etcd": {"endpoints": "etcd"},
           "clusterName": "Logs_1", "imagePullPolicy": "Sometimes",
           "bookie": {"gc_intervl_ms": 5, "index_map_size_bytes": 1 << 50, "port": 1}}
    with pytest.raises(SpecError) as caught:
        parse_cluster("logs", bad)
    message = str(caught.value)
    assert message.startswith(f"{len(caught.value.problems)} problems: ")
    for part in ("unknown field replicaz", "spec.image is required", "spec.storage.size must be a size",
                 "must be host:port", "must be a DNS label", "spec.imagePullPolicy must be",
                 "unknown setting gc_intervl_ms (did you mean gc_interval_ms?)",
                 "spec.bookie: index_map_size_bytes must be in [64 MiB, 16 TiB]",
                 "spec.bookie.port is set by the operator"):
        assert part in message, (part, message)
    assert len(caught.value.problems) == 9


def test_an_unknown_bookie_setting_far_from_any_name_gets_no_suggestion() -> None:
    with pytest.raises(SpecError) as caught:
        parse_cluster("logs", {**CLUSTER, "bookie": {"zzzz": 1}})
    assert "unknown setting zzzz;" in str(caught.value) and "did you mean" not in str(caught.value)


def test_the_image_defaults_to_the_operators_own() -> None:
    spec = {k: v for k, v in CLUSTER.items() if k != "image"}
    assert parse_cluster("logs", spec, default_image="registry/octavo:1.2").image == "registry/octavo:1.2"
    assert parse_cluster("logs", CLUSTER, default_image="registry/octavo:1.2").image == CLUSTER["image"]
    with pytest.raises(SpecError, match=r"spec.image is required.*OCTAVO_OPERATOR_IMAGE"):
        parse_cluster("logs", spec)


def test_the_crds_bookie_settings_carry_the_bookies_bounds_and_a_description() -> None:
    """The API server refuses a setting out of range at apply time (kubectl names the field), with the same
    bounds the operator and the bookie check (octavo.node.config.BOUNDS); `kubectl explain` says what each is."""
    from octavo.node.config import BOUNDS

    bookie = spec_schema("bookieclusters")["properties"]["bookie"]["properties"]
    for name, schema in bookie.items():
        assert schema.get("description"), f"spec.bookie.{name} has no description for kubectl explain"
        if name in BOUNDS:
            assert (schema.get("minimum"), schema.get("maximum")) == BOUNDS[name], name
