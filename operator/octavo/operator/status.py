"""A BookieCluster's status, built from what was observed and decided. Pure: time comes in as `now`.

Conditions (type, status, reason, message), each keeping its lastTransitionTime while its status stays:
- Ready: every bookie of the spec answers and the StatefulSet has them all ready;
- Progressing: the operator has not yet seen this generation through (pods starting, rolling, a scale-down
  decommissioning its highest bookie);
- Degraded: a bookie does not answer, the spec cannot be applied, etcd refuses writes, or the operator cannot
  reach the bookies at all (the message says why);
- DiskPressure: a bookie is past warnRatio, or was left writable above readOnlyRatio to keep the cluster
  writable (each message names the bookie);
- CompactionWindowOpen: a window of the policy is open, until when; the next one otherwise;
- EtcdHealthy: etcd answers, raises no alarm and its database is below ETCD_QUOTA_WARN_RATIO of its quota;
  False with reason EtcdNoSpace (NOSPACE: etcd refuses every write, no ledger can be created anywhere; Degraded
  too), EtcdCorrupt, EtcdNearQuota or EtcdUnreachable, the message saying what to do; Unknown when the spec
  could not be read (no etcd to ask). `status.etcd` carries the figures.
And the operator's memory of its own decisions (`memory`), so that a restarted operator carries on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from octavo.meta.etcdhealth import CORRUPT, NOSPACE, EtcdHealth
from octavo.operator.policy import Decision, Memory, Observed

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
DISK_PRESSURE = "DiskPressure"
COMPACTION_WINDOW_OPEN = "CompactionWindowOpen"
ETCD_HEALTHY = "EtcdHealthy"
CONDITION_TYPES = (READY, PROGRESSING, DEGRADED, DISK_PRESSURE, COMPACTION_WINDOW_OPEN, ETCD_HEALTHY)
# Status fields beside the conditions: why the spec is refused ("" when it is not), and what a scale-down is doing
# (absent when none is under way).
SPEC_ERROR_FIELD = "specError"
SCALE_DOWN_FIELD = "scaleDown"


def timestamp(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def from_ms(ms: int) -> str:
    return timestamp(datetime.fromtimestamp(ms / 1000, UTC)) if ms > 0 else ""


def _window(until_unix_ms: int, now: datetime) -> str:
    """A bookie's compaction window in words: its own schedule (none set), open until when, or closed."""
    if until_unix_ms == 0:
        return "own schedule"
    if until_unix_ms > now.timestamp() * 1000:
        return f"open until {from_ms(until_unix_ms)}"
    return "closed"


def memory_to_status(memory: Memory) -> dict[str, Any]:
    return {"forcedByOperator": sorted(memory.forced_by_operator),
            "windowOpenedUnixMs": dict(sorted(memory.window_opened_unix_ms.items())),
            "compactedInStretch": dict(sorted(memory.compacted_in_stretch.items())),
            "emergencyOpenedUnixMs": dict(sorted(memory.emergency_opened_unix_ms.items())),
            "lastRunAtOpenUnixMs": dict(sorted(memory.last_run_at_open_unix_ms.items()))}


def memory_from_status(status: Mapping[str, Any] | None) -> Memory:
    """The memory kept in a status; anything unreadable is forgotten (the operator then decides afresh)."""
    raw = (status or {}).get("memory") or {}

    def ints(key: str) -> dict[str, int]:
        value = raw.get(key) or {}
        return {str(k): int(v) for k, v in value.items() if isinstance(v, int | float)} if isinstance(value, Mapping) \
            else {}

    forced = raw.get("forcedByOperator") or []
    return Memory(forced_by_operator=frozenset(str(b) for b in forced if isinstance(b, str)),
                  window_opened_unix_ms=ints("windowOpenedUnixMs"),
                  compacted_in_stretch=ints("compactedInStretch"),
                  emergency_opened_unix_ms=ints("emergencyOpenedUnixMs"),
                  last_run_at_open_unix_ms=ints("lastRunAtOpenUnixMs"))


def condition(old: Sequence[Mapping[str, Any]], kind: str, ok: bool | None, reason: str, message: str,
              now: datetime) -> dict[str, Any]:
    """`ok` None: Unknown (nothing was observed to say either way)."""
    status = "Unknown" if ok is None else "True" if ok else "False"
    previous = next((c for c in old if c.get("type") == kind), None)
    since = previous.get("lastTransitionTime") if previous and previous.get("status") == status else None
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": since or timestamp(now)}


