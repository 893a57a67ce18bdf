"""The BookieCluster status built from observations and decisions; the operator's memory survives a round trip
through it (a restarted operator carries on)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from octavo.meta.etcd import EtcdStatus
from octavo.meta.etcdhealth import ETCD_RECOVERY_DOC, EtcdHealth, etcd_health
from octavo.operator.policy import Memory, Observed, Policy, Shape, decide
from octavo.operator.status import (
    COMPACTION_WINDOW_OPEN,
    CONDITION_TYPES,
    DEGRADED,
    DISK_PRESSURE,
    ETCD_HEALTHY,
    PROGRESSING,
    READY,
    SCALE_DOWN_FIELD,
    SPEC_ERROR_FIELD,
    cluster_status,
    memory_from_status,
    memory_to_status,
)
from octavo.operator.windows import Window

NOW = datetime(2026, 5, 4, 2, 10, tzinfo=UTC)
POLICY = Policy(windows=(Window("0 2 * * *", 3600, "UTC"),))
SHAPE = Shape(replicas=4, min_writable=3)


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


MiB = 1 << 20
ETCD_OK = etcd_health(EtcdStatus(revision=9, db_size_bytes=40 * MiB, db_size_in_use_bytes=30 * MiB, alarms=()))


def build(bookies: list[Observed], old: dict[str, Any] | None = None, now: datetime = NOW,
          spec_error: str = "", ready: int = 4, etcd: EtcdHealth | None = ETCD_OK,
          etcd_error: str = "", reach_problem: str = "", scale_down: str = "") -> dict[str, Any]:
    decision = None if spec_error else decide(now, POLICY, SHAPE, bookies, memory_from_status(old))
    return cluster_status(now, generation=3, replicas=4, ready_replicas=ready, selector="app=x", bookies=bookies,
                          pods={b.bookie_id: b.bookie_id for b in bookies}, decision=decision,
                          spec_error=spec_error, old=old, etcd=None if spec_error else etcd, etcd_error=etcd_error,
                          reach_problem=reach_problem, scale_down=scale_down)


def test_a_healthy_cluster_in_its_window() -> None:
    bookies = [Observed(f"logs-{i}", disk_usage_ratio=0.2 + i / 10) for i in range(4)]
    status = build(bookies)
    c = conditions(status)
    assert list(c) == list(CONDITION_TYPES)
    assert c[READY]["status"] == "True" and c[DEGRADED]["status"] == "False"
    assert c[COMPACTION_WINDOW_OPEN]["status"] == "True" and "open until 2026-05-04T03:00:00Z" in \
        c[COMPACTION_WINDOW_OPEN]["message"]
    assert status["writableBookies"] == 4 and status["diskUsageMax"] == "50%"
    assert status["observedGeneration"] == 3 and [b["id"] for b in status["bookies"]] == [f"logs-{i}" for i in range(4)]
    assert c[ETCD_HEALTHY]["status"] == "True" and c[ETCD_HEALTHY]["reason"] == "EtcdHealthy"
    assert status["etcd"] == {"dbSizeBytes": 40 * MiB, "dbSizeInUseBytes": 30 * MiB, "quotaBytes": 2 << 30,
                              "quotaSource": "setting", "dbSizeRatio": "2%", "alarms": [], "refusesWrites": False,
                              "error": ""}


def test_an_etcd_that_refuses_writes_is_loud_in_the_conditions() -> None:
    bookies = [Observed(f"logs-{i}", disk_usage_ratio=0.2) for i in range(4)]
    first = build(bookies)
    full = etcd_health(EtcdStatus(9, 100 * MiB, 90 * MiB, ("NOSPACE",)), 100 * MiB)
    later = NOW + timedelta(minutes=1)
    status = build(bookies, old=first, now=later, etcd=full)
    c = conditions(status)
    assert c[ETCD_HEALTHY]["status"] == "False" and c[ETCD_HEALTHY]["reason"] == "EtcdNoSpace"
    assert c[ETCD_HEALTHY]["message"].startswith("etcd REFUSES WRITES: its NOSPACE alarm is raised")
    assert ETCD_RECOVERY_DOC in c[ETCD_HEALTHY]["message"] and "100.0 MiB quota (100%" in c[ETCD_HEALTHY]["message"]
    assert c[ETCD_HEALTHY]["lastTransitionTime"] == "2026-05-04T02:11:00Z"
    assert c[DEGRADED]["status"] == "True" and c[DEGRADED]["reason"] == "EtcdRefusesWrites"
    assert "no ledger can be created" in c[DEGRADED]["message"]
    assert c[READY]["status"] == "True"  # the bookies are fine: reads and open ledgers' adds go on
    assert status["etcd"]["refusesWrites"] is True and status["etcd"]["alarms"] == ["NOSPACE"]
    assert status["etcd"]["dbSizeRatio"] == "100%"
    # With a bookie down too, both causes are in the message.
    bookies[2] = replace(bookies[2], reachable=False)
    both = conditions(build(bookies, old=status, etcd=full, ready=3))[DEGRADED]
    assert both["reason"] == "EtcdRefusesWrites" and "not answering: logs-2" in both["message"]


def test_etcd_near_its_quota_unreachable_or_not_asked() -> None:
    bookies = [Observed("logs-0")]
    near = etcd_health(EtcdStatus(9, 85 * MiB, 20 * MiB, (), db_size_quota_bytes=100 * MiB), 8 << 30)
    status = build(bookies, etcd=near)
    c = conditions(status)
    assert c[ETCD_HEALTHY]["status"] == "False" and c[ETCD_HEALTHY]["reason"] == "EtcdNearQuota"
    assert c[DEGRADED]["reason"] != "EtcdRefusesWrites"
    assert status["etcd"]["quotaSource"] == "etcd" and status["etcd"]["quotaBytes"] == 100 * MiB
    down = build(bookies, old=status, etcd=None, etcd_error="cannot read etcd's status: etcd unreachable")
    assert conditions(down)[ETCD_HEALTHY]["reason"] == "EtcdUnreachable"
    assert down["etcd"] == {"error": "cannot read etcd's status: etcd unreachable"}
    invalid = build(bookies, old=status, spec_error="spec.replicas: no")
    assert conditions(invalid)[ETCD_HEALTHY]["status"] == "Unknown"
    assert invalid["etcd"] == status["etcd"]  # the last reading stays


def test_pressure_a_missing_bookie_and_the_transition_times() -> None:
    bookies = [Observed(f"logs-{i}", disk_usage_ratio=0.2) for i in range(4)]
    first = build(bookies)
    bookies[1] = replace(bookies[1], disk_usage_ratio=0.93)
    bookies[3] = replace(bookies[3], reachable=False)
    later = NOW + timedelta(minutes=5)
    status = build(bookies, old=first, now=later, ready=3)
    c = conditions(status)
    assert c[READY]["status"] == "False" and c[READY]["lastTransitionTime"] == "2026-05-04T02:15:00Z"
    assert c[DEGRADED]["message"] == "not answering: logs-3"
    assert c[DISK_PRESSURE]["status"] == "True" and "logs-1" in c[DISK_PRESSURE]["message"]
    # A condition whose status did not change keeps its time.
    assert c[COMPACTION_WINDOW_OPEN]["lastTransitionTime"] == conditions(first)[COMPACTION_WINDOW_OPEN][
        "lastTransitionTime"]
    entry = {b["id"]: b for b in status["bookies"]}
    assert entry["logs-3"]["mode"] == "unknown" and entry["logs-1"]["mode"] == "writable"


def test_an_invalid_spec_is_degraded_with_its_message_and_keeps_the_memory() -> None:
    old = {"memory": memory_to_status(Memory(forced_by_operator=frozenset({"logs-0"})))}
    status = build([Observed("logs-0")], old=old, spec_error="spec.replicas must be an integer, got '3'")
    c = conditions(status)
    assert c[DEGRADED]["reason"] == "InvalidSpec" and "spec.replicas" in c[DEGRADED]["message"]
    assert status["memory"] == old["memory"]


def test_a_reach_problem_makes_the_cluster_degraded_whatever_else_holds_and_keeps_its_transition_time() -> None:
    bookies = [Observed(f"logs-{i}") for i in range(4)]
    problem = "spec.tls is set but the operator has no certificate to reach TLS bookies"
    healthy = conditions(build(bookies))[DEGRADED]
    assert (healthy["status"], healthy["reason"]) == ("False", "AsExpected")
    first = build(bookies, reach_problem=problem)
    c = conditions(first)[DEGRADED]
    assert (c["status"], c["reason"], c["message"]) == ("True", "OperatorCannotReachBookies", problem)
    # It wins over bookies not answering and an invalid spec: without a way to reach them, it is what to fix first.
    for status in (build([*bookies[:3], Observed("logs-3", reachable=False)], reach_problem=problem),
                   build(bookies, spec_error="spec.replicas: no", reach_problem=problem)):
        assert conditions(status)[DEGRADED]["reason"] == "OperatorCannotReachBookies"
    # Still True an hour later: its transition time stays; fixed, the condition turns False at once.
    later = build(bookies, old=first, now=NOW + timedelta(hours=1), reach_problem=problem)
    assert conditions(later)[DEGRADED]["lastTransitionTime"] == "2026-05-04T02:10:00Z"
    fixed = build(bookies, old=later, now=NOW + timedelta(hours=2))
    assert conditions(fixed)[DEGRADED]["status"] == "False"
    assert conditions(fixed)[DEGRADED]["lastTransitionTime"] == "2026-05-04T04:10:00Z"


def test_a_scale_down_shows_in_progressing_and_its_field_which_goes_when_it_ends() -> None:
    from octavo.operator.status import merge_patch

    bookies = [Observed(f"logs-{i}") for i in range(4)]
    stable = build(bookies)
    assert SCALE_DOWN_FIELD not in stable and conditions(stable)[PROGRESSING]["reason"] == "Stable"
    message = "decommissioning logs-4 (5 -> 4 bookies)"
    scaling = build(bookies, old=stable, scale_down=message)
    c = conditions(scaling)[PROGRESSING]
    assert (c["status"], c["reason"], c["message"]) == ("True", "ScalingDown", message)
    assert scaling[SCALE_DOWN_FIELD] == message and scaling[SPEC_ERROR_FIELD] == ""
    # Pods still starting do not hide the scale-down.
    assert conditions(build(bookies, ready=2, scale_down=message))[PROGRESSING]["reason"] == "ScalingDown"
    done = build(bookies, old=scaling)
    assert conditions(done)[PROGRESSING]["status"] == "False"
    # The status is merge-patched: the field is removed, not left saying the last step.
    assert merge_patch(scaling, done)[SCALE_DOWN_FIELD] is None


ids = st.sampled_from([f"logs-{i}" for i in range(5)])


@given(forced=st.frozensets(ids), opened=st.dictionaries(ids, st.integers(0, 2**45)),
       compacted=st.dictionaries(ids, st.integers(0, 2**45)), emergency=st.dictionaries(ids, st.integers(0, 2**45)))
def test_the_memory_round_trips_through_the_status(forced: frozenset[str], opened: dict[str, int],
                                                   compacted: dict[str, int], emergency: dict[str, int]) -> None:
    memory = Memory(forced, opened, compacted, emergency)
    assert memory_from_status({"memory": memory_to_status(memory)}) == memory


def test_an_unreadable_memory_is_forgotten_not_fatal() -> None:
    assert memory_from_status({"memory": {"forcedByOperator": [1, "logs-1"], "windowOpenedUnixMs": "junk"}}) == \
        Memory(forced_by_operator=frozenset({"logs-1"}))
    assert memory_from_status(None) == Memory()


def _unknown_fields(value: Any, schema: dict[str, Any], where: str) -> list[str]:
    """Fields of `value` the schema does not declare (a real API server prunes them from the status)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        return [f for k, v in value.items()
                for f in ([f"{where}.{k}"] if k not in props else _unknown_fields(v, props[k], f"{where}.{k}"))]
    if isinstance(value, list):
        return [f for i, v in enumerate(value) for f in _unknown_fields(v, schema.get("items") or {}, f"{where}[{i}]")]
    return []


