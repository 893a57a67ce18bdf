"""The custom resources as the operator reads them: BookieCluster and CompactionPolicy specs parsed and checked
into typed values. The API server checks the CRD schemas (charts/octavo/crds/); this checks them again, and
what a schema cannot say (a cron expression, a time zone, the bookie settings' own rules), so an invalid spec
becomes a condition with a message, never a half-applied cluster. A test keeps these and the CRDs in step.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, TypeVar

from octavo.meta.etcdhealth import ETCD_QUOTA_BYTES_DEFAULT
from octavo.node.config import NodeConfig
from octavo.operator.names import GROUP as GROUP
from octavo.operator.names import VERSION as VERSION
from octavo.operator.policy import OUTSIDE_WAIT, Policy, PolicyError, Watermarks
from octavo.operator.windows import Window, WindowError, parse_duration

T = TypeVar("T")
BOOKIE_CLUSTER = ("bookieclusters", "BookieCluster")
COMPACTION_POLICY = ("compactionpolicies", "CompactionPolicy")

# Bookie settings the operator owns: a BookieCluster may not set them. The TLS and etcd credential files are paths
# inside the pod, mounted from the Secrets that spec.tls and spec.etcd.tls / spec.etcd.credentials name.
OPERATOR_OWNED_SETTINGS = frozenset({"data_dir", "host", "port", "advertised_address", "etcd", "cluster",
                                     "bookie_id", "metrics_port", "tls_cert_file", "tls_key_file", "tls_ca_file",
                                     "tls_client_auth", "etcd_tls_ca_file", "etcd_tls_cert_file", "etcd_tls_key_file",
                                     "etcd_username", "etcd_password_file", "admin_identities", "admin_token_file",
                                     "metrics_tls"})
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")
CLUSTER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
REPLICAS_MAX = 1000


class SpecError(ValueError):
    """A spec the operator cannot apply: one or more problems, each naming the field and what to change. The
    message is the problems, "; "-separated, counted when there are several."""

    def __init__(self, *problems: str) -> None:
        self.problems = list(problems)
        count = f"{len(problems)} problems: " if len(problems) > 1 else ""
        super().__init__(count + "; ".join(problems))


def bookie_settings() -> dict[str, Any]:
    """Every setting a BookieCluster's `bookie` may carry, with its default."""
    return {f.name: f.default for f in fields(NodeConfig)
            if f.name not in OPERATOR_OWNED_SETTINGS and f.default is not MISSING}


# -- CompactionPolicy ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CompactionSettings:
    """What a CompactionPolicy sets on each bookie (passed as `octavo node` settings)."""

    minor_threshold: float = 0.2
    major_threshold: float = 0.8
    rate_bytes_per_s: int = 32 << 20

    def as_bookie_settings(self) -> dict[str, Any]:
        return {"compaction_minor_threshold": self.minor_threshold,
                "compaction_major_threshold": self.major_threshold,
                "compaction_rate_bytes_per_s": self.rate_bytes_per_s}


@dataclass(frozen=True)
class PolicySpec:
    policy: Policy
    compaction: CompactionSettings


def _number(spec: Mapping[str, Any], name: str, default: float, where: str) -> float:
    value = spec.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{where}{name} must be a number, got {value!r}")
    return float(value)


def _integer(spec: Mapping[str, Any], name: str, default: int, where: str, minimum: int = 0) -> int:
    value = spec.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{where}{name} must be an integer, got {value!r}")
    if value < minimum:
        raise SpecError(f"{where}{name} must be >= {minimum}, got {value}")
    return value


