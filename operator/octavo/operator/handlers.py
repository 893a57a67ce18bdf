"""The kopf handlers: thin shells around the pure parts (resources, builders, policy, status).

For each BookieCluster, one `reconcile` does everything, under a lock per cluster, from its create, update and
resume handlers (the owned objects at once) and from a timer every `poll_interval_s` (everything):
1. parse and check the spec and its CompactionPolicy (an invalid one: condition Degraded/InvalidSpec and a
   Warning event, nothing applied);
2. apply the owned objects (ConfigMap, Services, PDB, StatefulSet; owned through kopf.adopt, patched only when
   what the operator would write changed: a hash of it is kept in an annotation);
3. observe every bookie through BookieAdmin, and etcd (its alarms, its database against its quota), `decide`,
   carry out the actions, one Event each (and a Warning event when etcd turns unhealthy);
4. scale down through decommission (`scaling.py`): the StatefulSet keeps its replicas until the highest
   ordinal is retired, then loses one, and the pod's volumes are deleted;
5. write the status (merge-patched: what is gone is removed).
The operator's memory of its decisions lives in the status, so a restarted operator carries on.

Registered into a kopf registry by `register(registry, config, state)`: `octavo operator run` and the tests
(kopf's KopfRunner) each build one, with the operator's settings and live state (config.py) that every handler
is given.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf

from octavo.meta.errors import MetadataUnavailableError
from octavo.meta.etcd import EtcdAuth, EtcdClient
from octavo.meta.etcdhealth import EtcdHealth, etcd_health
from octavo.meta.layout import Layout
from octavo.meta.tls import TlsError, TlsFiles
from octavo.operator import builders
from octavo.operator.bookies import PLAINTEXT, Reach, after, apply, observe
from octavo.operator.config import OperatorConfig, OperatorState
from octavo.operator.kube import PLURALS, Kube, KubeError
from octavo.operator.policy import Policy, Shape, decide
from octavo.operator.resources import (
    GROUP,
    VERSION,
    ClusterSpec,
    PolicySpec,
    SpecError,
    parse_cluster,
    parse_policy,
)
from octavo.operator.rolling import ROLL_MARKS_READ_MAX, RollMemory, decide_roll, pod_state
from octavo.operator.scaling import decommission_step, operator_etcd_settings
from octavo.operator.status import (
    COMPACTION_WINDOW_OPEN,
    ETCD_HEALTHY,
    SCALE_DOWN_FIELD,
    SPEC_ERROR_FIELD,
    cluster_status,
    condition,
    memory_from_status,
    merge_patch,
    timestamp,
    with_roll,
)
from octavo.operator.windows import next_window, open_until
from octavo.telemetry import ServerTls

log = logging.getLogger("octavo.operator")

API_VERSION = f"{GROUP}/{VERSION}"
APPLIED_HASH = "octavo.io/applied-hash"
FINALIZER = "octavo.io/finalizer"
# How long one decommission step waits for open ledgers' writers to move off before the operator looks again.
DECOMMISSION_WAIT_S = 60.0
# A CompactionPolicy's condition: whether the operator can apply it.
VALID = "Valid"
# The last spec the operator applied: while a new one is refused, the cluster runs (and is watched) on this one.
APPLIED_SPEC_FIELD = "appliedSpec"
ROLL_FIELD = "roll"
# The operator's own image, the default of spec.image (the chart sets it from the operator's Deployment).
OPERATOR_IMAGE_ENV = "OCTAVO_OPERATOR_IMAGE"


# -- startup -------------------------------------------------------------------------------------------------

async def configure(config: OperatorConfig, state: OperatorState, settings: kopf.OperatorSettings) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="octavo.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="octavo.io", key="last-handled-configuration")
    settings.posting.reporting_component = "octavo-operator"
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # A deleted object's timer that is mid-run when the delete comes is checked again after this (kopf: 60 s),
    # and the finalizer waits for it: a CompactionPolicy took over 30 s to go.
    settings.background.cancellation_polling = 1.0
    state.connect(config)
    if config.metrics_port >= 0 and state.telemetry.endpoint is None:
        tls = None
        if config.metrics_tls:
            files = TlsFiles.from_env()
            tls = ServerTls(files.cert_file, files.key_file)
        port = await state.telemetry.serve(config.metrics_host, config.metrics_port, tls=tls)
        log.info("operator metrics on %s://%s:%d/metrics", "https" if tls else "http", config.metrics_host, port)


async def cleanup(state: OperatorState) -> None:
    if state.telemetry.endpoint is not None:
        await state.telemetry.endpoint.stop()
        state.telemetry.endpoint = None


def login(config: OperatorConfig, **kwargs: Any) -> kopf.ConnectionInfo | None:
    """A pod's service account, else the kubeconfig (`--kubeconfig`, $KUBECONFIG, ~/.kube/config)."""
    info = kopf.login_with_service_account(**kwargs)
    if info is not None:
        return info
    if config.kubeconfig:
        os.environ["KUBECONFIG"] = config.kubeconfig
    return kopf.login_with_kubeconfig(**kwargs)