def test_every_status_field_the_operator_writes_is_in_the_crd() -> None:
    """Every field the operator writes into a status is declared in its CRD, so a real API server keeps it."""
    import yaml

    crds = Path(__file__).resolve().parents[2] / "charts" / "octavo" / "crds"
    version = yaml.safe_load((crds / "bookieclusters.octavo.io.yaml").read_text())["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    bookies = [Observed("logs-0", disk_usage_ratio=0.95), Observed("logs-1", reachable=False),
               Observed("logs-2", window_until_unix_ms=1, last_compaction_unix_ms=5)]
    for status in (build(bookies), build(bookies, spec_error="spec.replicas: no"),
                   build(bookies, etcd=None, etcd_error="unreachable"),
                   build(bookies, scale_down="decommissioning logs-3", reach_problem="no certificate")):
        assert status[SPEC_ERROR_FIELD] is not None
        assert _unknown_fields(status, schema, "status") == []
    assert _unknown_fields({"bookies": [{"nope": 1}]}, schema, "status") == ["status.bookies[0].nope"]
    kinds = schema["properties"]["conditions"]["items"]["properties"]["type"]["enum"]
    assert kinds == list(CONDITION_TYPES)


def test_during_a_scale_down_ready_counts_the_bookies_observed_never_3_of_2() -> None:
    """Issue 29: Ready said "3 of 2 bookies answer" while the third was decommissioned."""
    bookies = [Observed(f"logs-{i}") for i in range(3)]
    status = cluster_status(NOW, generation=2, replicas=2, ready_replicas=3, selector="s", bookies=bookies,
                            pods={}, decision=decide(NOW, POLICY, Shape(3, 2), bookies, Memory()), spec_error="",
                            old=None)
    ready = conditions(status)[READY]
    assert ready["message"] == "3 of 3 bookies answer (1 being removed), 3 pods ready", ready