def etcd_condition(old: Sequence[Mapping[str, Any]], etcd: EtcdHealth | None, etcd_error: str,
                   now: datetime) -> dict[str, Any]:
    """EtcdHealthy from what was read of etcd: `etcd` None and `etcd_error` empty when etcd was not asked."""
    if etcd is None:
        if etcd_error:
            return condition(old, ETCD_HEALTHY, False, "EtcdUnreachable", etcd_error, now)
        return condition(old, ETCD_HEALTHY, None, "NotObserved", "etcd was not asked (the spec is invalid)", now)
    problems = etcd.problems()
    reason = ("EtcdNoSpace" if NOSPACE in etcd.alarms else "EtcdCorrupt" if CORRUPT in etcd.alarms else
              "EtcdAlarm" if etcd.alarms else "EtcdNearQuota" if problems else "EtcdHealthy")
    return condition(old, ETCD_HEALTHY, not problems, reason, " ".join([*problems, etcd.summary()]), now)


def etcd_to_status(etcd: EtcdHealth | None, etcd_error: str) -> dict[str, Any]:
    if etcd is None:
        return {"error": etcd_error} if etcd_error else {}
    return {"dbSizeBytes": etcd.db_size_bytes, "dbSizeInUseBytes": etcd.db_size_in_use_bytes,
            "quotaBytes": etcd.quota_bytes, "quotaSource": etcd.quota_source,
            "dbSizeRatio": f"{etcd.db_size_ratio:.0%}", "alarms": list(etcd.alarms),
            "refusesWrites": etcd.refuses_writes, "error": ""}


def cluster_status(now: datetime, *, generation: int, replicas: int, ready_replicas: int, selector: str,
                   bookies: Sequence[Observed], pods: Mapping[str, str], decision: Decision | None,
                   spec_error: str, old: Mapping[str, Any] | None, etcd: EtcdHealth | None = None,
                   etcd_error: str = "", reach_problem: str = "", scale_down: str = "") -> dict[str, Any]:
    """The status to write. `pods` maps bookie id to pod name; `decision` is None when the spec is invalid;
    `etcd` is etcd's health as read now (None: not read, and `etcd_error` says why if it was tried);
    `reach_problem` what stops the operator from reaching the bookies at all (Degraded, whatever else holds);
    `scale_down` what a scale-down is doing, in words (Progressing; "" when none is under way)."""
    old = old or {}
    old_conditions = list(old.get("conditions") or [])
    reachable = [b for b in bookies if b.reachable]
    missing = sorted(b.bookie_id for b in bookies if not b.reachable)
    forced_by_op = decision.memory.forced_by_operator if decision else frozenset()
    entries = [_bookie_entry(b, pods.get(b.bookie_id, ""), b.bookie_id in forced_by_op, now)
               for b in sorted(bookies, key=lambda b: b.bookie_id)]
    # During a scale-down the bookies observed outnumber the spec's replicas until the highest is retired.
    observed_count = max(len(bookies), replicas)
    ready = bool(bookies) and ready_replicas >= replicas and not missing and len(reachable) >= replicas
    leaving = f" ({observed_count - replicas} being removed)" if observed_count > replicas else ""
    pods_ready = min(ready_replicas, observed_count)
    starting = bool(bookies) and ready_replicas < replicas
    conditions = [
        condition(old_conditions, READY, ready, "AllBookiesReady" if ready else "NotAllBookiesReady",
                  f"{len(reachable)} of {observed_count} bookies answer{leaving}, {pods_ready} pods ready", now),
        condition(old_conditions, PROGRESSING, True, "ScalingDown", scale_down, now) if scale_down else
        condition(old_conditions, PROGRESSING, starting, "PodsStarting" if starting else
                  "SpecRefused" if spec_error and not bookies else "Stable",
                  f"{pods_ready} of {replicas} pods ready" if bookies else
                  "nothing is applied while the spec is invalid", now),
        condition(old_conditions, DEGRADED, True, "OperatorCannotReachBookies", reach_problem, now) if reach_problem
        else _degraded(old_conditions, spec_error, missing, etcd, now),
        condition(old_conditions, DISK_PRESSURE, bool(decision and decision.disk_pressure),
                  "DiskUsageHigh" if decision and decision.disk_pressure else "DiskUsageNormal",
                  "; ".join(decision.disk_pressure) if decision else "", now),
    ]
    window = decision.window if decision else None
    upcoming = decision.next_window if decision else None
    conditions.append(condition(
        old_conditions, COMPACTION_WINDOW_OPEN, window is not None, "WindowOpen" if window else "WindowClosed",
        f"open until {timestamp(window[1])}" if window else
        f"next window {timestamp(upcoming[0])} to {timestamp(upcoming[1])}" if upcoming else "no windows", now))
    conditions.append(etcd_condition(old_conditions, etcd, etcd_error, now))
    usage = max((b.disk_usage_ratio for b in reachable), default=0.0)
    status: dict[str, Any] = {
        "observedGeneration": generation, "replicas": replicas, "readyReplicas": ready_replicas,
        "selector": selector, "writableBookies": sum(1 for b in reachable if b.writable),
        "readOnlyBookies": sum(1 for b in reachable if not b.writable), "diskUsageMax": f"{usage:.0%}",
        "windowOpen": window is not None, "bookies": entries, "conditions": conditions, SPEC_ERROR_FIELD: spec_error,
    }
    if scale_down:
        status[SCALE_DOWN_FIELD] = scale_down
    etcd_status = etcd_to_status(etcd, etcd_error)
    if etcd_status:
        status["etcd"] = etcd_status
    elif old.get("etcd"):
        status["etcd"] = old["etcd"]  # not read this time (an invalid spec): the last reading stays
    if upcoming:
        status["nextWindow"] = {"start": timestamp(upcoming[0]), "end": timestamp(upcoming[1])}
    if decision is not None:
        status["memory"] = memory_to_status(decision.memory)
    elif old.get("memory"):
        status["memory"] = old["memory"]
    return status