def _refuse_unknown(spec: Mapping[str, Any], known: AbstractSet[str], where: str) -> None:
    unknown = sorted(set(spec) - known)
    if unknown:
        raise SpecError(f"{where}unknown field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                        f"(known: {', '.join(sorted(known))})")


POLICY_FIELDS = frozenset({"windows", "maxConcurrentBookies", "minor", "major", "rateBytesPerSecond",
                           "warnRatio", "readOnlyRatio", "writableRatio", "outsideWindow"})


def parse_policy(spec: Mapping[str, Any]) -> PolicySpec:
    where = "spec."
    _refuse_unknown(spec, POLICY_FIELDS, where)
    windows = []
    raw_windows = spec.get("windows", [])
    if not isinstance(raw_windows, list):
        raise SpecError("spec.windows must be a list")
    for i, w in enumerate(raw_windows):
        at = f"spec.windows[{i}]."
        if not isinstance(w, Mapping):
            raise SpecError(f"spec.windows[{i}] must be an object with schedule, duration and timeZone")
        _refuse_unknown(w, {"schedule", "duration", "timeZone"}, at)
        for required in ("schedule", "duration"):
            if not isinstance(w.get(required), str):
                raise SpecError(f"{at}{required} is required (a string)")
        try:
            windows.append(Window(w["schedule"], parse_duration(w["duration"]), w.get("timeZone", "UTC")))
        except WindowError as e:
            raise SpecError(f"{at[:-1]}: {e}") from e
    minor = spec.get("minor", {}) or {}
    major = spec.get("major", {}) or {}
    for name, part in (("minor", minor), ("major", major)):
        if not isinstance(part, Mapping):
            raise SpecError(f"spec.{name} must be an object with a threshold")
        _refuse_unknown(part, {"threshold"}, f"spec.{name}.")
    compaction = CompactionSettings(_number(minor, "threshold", 0.2, "spec.minor."),
                                    _number(major, "threshold", 0.8, "spec.major."),
                                    _integer(spec, "rateBytesPerSecond", 32 << 20, where))
    if not 0 < compaction.minor_threshold < compaction.major_threshold <= 1:
        raise SpecError(f"spec.minor.threshold ({compaction.minor_threshold}) must be below spec.major.threshold "
                        f"({compaction.major_threshold}), both in (0, 1]")
    try:
        watermarks = Watermarks(_number(spec, "warnRatio", 0.75, where), _number(spec, "readOnlyRatio", 0.9, where),
                                _number(spec, "writableRatio", 0.8, where))
        policy = Policy(tuple(windows), _integer(spec, "maxConcurrentBookies", 1, where, minimum=1), watermarks,
                        str(spec.get("outsideWindow", OUTSIDE_WAIT)))
    except PolicyError as e:
        raise SpecError(f"spec: {e}") from e
    return PolicySpec(policy, compaction)


# -- BookieCluster ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StorageSpec:
    size: str
    storage_class: str = ""
    logs_size: str = ""
    logs_storage_class: str = ""


@dataclass(frozen=True)
class EtcdSpec:
    endpoints: str = ""
    config_map: tuple[str, str] | None = None   # (name, key)
    secret: tuple[str, str] | None = None
    # etcd over TLS: a Secret with ca.crt, and tls.crt + tls.key when etcd checks client certificates.
    tls_secret: str = ""
    tls_client_certificate: bool = True
    # etcd authentication: a Secret with the keys `username` and `password`.
    credentials_secret: str = ""
    # The --quota-backend-bytes this etcd runs with: what the status measures its database against when etcd
    # does not report its quota (3.5 does not).
    quota_bytes: int = ETCD_QUOTA_BYTES_DEFAULT


@dataclass(frozen=True)
class TlsSpec:
    """Mutual TLS on the bookies' port: a Secret of type kubernetes.io/tls with ca.crt (cert-manager's layout)
    whose certificate names the pods' DNS names (`*.<name>-bookies.<namespace>.svc`) and the client Service."""

    secret_name: str
    client_auth: str = "require"
    admin_identities: tuple[str, ...] = ()
    metrics: bool = False  # /metrics over TLS (the same certificate) too


@dataclass(frozen=True)
class ClusterSpec:
    replicas: int
    min_writable: int
    image: str
    storage: StorageSpec
    etcd: EtcdSpec
    cluster_name: str
    image_pull_policy: str = "IfNotPresent"
    resources: Mapping[str, Any] = field(default_factory=dict)
    bookie: Mapping[str, Any] = field(default_factory=dict)
    pod_template: Mapping[str, Any] = field(default_factory=dict)
    max_unavailable: int = 1
    policy_name: str = ""
    tls: TlsSpec | None = None


CLUSTER_FIELDS = frozenset({"replicas", "minWritableBookies", "image", "imagePullPolicy", "resources", "storage",
                            "etcd", "clusterName", "bookie", "podTemplate", "podDisruptionBudget",
                            "compactionPolicyRef", "tls"})
SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
IDENTITY = re.compile(r"^[^,\s]+$")
POD_TEMPLATE_FIELDS = frozenset({"annotations", "labels", "nodeSelector", "priorityClassName", "affinity",
                                 "tolerations", "topologySpreadConstraints"})


def _quantity(value: Any, where: str) -> str:
    text = str(value)
    if not QUANTITY.match(text):
        raise SpecError(f"{where} must be a size like 100Gi, got {value!r}")
    return text


class Problems:
    """Every fault of a spec, collected so that one message lists them all (seven mistakes, one round)."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def add(self, message: str) -> None:
        self.messages.append(message)

    def take(self, part: Callable[[], T], fallback: T) -> T:
        """`part()`, or `fallback` with its SpecError noted."""
        try:
            return part()
        except SpecError as e:
            self.messages.extend(e.problems)
            return fallback

    def check(self) -> None:
        if self.messages:
            raise SpecError(*self.messages)


def closest(name: str, known: Iterable[str]) -> str:
    """' (did you mean X?)' for the known name nearest to a mistyped one; '' when none is near."""
    near = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {near[0]}?)" if near else ""


def check_bookie_settings(settings: Mapping[str, Any], tls: TlsSpec | None = None) -> dict[str, Any]:
    """The `bookie` settings, checked by the bookie's own rules and bounds (NodeConfig) together with what the
    operator sets (etcd, and TLS from spec.tls), unknown and owned names refused; every fault at once."""
    known = bookie_settings()
    problems = Problems()
    for name in sorted(set(settings) & OPERATOR_OWNED_SETTINGS):
        problems.add(f"spec.bookie.{name} is set by the operator and cannot be given")
    for name in sorted(set(settings) - set(known) - OPERATOR_OWNED_SETTINGS):
        problems.add(f"spec.bookie: unknown setting {name}{closest(name, known)}; the settings are those of "
                     "octavo node (docs/operations.md)")
    typed: dict[str, Any] = {}
    for name, value in settings.items():
        if name not in known:
            continue
        default = known[name]
        ok = (isinstance(value, bool) if isinstance(default, bool) else
              isinstance(value, int) and not isinstance(value, bool) if isinstance(default, int) else
              isinstance(value, int | float) and not isinstance(value, bool) if isinstance(default, float) else
              isinstance(value, str))
        if not ok:
            problems.add(f"spec.bookie.{name} must be a {type(default).__name__}, got {value!r}")
        else:
            typed[name] = float(value) if isinstance(default, float) else value
    operator_set: dict[str, Any] = {"etcd": "etcd:2379"}
    if tls is not None:  # the files are the operator's mounts; only their presence matters here
        operator_set.update(tls_cert_file="/tls/tls.crt", tls_key_file="/tls/tls.key", tls_ca_file="/tls/ca.crt",
                            tls_client_auth=tls.client_auth)
    for message in NodeConfig(data_dir="/data", **operator_set, **typed).problems():
        problems.add(f"spec.bookie: {message}")
    problems.check()
    return dict(settings)


def _image(spec: Mapping[str, Any], default_image: str) -> str:
    image = spec.get("image", default_image) or default_image
    if not isinstance(image, str) or not image:
        raise SpecError("spec.image is required: the Octavo image to run (it defaults to the operator's own image "
                        "when the operator knows it: $OCTAVO_OPERATOR_IMAGE, which the chart sets)")
    return image


def _replicas(spec: Mapping[str, Any]) -> int:
    replicas = _integer(spec, "replicas", 3, "spec.", minimum=1)
    if replicas > REPLICAS_MAX:
        raise SpecError(f"spec.replicas must be <= {REPLICAS_MAX}, got {replicas}")
    return replicas


def _storage(spec: Mapping[str, Any]) -> StorageSpec:
    storage = spec.get("storage")
    if not isinstance(storage, Mapping) or "size" not in storage:
        raise SpecError("spec.storage.size is required, like 100Gi")
    problems = Problems()
    problems.take(lambda: _refuse_unknown(storage, {"size", "storageClassName", "logs"}, "spec.storage."), None)
    logs = storage.get("logs") or {}
    if logs:
        problems.take(lambda: _refuse_unknown(logs, {"size", "storageClassName"}, "spec.storage.logs."), None)
    size = problems.take(lambda: _quantity(storage["size"], "spec.storage.size"), "")
    logs_size = problems.take(lambda: _quantity(logs.get("size"), "spec.storage.logs.size"), "") if logs else ""
    problems.check()
    return StorageSpec(size, str(storage.get("storageClassName", "")), logs_size,
                       str(logs.get("storageClassName", "")) if logs else "")


def _etcd(spec: Mapping[str, Any]) -> EtcdSpec:
    etcd = spec.get("etcd")
    if not isinstance(etcd, Mapping) or ("endpoints" in etcd) == ("endpointsFrom" in etcd):
        raise SpecError("spec.etcd: set exactly one of endpoints and endpointsFrom")
    _refuse_unknown(etcd, {"endpoints", "endpointsFrom", "tls", "credentials", "quotaBytes"}, "spec.etcd.")
    if "endpoints" in etcd:
        endpoints = str(etcd["endpoints"]).strip()
        if not endpoints or any(":" not in e for e in endpoints.split(",")):
            raise SpecError(f"spec.etcd.endpoints must be host:port[,host:port...], got {etcd['endpoints']!r}")
        etcd_spec = EtcdSpec(endpoints=endpoints)
    else:
        ref = etcd["endpointsFrom"]
        if not isinstance(ref, Mapping) or ("configMapKeyRef" in ref) == ("secretKeyRef" in ref):
            raise SpecError("spec.etcd.endpointsFrom: set exactly one of configMapKeyRef and secretKeyRef")
        kind = "configMapKeyRef" if "configMapKeyRef" in ref else "secretKeyRef"
        key_ref = ref[kind]
        if not isinstance(key_ref, Mapping) or not key_ref.get("name") or not key_ref.get("key"):
            raise SpecError(f"spec.etcd.endpointsFrom.{kind} needs a name and a key")
        pair = (str(key_ref["name"]), str(key_ref["key"]))
        etcd_spec = EtcdSpec(config_map=pair) if kind == "configMapKeyRef" else EtcdSpec(secret=pair)
    return replace(_etcd_security(etcd, etcd_spec), quota_bytes=_integer(
        etcd, "quotaBytes", ETCD_QUOTA_BYTES_DEFAULT, "spec.etcd.", minimum=1))


def _cluster_name(name: str, spec: Mapping[str, Any]) -> str:
    cluster_name = str(spec.get("clusterName") or name)
    if not CLUSTER_NAME.match(cluster_name) or len(cluster_name) > 63:
        raise SpecError(f"spec.clusterName {cluster_name!r} must be a DNS label (lower case, digits, '-')")
    return cluster_name


def _policy_name(spec: Mapping[str, Any]) -> str:
    ref = spec.get("compactionPolicyRef") or {}
    if ref and (not isinstance(ref, Mapping) or not ref.get("name")):
        raise SpecError("spec.compactionPolicyRef.name is required when compactionPolicyRef is set")
    return str(ref.get("name", "")) if ref else ""


def _pull_policy(spec: Mapping[str, Any]) -> str:
    pull = str(spec.get("imagePullPolicy", "IfNotPresent"))
    if pull not in ("Always", "IfNotPresent", "Never"):
        raise SpecError(f"spec.imagePullPolicy must be Always, IfNotPresent or Never, got {pull!r}")
    return pull


def _bookie(spec: Mapping[str, Any], tls: TlsSpec | None) -> dict[str, Any]:
    bookie = spec.get("bookie", {}) or {}
    if not isinstance(bookie, Mapping):
        raise SpecError("spec.bookie must be an object of octavo node settings")
    return check_bookie_settings(bookie, tls)


def parse_cluster(name: str, spec: Mapping[str, Any], default_image: str = "") -> ClusterSpec:
    """The spec checked whole: SpecError lists every fault found (`default_image`: spec.image when unset)."""
    problems = Problems()
    problems.take(lambda: _refuse_unknown(spec, CLUSTER_FIELDS, "spec."), None)
    replicas = problems.take(lambda: _replicas(spec), 0)
    min_writable = problems.take(lambda: _integer(spec, "minWritableBookies", 3, "spec.", minimum=1), 0)
    if replicas and min_writable and replicas < min_writable:
        problems.add(f"spec.replicas ({replicas}) must be at least spec.minWritableBookies ({min_writable}), the "
                     "bookies a new ledger needs")
    image = problems.take(lambda: _image(spec, default_image), "")
    storage = problems.take(lambda: _storage(spec), StorageSpec(""))
    etcd = problems.take(lambda: _etcd(spec), EtcdSpec())
    cluster_name = problems.take(lambda: _cluster_name(name, spec), name)
    tls = problems.take(lambda: _tls(spec.get("tls")), None)
    no_settings: dict[str, Any] = {}
    bookie = problems.take(lambda: _bookie(spec, tls), no_settings)
    template = spec.get("podTemplate", {}) or {}
    problems.take(lambda: _refuse_unknown(template, POD_TEMPLATE_FIELDS, "spec.podTemplate."), None)
    pdb = spec.get("podDisruptionBudget", {}) or {}
    problems.take(lambda: _refuse_unknown(pdb, {"maxUnavailable"}, "spec.podDisruptionBudget."), None)
    max_unavailable = problems.take(lambda: _integer(pdb, "maxUnavailable", 1, "spec.podDisruptionBudget."), 1)
    policy_name = problems.take(lambda: _policy_name(spec), "")
    pull = problems.take(lambda: _pull_policy(spec), "IfNotPresent")
    problems.check()
    return ClusterSpec(replicas=replicas, min_writable=min_writable, image=image, storage=storage,
                       etcd=etcd, cluster_name=cluster_name, image_pull_policy=pull,
                       resources=dict(spec.get("resources") or {}), bookie=bookie,
                       pod_template=dict(template), max_unavailable=max_unavailable,
                       policy_name=policy_name, tls=tls)


def _secret_name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not SECRET_NAME.match(value) or len(value) > 253:
        raise SpecError(f"{where} must name a Secret in the cluster's namespace, got {value!r}")
    return value


def _etcd_security(etcd: Mapping[str, Any], spec: EtcdSpec) -> EtcdSpec:
    tls = etcd.get("tls")
    if tls is not None:
        if not isinstance(tls, Mapping):
            raise SpecError("spec.etcd.tls must be an object with secretName")
        _refuse_unknown(tls, {"secretName", "clientCertificate"}, "spec.etcd.tls.")
        client_cert = tls.get("clientCertificate", True)
        if not isinstance(client_cert, bool):
            raise SpecError(f"spec.etcd.tls.clientCertificate must be true or false, got {client_cert!r}")
        spec = replace(spec, tls_secret=_secret_name(tls.get("secretName"), "spec.etcd.tls.secretName"),
                       tls_client_certificate=client_cert)
    credentials = etcd.get("credentials")
    if credentials is not None:
        if not isinstance(credentials, Mapping):
            raise SpecError("spec.etcd.credentials must be an object with secretName")
        _refuse_unknown(credentials, {"secretName"}, "spec.etcd.credentials.")
        spec = replace(spec, credentials_secret=_secret_name(credentials.get("secretName"),
                                                             "spec.etcd.credentials.secretName"))
    return spec


def _tls(tls: Any) -> TlsSpec | None:
    if tls is None:
        return None
    if not isinstance(tls, Mapping):
        raise SpecError("spec.tls must be an object with secretName")
    _refuse_unknown(tls, {"secretName", "clientAuth", "adminIdentities", "metrics"}, "spec.tls.")
    client_auth = tls.get("clientAuth", "require")
    if client_auth not in ("require", "none"):
        raise SpecError(f"spec.tls.clientAuth must be require or none, got {client_auth!r}")
    identities = tls.get("adminIdentities", []) or []
    if not isinstance(identities, list) or not all(isinstance(i, str) and IDENTITY.match(i) for i in identities):
        raise SpecError("spec.tls.adminIdentities must be a list of certificate names (CN or SAN), without commas "
                        f"or spaces, got {identities!r}")
    if identities and client_auth == "none":
        raise SpecError("spec.tls.adminIdentities needs clientAuth require: without client certificates no caller "
                        "has an identity to check")
    metrics = tls.get("metrics", False)
    if not isinstance(metrics, bool):
        raise SpecError(f"spec.tls.metrics must be true or false, got {metrics!r}")
    return TlsSpec(_secret_name(tls.get("secretName"), "spec.tls.secretName"), client_auth, tuple(identities),
                   metrics)