def test_a_roll_shows_progress_keeps_the_generation_and_is_not_degraded_by_its_restart() -> None:
    from octavo.operator.status import with_roll

    old = {"observedGeneration": 6}
    bookies = [Observed("logs-0"), Observed("logs-1", reachable=False), Observed("logs-2")]

    def fresh() -> dict[str, Any]:
        return cluster_status(NOW, generation=7, replicas=3, ready_replicas=2, selector="s", bookies=bookies,
                              pods={}, decision=decide(NOW, POLICY, Shape(3, 3), bookies, Memory()), spec_error="",
                              old=old)

    new = fresh()
    assert conditions(new)[DEGRADED]["reason"] == "BookiesNotAnswering"
    rolled = with_roll(new, old, progress="1 of 3 bookies updated", waiting_for="logs-1 to serve", halted="",
                       restarting="logs-1", roll={"generation": 7}, now=NOW)
    c = conditions(rolled)
    assert (c[PROGRESSING]["status"], c[PROGRESSING]["reason"], c[PROGRESSING]["message"]) == (
        "True", "RollingUpdate", "1 of 3 bookies updated; waiting for logs-1 to serve")
    assert c[DEGRADED]["status"] == "False" and rolled["observedGeneration"] == 6 and rolled["roll"] == {
        "generation": 7}
    halted = with_roll(fresh(), old, progress="1 of 3",
                       waiting_for="logs-1 to serve", halted="bookie logs-1 was not Ready within 300 s",
                       restarting="logs-1", roll={"generation": 7}, now=NOW)
    assert conditions(halted)[DEGRADED]["reason"] == "RollingUpdateHalted"
    done = with_roll(fresh(), old, progress="", waiting_for="", halted="", restarting="", roll=None, now=NOW)
    assert done["observedGeneration"] == 7 and "roll" not in done
    # A status that never showed a generation shows none while the roll goes on, not the one being rolled out.
    first = with_roll(fresh(), {}, progress="0 of 3 bookies updated", waiting_for="logs-2 to serve", halted="",
                      restarting="logs-2", roll={"generation": 7}, now=NOW)
    assert "observedGeneration" not in first and first["roll"] == {"generation": 7}