def _bookie_entry(b: Observed, pod: str, forced_by_operator: bool, now: datetime) -> dict[str, Any]:
    """One bookie's line of `status.bookies`."""
    entry: dict[str, Any] = {"id": b.bookie_id, "pod": pod, "reachable": b.reachable}
    if not b.reachable:
        entry.update(mode="unknown", reason="did not answer")
        return entry
    entry.update(mode="writable" if b.writable else "read-only", forced=b.forced_read_only,
                 forcedByOperator=forced_by_operator, diskUsageRatio=round(b.disk_usage_ratio, 4),
                 compaction={"running": b.compacting, "window": _window(b.window_until_unix_ms, now),
                             "lastRun": from_ms(b.last_compaction_unix_ms)},
                 scrub={"lastPass": from_ms(b.scrub_last_pass_unix_ms), "damagedEntries": b.damaged_entries})
    entry["reason"] = ("forced read-only by the operator (disk usage)" if forced_by_operator else
                       "forced read-only" if b.forced_read_only else "" if b.writable else "disk full")
    return entry


def _degraded(old: Sequence[Mapping[str, Any]], spec_error: str, missing: Sequence[str], etcd: EtcdHealth | None,
              now: datetime) -> dict[str, Any]:
    """Degraded, its reason the most serious cause (an invalid spec, etcd refusing writes, bookies not
    answering), its message every cause."""
    refusing = etcd is not None and etcd.refuses_writes
    messages = [spec_error] if spec_error else []
    if refusing:
        messages.append(f"etcd refuses writes (alarms: {', '.join(etcd.alarms) if etcd else ''}): no ledger can be "
                        "created, closed or deleted; see condition EtcdHealthy")
    if missing:
        messages.append(f"not answering: {', '.join(missing)}")
    reason = ("InvalidSpec" if spec_error else "EtcdRefusesWrites" if refusing else
              "BookiesNotAnswering" if missing else "AsExpected")
    return condition(old, DEGRADED, bool(messages), reason, "; ".join(messages), now)


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`: changed keys, and None for removed ones
    (a status patch must remove what is gone, like a bookie's slot in the operator's memory)."""
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            inner = merge_patch(before, value)
            if inner:
                patch[key] = inner
        elif value != before or key not in old:
            patch[key] = value
    return patch


def with_roll(status: dict[str, Any], old: Mapping[str, Any], *, progress: str, waiting_for: str, halted: str,
              restarting: str, roll: Mapping[str, Any] | None, now: datetime) -> dict[str, Any]:
    """The status during a roll (rolling.py): Progressing True with reason RollingUpdate and "k of n bookies
    updated"; observedGeneration stays at the last generation fully rolled out; the bookie being restarted does
    not make the cluster Degraded (a halted roll does, reason RollingUpdateHalted). `roll` None: no roll.

    observedGeneration moves only in the status that ends the roll (no `roll`, Progressing no longer
    RollingUpdate), one write: whoever reads it at the new generation (`kubectl wait`) sees the change rolled out.
    The RollingUpdateComplete Event is posted apart from this write and may be seen a moment later."""
    old_conditions = list(old.get("conditions") or [])
    if roll is None and not waiting_for:
        status.pop("roll", None)
        return status
    if roll is not None:
        status["roll"] = dict(roll)
    if "observedGeneration" in old:
        status["observedGeneration"] = old["observedGeneration"]
    else:  # no generation was ever rolled out: none is shown while this one rolls
        status.pop("observedGeneration", None)
    message = "; ".join(part for part in (progress, f"waiting for {waiting_for}" if waiting_for else "") if part)
    for i, c in enumerate(status["conditions"]):
        if c["type"] == PROGRESSING:
            status["conditions"][i] = condition(old_conditions, PROGRESSING, True, "RollingUpdate", message, now)
        elif c["type"] == DEGRADED and halted:
            messages = [m for m in (halted, c["message"] if c["status"] == "True" else "") if m]
            status["conditions"][i] = condition(old_conditions, DEGRADED, True, "RollingUpdateHalted",
                                                "; ".join(messages), now)
        elif c["type"] == DEGRADED and c["reason"] == "BookiesNotAnswering" and restarting and \
                c["message"] == f"not answering: {restarting}":
            status["conditions"][i] = condition(old_conditions, DEGRADED, False, "AsExpected", "", now)
    return status