def liveness(state: OperatorState) -> dict[str, Any]:
    return {"lastPoll": datetime.fromtimestamp(state.last_poll_unix_s, UTC).isoformat()
            if state.last_poll_unix_s else None}


# -- BookieCluster ---------------------------------------------------------------------------------------------

async def read_policy(kube: Kube, namespace: str, name: str) -> PolicySpec | None:
    if not name:
        return None
    body = await kube.get(API_VERSION, "compactionpolicies", namespace, name)
    if body is None:
        raise SpecError(f"spec.compactionPolicyRef: CompactionPolicy {name!r} does not exist in namespace "
                        f"{namespace!r}")
    try:
        return parse_policy(body.get("spec") or {})
    except SpecError as e:
        raise SpecError(f"CompactionPolicy {name!r} is invalid: {e}") from e


async def etcd_endpoints(kube: Kube, namespace: str, spec: ClusterSpec) -> str:
    if spec.etcd.endpoints:
        return spec.etcd.endpoints
    kind, ref = ("configmaps", spec.etcd.config_map) if spec.etcd.config_map else ("secrets", spec.etcd.secret)
    assert ref is not None
    body = await kube.get("v1", kind, namespace, ref[0])
    if body is None:
        raise SpecError(f"spec.etcd.endpointsFrom: {kind[:-1]} {ref[0]!r} does not exist")
    value = (body.get("data") or {}).get(ref[1])
    if value is None:
        raise SpecError(f"spec.etcd.endpointsFrom: {kind[:-1]} {ref[0]!r} has no key {ref[1]!r}")
    if kind == "secrets":
        import base64
        value = base64.b64decode(value).decode()
    return str(value).strip()


@dataclass(frozen=True)
class EtcdReading:
    """What the operator read of etcd: its health (alarms, database against spec.etcd.quotaBytes or the quota
    etcd reports) and the cluster's under-replicated marks (at most ROLL_MARKS_READ_MAX counted); None and why
    when etcd could not be read."""

    health: EtcdHealth | None
    underreplicated: int | None
    error: str = ""


async def observe_etcd(kube: Kube, namespace: str, spec: ClusterSpec, timeout_s: float) -> EtcdReading:
    """etcd is reached with the operator's own etcd settings ($OCTAVO_ETCD_*)."""
    try:
        endpoints = await etcd_endpoints(kube, namespace, spec)
        secure = operator_etcd_settings()
        auth = EtcdAuth.from_settings(secure["etcd_tls_ca_file"], secure["etcd_tls_cert_file"],
                                      secure["etcd_tls_key_file"], secure["etcd_username"],
                                      secure["etcd_password_file"])
        async with EtcdClient(endpoints, timeout_s=timeout_s, auth=auth) as etcd:
            health = etcd_health(await etcd.status(), spec.etcd.quota_bytes)
            marks = await etcd.get_prefix(Layout(spec.cluster_name).underreplicated, limit=ROLL_MARKS_READ_MAX,
                                          keys_only=True)
            return EtcdReading(health, len(marks))
    except (SpecError, ValueError, MetadataUnavailableError) as e:
        return EtcdReading(None, None, f"cannot read etcd's status: {e}")


def applied_hash(obj: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Applied:
    """What apply_owned did: the objects it created or patched ("Kind/name"), and each object as the API server
    answered ("Kind/name" -> the object; None when a create raced another and lost)."""

    changed: list[str]
    current: dict[str, dict[str, Any] | None]


async def apply_owned(kube: Kube, owner: Mapping[str, Any], objects: list[dict[str, Any]],
                      known: Mapping[str, dict[str, Any] | None] | None = None) -> Applied:
    """Create what is missing, patch what the operator would now write differently. `known`: objects this
    reconcile has read already ("Kind/name" -> the object, None: missing), not read again."""
    changed, current, known = [], {}, known or {}
    for obj in objects:
        kopf.adopt(obj, owner=dict(owner))  # type: ignore[arg-type]
        digest = applied_hash(obj)
        obj["metadata"].setdefault("annotations", {})[APPLIED_HASH] = digest
        meta, key = obj["metadata"], f"{obj['kind']}/{obj['metadata']['name']}"
        plural = PLURALS[obj["kind"]]
        found = known[key] if key in known else await kube.get(obj["apiVersion"], plural, meta["namespace"],
                                                                meta["name"])
        if found is None:
            try:
                found = await kube.create(obj)
            except KubeError as e:
                if e.status != 409:
                    raise
            changed.append(key)
        elif (found.get("metadata", {}).get("annotations") or {}).get(APPLIED_HASH) != digest or (
                obj["kind"] == "StatefulSet" and found.get("spec", {}).get("replicas") != obj["spec"]["replicas"]):
            # The replicas are checked on their own: a scale-down changes them without this hash.
            found = await kube.patch(obj["apiVersion"], plural, meta["namespace"], meta["name"], obj)
            changed.append(key)
        current[key] = found
    return Applied(changed, current)


def frozen(body: Mapping[str, Any]) -> dict[str, Any]:
    """The object as it is now, for one handler run to read throughout. kopf gives timers a live body, replaced
    in place whenever a watch event arrives: a poll that read the spec before a change and the generation after
    it built the old spec under the new generation, and showed that generation as rolled out."""
    return copy.deepcopy(dict(body))


async def reconcile(config: OperatorConfig, state: OperatorState, name: str, namespace: str,
                    body: Mapping[str, Any], status: Mapping[str, Any], patch: kopf.Patch, poll: bool) -> None:
    with state.metrics.reconciling("poll" if poll else "change") as outcome:
        if not await _reconcile(config, state, name, namespace, body, status, patch, poll):
            outcome["result"] = "spec_error"


async def _reconcile(config: OperatorConfig, state: OperatorState, name: str, namespace: str,
                     body: Mapping[str, Any], status: Mapping[str, Any], patch: kopf.Patch, poll: bool) -> bool:
    """One reconcile; False when the spec could not be applied (the cluster then runs on the last one that
    could: it is still polled, forced read-only and compacted in its windows)."""
    kube = state.kube
    async with state.lock((namespace, name)):
        body = frozen(body)
        status = body.get("status") or {}
        now = state.now()
        raw = dict(body.get("spec") or {})
        try:
            spec, policy = await _parse(kube, name, namespace, raw)
        except SpecError as e:
            error = str(e)
            # Once per refusal: the status says it was reported (across restarts), and so does the state, for a
            # reconcile that queued behind the one that reported it and holds the status from before its patch.
            if (status.get(SPEC_ERROR_FIELD) or "") != error and state.spec_errors.get((namespace, name)) != error:
                state.spec_errors[(namespace, name)] = error
                kopf.warn(dict(body), reason="InvalidSpec",  # type: ignore[arg-type]
                          message=f"the new spec is refused, the cluster keeps running on the last valid one: "
                                  f"{error}" if status.get(APPLIED_SPEC_FIELD) else error)
            fallback = await _last_valid(kube, name, namespace, status)
            if fallback is None or not poll:
                if fallback is None:
                    _write_status(patch, status, cluster_status(
                        now, generation=int(body.get("metadata", {}).get("generation") or 0),
                        replicas=raw["replicas"] if isinstance(raw.get("replicas"), int) else 0,
                        ready_replicas=int(status.get("readyReplicas") or 0),
                        selector=builders.selector_string(name), bookies=[], pods={}, decision=None,
                        spec_error=error, old=status))
                return False
            spec, policy = fallback
            statefulset = await kube.get("apps/v1", "statefulsets", namespace, name)
            running = int(((statefulset or {}).get("spec") or {}).get("replicas") or spec.replicas)
            await _poll(config, state, name, namespace, body, status, patch, spec, policy, statefulset,
                        max(spec.replicas, running), now, spec_error=error)
            state.last_poll_unix_s = now.timestamp()
            return False
        patch.status[APPLIED_SPEC_FIELD] = raw
        state.spec_errors.pop((namespace, name), None)
        # The StatefulSet is read once per reconcile: here, and apply_owned answers it as it is after its patch.
        existing = await kube.get("apps/v1", "statefulsets", namespace, name)
        current_replicas = int((existing or {}).get("spec", {}).get("replicas") or 0) if existing else spec.replicas
        # A scale-down keeps the StatefulSet's replicas until the highest ordinal is decommissioned.
        target = max(spec.replicas, current_replicas)
        objects = builders.owned_objects(name, namespace, spec, policy.compaction if policy else None,
                                         replicas=target, generation=int(body.get("metadata", {}).get("generation")
                                                                         or 0))
        applied = await apply_owned(kube, body, objects, known={f"StatefulSet/{name}": existing})
        for what in applied.changed:
            log.info("cluster %s/%s: applied %s", namespace, name, what,
                     extra={"event": "applied", "namespace": namespace, "cluster": name})
        if applied.changed:
            state.metrics.objects_applied.add(len(applied.changed))
        if not poll and existing is not None:
            return True
        await _poll(config, state, name, namespace, body, status, patch, spec, policy,
                    applied.current.get(f"StatefulSet/{name}"), target, now)
        state.last_poll_unix_s = now.timestamp()
        state.metrics.scale_downs = sum(1 for task in state.scale_downs.values() if not task.done())
        return True


async def _parse(kube: Kube, name: str, namespace: str,
                 raw: Mapping[str, Any]) -> tuple[ClusterSpec, PolicySpec | None]:
    spec = parse_cluster(name, raw, default_image=os.environ.get(OPERATOR_IMAGE_ENV, ""))
    return spec, await read_policy(kube, namespace, spec.policy_name)


async def _last_valid(kube: Kube, name: str, namespace: str,
                      status: Mapping[str, Any]) -> tuple[ClusterSpec, PolicySpec | None] | None:
    """The last applied spec (and its policy), if there is one and it still parses; None otherwise."""
    applied = status.get(APPLIED_SPEC_FIELD)
    if not isinstance(applied, Mapping):
        return None
    try:
        return await _parse(kube, name, namespace, applied)
    except SpecError:
        try:  # its policy may be the invalid part now: the cluster still runs, without the policy
            return parse_cluster(name, applied, default_image=os.environ.get(OPERATOR_IMAGE_ENV, "")), None
        except SpecError:
            return None


def cluster_reach(name: str, namespace: str, spec: ClusterSpec, ids: Sequence[str]) -> tuple[Reach, str]:
    """How to reach this cluster's bookies, and what stops the operator from it ("" if nothing): a cluster with
    spec.tls needs the operator's own certificate ($OCTAVO_TLS_*; the chart mounts it with tls.enabled)."""
    if spec.tls is None:
        return PLAINTEXT, ""
    names = {b: builders.bookie_server_name(name, b, namespace) for b in ids}
    tls = TlsFiles.from_env()
    if not tls.ca_file or (spec.tls.client_auth == "require" and not tls.cert_file):
        return Reach(tls, names), (
            "spec.tls is set but the operator has no certificate to reach TLS bookies: give it "
            "OCTAVO_TLS_CA_FILE" + (", OCTAVO_TLS_CERT_FILE and OCTAVO_TLS_KEY_FILE" if spec.tls.client_auth ==
                                    "require" else "") + " (the chart does with tls.enabled)")
    try:
        tls.check("OCTAVO_TLS")
    except TlsError as e:
        return Reach(tls, names), f"the operator's TLS files cannot be used: {e}"
    return Reach(tls, names), ""


async def _poll(config: OperatorConfig, state: OperatorState, name: str, namespace: str, body: Mapping[str, Any],
                status: Mapping[str, Any], patch: kopf.Patch, spec: ClusterSpec, policy: PolicySpec | None,
                statefulset: Mapping[str, Any] | None, target: int, now: datetime, spec_error: str = "") -> None:
    kube = state.kube
    pods = {p["metadata"]["name"]: p for p in await kube.list("v1", "pods", namespace, builders.selector_string(name))}
    ids = builders.bookie_ids(name, target)
    addresses = {b: (f"{pods[b]['status']['podIP']}:{builders.BOOKIE_PORT}"
                     if b in pods and (pods[b].get("status") or {}).get("podIP") else "") for b in ids}
    reach, reach_problem = cluster_reach(name, namespace, spec, ids)
    observed = await observe(addresses, config.admin_timeout_s, reach)
    decision = decide(now, policy.policy if policy else Policy(), Shape(target, spec.min_writable), observed,
                      memory_from_status(status))
    results = await apply(decision.actions, addresses, config.admin_timeout_s, reach)
    observed = after(observed, results)
    for action, error in results:
        state.metrics.actions.add(1, {"kind": action.kind, "result": "failed" if error else "ok"})
        log.info("cluster %s/%s: %s bookie %s (%s)%s", namespace, name, action.kind, action.bookie_id, action.reason,
                 f": failed: {error}" if error else "", extra={
                     "event": action.kind, "namespace": namespace, "cluster": name, "bookie_id": action.bookie_id})
        if error:
            kopf.warn(dict(body), reason=f"{action.kind}Failed", message=error)  # type: ignore[arg-type]
        else:
            kopf.info(dict(body), reason=action.kind,  # type: ignore[arg-type]
                      message=f"bookie {action.bookie_id}: {action.reason}")
    scale_message = await _scale_down(config, state, name, namespace, body, status, spec, target)
    etcd = await observe_etcd(kube, namespace, spec, config.admin_timeout_s)
    ready = int(((statefulset or {}).get("status") or {}).get("readyReplicas") or 0)
    generation = int(body.get("metadata", {}).get("generation") or 0)
    new = cluster_status(now, generation=generation, replicas=spec.replicas, ready_replicas=ready,
                         selector=builders.selector_string(name), bookies=observed,
                         pods={b: b for b in ids if b in pods}, decision=decision, spec_error=spec_error, old=status,
                         etcd=etcd.health, etcd_error=etcd.error, reach_problem=reach_problem,
                         scale_down=scale_message)
    _warn_etcd(body, status, new)
    if not scale_message:
        new = await _roll(kube, name, namespace, body, status, new, statefulset, pods, observed, target,
                          etcd.underreplicated, generation, now, config.roll_ready_timeout_s,
                          spec_valid=not spec_error)
    _write_status(patch, status, new)


async def _roll(kube: Kube, name: str, namespace: str, body: Mapping[str, Any], status: Mapping[str, Any],
                new: dict[str, Any], statefulset: Mapping[str, Any] | None, pods: Mapping[str, Mapping[str, Any]],
                observed: Sequence[Any], target: int, underreplicated: int | None, generation: int,
                now: datetime, ready_timeout_s: float, spec_valid: bool = True) -> dict[str, Any]:
    """One step of a roll (rolling.py): the pods it deletes, one Event per step, and the status it shows."""
    if statefulset is None:
        return new
    sts_status = statefulset.get("status") or {}
    update_revision = str(sts_status.get("updateRevision") or "")
    template = (statefulset.get("spec") or {}).get("template") or {}
    answers = {b.bookie_id: b.reachable for b in observed}
    states = [pod_state(pod, template, update_revision, answers.get(pod_name, False))
              for pod_name, pod in sorted(pods.items()) if pod_name in set(builders.bookie_ids(name, target))]
    sts_meta = statefulset.get("metadata") or {}
    current = int(sts_status.get("observedGeneration") or 0) >= int(sts_meta.get("generation") or 0) and bool(
        update_revision)
    if spec_valid:  # the StatefulSet must also have been given this generation's spec (APPLIED_GENERATION)
        built_from = int((sts_meta.get("annotations") or {}).get(builders.APPLIED_GENERATION) or 0)
        current = current and built_from >= generation
    step = decide_roll(now.timestamp(), generation=generation, template_current=current, replicas=target,
                       pods=states, underreplicated=underreplicated,
                       memory=RollMemory.from_status(status.get(ROLL_FIELD)),
                       ready_timeout_s=ready_timeout_s)
    for pod_name in step.delete:
        await kube.delete("v1", "pods", namespace, pod_name)
    for event in step.events:
        log.info("cluster %s/%s: %s", namespace, name, event.message,
                 extra={"event": event.reason, "namespace": namespace, "cluster": name})
        (kopf.warn if event.warning else kopf.info)(dict(body), reason=event.reason,  # type: ignore[arg-type]
                                                    message=event.message)
    memory = step.memory
    log.debug("cluster %s/%s: roll generation %d template_current %s update_revision %s outdated %s memory %s "
             "waiting_for %r", namespace, name, generation, current, update_revision,
             [p.name for p in states if p.restart_reason], memory, step.waiting_for)
    return with_roll(new, status, progress=step.progress, waiting_for=step.waiting_for,
                     halted=memory.halted if memory else "", restarting=memory.restarting if memory else "",
                     roll=memory.to_status() if memory else None, now=now)


def _warn_etcd(body: Mapping[str, Any], old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """A Warning event when EtcdHealthy turns False or changes its reason (one per change, not per poll)."""
    def etcd_condition(status: Mapping[str, Any]) -> Mapping[str, Any]:
        return next((c for c in status.get("conditions") or [] if c.get("type") == ETCD_HEALTHY), {})

    now, before = etcd_condition(new), etcd_condition(old)
    if now.get("status") == "False" and (before.get("status"), before.get("reason")) != ("False", now.get("reason")):
        kopf.warn(dict(body), reason=str(now.get("reason")), message=str(now.get("message")))  # type: ignore[arg-type]


def _write_status(patch: kopf.Patch, old: Mapping[str, Any], new: dict[str, Any]) -> None:
    # The last applied spec: set by this reconcile when its spec was valid, else kept (never merged away).
    applied = patch.status.get(APPLIED_SPEC_FIELD) or old.get(APPLIED_SPEC_FIELD)
    if applied is not None:
        new[APPLIED_SPEC_FIELD] = applied
    for key, value in merge_patch(dict(old), new).items():
        patch.status[key] = value


async def _scale_down(config: OperatorConfig, state: OperatorState, name: str, namespace: str,
                      body: Mapping[str, Any], status: Mapping[str, Any], spec: ClusterSpec, target: int) -> str:
    """One step of a scale-down (started, or finished and applied); what it is doing, in words ("" if none)."""
    kube, key = state.kube, (namespace, name)
    task = state.scale_downs.get(key)
    if target <= spec.replicas:
        if task is not None and not task.done():
            task.cancel()
        state.scale_downs.pop(key, None)
        state.scale_down_refusals.pop(key, None)
        return ""
    victim = f"{name}-{target - 1}"
    if task is None or (task.done() and task.cancelled()):
        etcd = await etcd_endpoints(kube, namespace, spec)
        if not status.get(SCALE_DOWN_FIELD):  # once per scale-down step, not per attempt
            kopf.info(dict(body), reason="ScaleDown",  # type: ignore[arg-type]
                      message=f"decommissioning {victim} before its pod is removed ({target} -> {spec.replicas})")
        state.scale_downs[key] = asyncio.create_task(decommission_step(
            etcd, spec.cluster_name, victim, config.decommission_rate_bytes_per_s, DECOMMISSION_WAIT_S,
            config.admin_timeout_s, tls=TlsFiles.from_env() if spec.tls is not None else None))
        return f"decommissioning {victim} ({target} -> {spec.replicas} bookies)"
    if not task.done():
        return f"decommissioning {victim} ({target} -> {spec.replicas} bookies)"
    state.scale_downs.pop(key, None)
    try:
        step = task.result()
    except Exception as e:  # a fault of ours: reported, and the step is tried again at the next poll
        log.exception("decommission of %s failed", victim)
        kopf.warn(dict(body), reason="ScaleDownFailed", message=f"{victim}: {e!r}")  # type: ignore[arg-type]
        return f"decommission of {victim} failed: {e!r}; retrying"
    if not step.retired:
        if step.refused and state.scale_down_refusals.get(key) != step.message:  # once per change of reason
            state.scale_down_refusals[key] = step.message
            kopf.warn(dict(body), reason="ScaleDownRefused", message=step.message)  # type: ignore[arg-type]
        return step.message
    state.scale_down_refusals.pop(key, None)
    # The volumes go first (Kubernetes keeps a claim in use until its pod is gone), so that no crash between
    # the two steps can leave a retired data directory for a later scale-up to bring back.
    for claim in ("data", "logs"):
        await kube.delete("v1", "persistentvolumeclaims", namespace, f"{claim}-{victim}")
    await kube.patch("apps/v1", "statefulsets", namespace, name, {"spec": {"replicas": target - 1}})
    kopf.info(dict(body), reason="ScaledDown", message=step.message)  # type: ignore[arg-type]
    return f"{step.message}; {target - 1} bookies now" if target - 1 > spec.replicas else ""


# -- CompactionPolicy ------------------------------------------------------------------------------------------

async def policy_status(state: OperatorState, name: str, namespace: str, body: Mapping[str, Any],
                        status: Mapping[str, Any], patch: kopf.Patch) -> None:
    """The policy's status: valid or why not, the window open now or the next one, and per cluster using it
    each bookie's last compaction run."""
    body = frozen(body)
    status = body.get("status") or {}
    now = state.now()
    old_conditions = status.get("conditions") or []
    generation = int(body.get("metadata", {}).get("generation") or 0)
    try:
        parsed = parse_policy(body.get("spec") or {})
    except SpecError as e:
        if not any(c.get("type") == VALID and c.get("message") == str(e) for c in old_conditions):
            kopf.warn(dict(body), reason="InvalidSpec", message=str(e))  # type: ignore[arg-type]
        _write_policy_status(patch, status, {
            "observedGeneration": generation, "windowOpen": False, "openUntil": None, "nextWindow": None,
            "conditions": [condition(old_conditions, VALID, False, "InvalidSpec", str(e), now)]})
        return
    windows = parsed.policy.windows
    stretch = open_until(windows, now) if windows else None
    state.metrics.windows[(namespace, name)] = stretch is not None
    upcoming = next_window(windows, now) if windows else None
    clusters = []
    for cluster in await state.kube.list(API_VERSION, "bookieclusters", namespace):
        if ((cluster.get("spec") or {}).get("compactionPolicyRef") or {}).get("name") != name:
            continue
        runs = [{"bookie": b["id"], "finished": b["compaction"]["lastRun"]}
                for b in (cluster.get("status") or {}).get("bookies") or []
                if (b.get("compaction") or {}).get("lastRun")]
        clusters.append({"name": cluster["metadata"]["name"], "lastRuns": runs})
    _write_policy_status(patch, status, {
        "observedGeneration": generation, "windowCount": len(windows), "windowOpen": stretch is not None,
        "openUntil": timestamp(stretch[1]) if stretch else None,
        "nextWindow": {"start": timestamp(upcoming[0]), "end": timestamp(upcoming[1])} if upcoming else None,
        "clusters": clusters,
        "conditions": [condition(old_conditions, VALID, True, "Valid", "", now),
                       condition(old_conditions, COMPACTION_WINDOW_OPEN, stretch is not None,
                                 "WindowOpen" if stretch else "WindowClosed",
                                 f"open until {timestamp(stretch[1])}" if stretch else
                                 f"next window {timestamp(upcoming[0])}" if upcoming else "no windows", now)]})


def _write_policy_status(patch: kopf.Patch, old: Mapping[str, Any], new: dict[str, Any]) -> None:
    """None in `new`: the field is removed."""
    for key, value in merge_patch(dict(old), {k: v for k, v in new.items() if v is not None}).items():
        patch.status[key] = value


# -- registration ----------------------------------------------------------------------------------------------

def register(registry: kopf.OperatorRegistry, config: OperatorConfig, state: OperatorState) -> None:
    """Every handler, into `registry`, each given `config` and `state` (nothing else carries them); the timers at
    `config.poll_interval_s`."""

    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        await configure(config, state, settings)

    async def shutdown(**_: Any) -> None:
        await cleanup(state)

    def credentials(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return login(config, **kwargs)

    def probe(**_: Any) -> dict[str, Any]:
        return liveness(state)

    async def cluster_changed(*, name: str, namespace: str | None, body: kopf.Body, status: kopf.Status,
                              patch: kopf.Patch, **_: Any) -> None:
        await reconcile(config, state, name, namespace or "", body, status, patch, poll=False)

    async def cluster_poll(*, name: str, namespace: str | None, body: kopf.Body, status: kopf.Status,
                           patch: kopf.Patch, **_: Any) -> None:
        await reconcile(config, state, name, namespace or "", body, status, patch, poll=True)

    async def policy_poll(*, name: str, namespace: str | None, body: kopf.Body, status: kopf.Status,
                          patch: kopf.Patch, **_: Any) -> None:
        await policy_status(state, name, namespace or "", body, status, patch)

    async def policy_deleted(*, name: str, namespace: str | None, **_: Any) -> None:
        state.metrics.windows.pop((namespace or "", name), None)

    kopf.on.startup(registry=registry)(startup)
    kopf.on.cleanup(registry=registry)(shutdown)
    kopf.on.login(registry=registry)(credentials)
    kopf.on.probe(registry=registry, id="poll")(probe)
    for decorator in (kopf.on.create, kopf.on.update, kopf.on.resume):
        decorator(GROUP, VERSION, "bookieclusters", registry=registry, field="spec",
                  id=f"cluster-{decorator.__name__}")(cluster_changed)
    kopf.timer(GROUP, VERSION, "bookieclusters", registry=registry, interval=config.poll_interval_s,
               initial_delay=0.2, id="cluster-poll")(cluster_poll)
    kopf.on.delete(GROUP, VERSION, "compactionpolicies", registry=registry, optional=True,
                   id="policy-deleted")(policy_deleted)
    kopf.timer(GROUP, VERSION, "compactionpolicies", registry=registry, interval=config.poll_interval_s,
               initial_delay=0.2, id="policy-poll")(policy_poll)
