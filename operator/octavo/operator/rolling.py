"""Rolling a BookieCluster's pods, one bookie at a time, at the operator's pace. Pure: time comes in as `now_s`.

The StatefulSet's updateStrategy is OnDelete: Kubernetes replaces a pod with the current template only when it is
deleted, and the operator decides when. Between two restarts it waits until (Strimzi's and kaap's rule):
1. every pod of the cluster is Ready and its bookie answers (the restarted one included);
2. the restarted bookie has served for `ROLL_SETTLE_S`, so its writers' ensemble changes have settled;
3. etcd holds no under-replicated mark for the cluster.
Then it deletes the next outdated pod, highest ordinal first. A restarted bookie that is not Ready within
`ROLL_READY_TIMEOUT_S` halts the roll (nothing more is restarted; a Warning event names the cause). An outdated
pod that is not Ready is replaced at once, whatever the roll's state: it serves nothing, and this is how reverting
a bad spec resumes a halted roll (the reverted template makes the stuck pod outdated) without anyone deleting it.

The roll's memory lives in the BookieCluster's status (`status.roll`), so a restarted operator carries on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

# How long a restarted bookie has to become Ready (its pod's readiness probe: it serves) before the roll halts
# (the default of `octavo operator run --roll-ready-timeout-s`).
ROLL_READY_TIMEOUT_S = 300.0
# How long a restarted bookie serves before the next restart: writers that moved their ensembles off it while it
# stopped place new ledgers and ensemble changes on it again within this.
ROLL_SETTLE_S = 5.0
# Under-replicated marks the operator counts per poll (it needs to know only whether there are any).
ROLL_MARKS_READ_MAX = 1000


@dataclass(frozen=True)
class PodState:
    """One bookie pod as observed: its template revision, readiness, whether its bookie answers, and why it
    differs from the current template ("" when it does not)."""

    name: str
    ordinal: int
    revision: str
    ready: bool
    answers: bool
    deleting: bool = False
    restart_reason: str = ""
    not_ready_cause: str = ""


@dataclass(frozen=True)
class RollMemory:
    generation: int
    started_unix_s: float
    bookies: int                  # how many pods the roll restarts in all (for "2 of 4 bookies updated")
    restarting: str = ""          # the pod deleted last, until it has served ROLL_SETTLE_S ("" between steps)
    restarted_unix_s: float = 0.0
    serving_since_unix_s: float = 0.0
    halted: str = ""              # why the roll stopped ("" while it goes on)

    def to_status(self) -> dict[str, Any]:
        return {"generation": self.generation, "startedUnixS": self.started_unix_s, "bookies": self.bookies,
                "restarting": self.restarting, "restartedUnixS": self.restarted_unix_s,
                "servingSinceUnixS": self.serving_since_unix_s, "halted": self.halted}

    @staticmethod
    def from_status(raw: Any) -> RollMemory | None:
        """The memory kept in a status; None when there is none or it cannot be read (a roll then starts
        afresh, which is safe: it only ever restarts a pod when every pod serves)."""
        if not isinstance(raw, Mapping) or not raw:
            return None
        try:
            return RollMemory(int(raw["generation"]), float(raw["startedUnixS"]), int(raw["bookies"]),
                              str(raw.get("restarting") or ""), float(raw.get("restartedUnixS") or 0),
                              float(raw.get("servingSinceUnixS") or 0), str(raw.get("halted") or ""))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class RollEvent:
    warning: bool
    reason: str
    message: str


@dataclass(frozen=True)
class RollStep:
    """What to do now: the pods to delete, the memory to keep (None: no roll), the progress in words, the events."""

    memory: RollMemory | None
    delete: tuple[str, ...] = ()
    progress: str = ""
    waiting_for: str = ""
    events: tuple[RollEvent, ...] = field(default_factory=tuple)
    completed: bool = False


def decide_roll(now_s: float, *, generation: int, template_current: bool, replicas: int,
                pods: Sequence[PodState], underreplicated: int | None, memory: RollMemory | None,
                ready_timeout_s: float = ROLL_READY_TIMEOUT_S) -> RollStep:
    """The next step of a roll. `template_current`: the StatefulSet controller has seen the latest template (its
    status.observedGeneration is its generation), so pods' revisions can be compared with it. `underreplicated`:
    the cluster's under-replicated marks (None: could not be read, which counts as not yet safe)."""
    if not template_current:
        return RollStep(memory, progress=_progress(memory, pods), waiting_for="the StatefulSet controller to "
                        "see the new template")
    outdated = sorted((p for p in pods if p.restart_reason and not p.deleting), key=lambda p: -p.ordinal)
    events: list[RollEvent] = []
    if memory is None:
        if not outdated:
            return RollStep(None)
        memory = RollMemory(generation, now_s, len(outdated))
        events.append(RollEvent(False, "RollingUpdate", f"Rolling update started: {len(outdated)} of {replicas} "
                                f"bookies to restart ({outdated[0].restart_reason}, generation {generation})"))
    elif generation != memory.generation:
        # A new spec during a roll (another change, or the revert of a bad one): the same roll goes on towards it.
        memory = replace(memory, generation=generation, bookies=max(memory.bookies, len(outdated)), halted="")
    # An outdated pod that does not serve is replaced now: nothing is lost, and a revert un-sticks a halted roll.
    stuck = tuple(p.name for p in outdated if not p.ready)
    if stuck:
        for name in stuck:
            reason = next(p.restart_reason for p in outdated if p.name == name)
            events.append(RollEvent(False, "RollingUpdate", f"Restarting bookie {name}: it is not Ready and its "
                                    f"template is outdated ({reason}, generation {generation})"))
        memory = replace(memory, restarting=stuck[0], restarted_unix_s=now_s, serving_since_unix_s=0.0, halted="")
        return RollStep(memory, stuck, _progress(memory, pods), f"{', '.join(stuck)} to serve",
                        tuple(events))
    by_name = {p.name: p for p in pods}
    if memory.restarting:
        pod = by_name.get(memory.restarting)
        serving = pod is not None and not pod.deleting and not pod.restart_reason and pod.ready and pod.answers
        if not serving:
            waited = now_s - memory.restarted_unix_s
            if waited > ready_timeout_s and not memory.halted:
                cause = (pod.not_ready_cause if pod is not None and pod.not_ready_cause else
                         "its pod does not exist" if pod is None else "its readiness probe fails")
                memory = replace(memory, halted=f"bookie {memory.restarting} was not Ready within "
                                 f"{ready_timeout_s:.0f} s of its restart: {cause}")
                events.append(RollEvent(True, "RollingUpdateHalted", f"Rolling update halted: {memory.halted}; "
                                        "fix the spec (reverting it resumes the roll)"))
            return RollStep(memory, (), _progress(memory, pods), f"{memory.restarting} to serve", tuple(events))
        if memory.serving_since_unix_s == 0.0:
            memory = replace(memory, serving_since_unix_s=now_s, halted="")
        if now_s - memory.serving_since_unix_s < ROLL_SETTLE_S:
            return RollStep(memory, (), _progress(memory, pods), f"writers of {memory.restarting} to settle",
                            tuple(events))
        memory = replace(memory, restarting="", restarted_unix_s=0.0, serving_since_unix_s=0.0)
    not_serving = sorted(p.name for p in pods if p.deleting or not p.ready or not p.answers)
    missing = replicas - len(pods)
    if not_serving or missing > 0:
        what = ", ".join(not_serving) if not_serving else f"{missing} pods to be created"
        return RollStep(memory, (), _progress(memory, pods), f"{what} to serve", tuple(events))
    if underreplicated is None or underreplicated > 0:
        what = ("the count of under-replicated ledgers (etcd could not be read)" if underreplicated is None else
                f"{underreplicated} under-replicated ledgers to be re-replicated")
        return RollStep(memory, (), _progress(memory, pods), what, tuple(events))
    if not outdated:
        took = now_s - memory.started_unix_s
        events.append(RollEvent(False, "RollingUpdateComplete",
                                f"Rolling update complete: {memory.bookies} bookies in {took:.0f} s"))
        return RollStep(None, (), "", "", tuple(events), completed=True)
    victim = outdated[0]
    events.append(RollEvent(False, "RollingUpdate", f"Restarting bookie {victim.name}: {victim.restart_reason} "
                            f"(generation {generation})"))
    memory = replace(memory, restarting=victim.name, restarted_unix_s=now_s, serving_since_unix_s=0.0)
    return RollStep(memory, (victim.name,), _progress(memory, pods), f"{victim.name} to serve",
                    tuple(events))


def _progress(memory: RollMemory | None, pods: Sequence[PodState]) -> str:
    """"k of n bookies updated": n the pods the roll restarts, k those no longer on an outdated template."""
    if memory is None:
        return ""
    left = sum(1 for p in pods if p.restart_reason)
    return f"{max(0, memory.bookies - left)} of {memory.bookies} bookies updated"


def restart_reason(pod: Mapping[str, Any], template: Mapping[str, Any], update_revision: str) -> str:
    """Why a pod must be restarted to match the StatefulSet's template ("" when it matches), in words."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if not update_revision or labels.get("controller-revision-hash") == update_revision:
        return ""
    pod_spec = pod.get("spec") or {}
    want_spec = template.get("spec") or {}
    image = next((c.get("image") for c in pod_spec.get("containers") or []), "")
    want_image = next((c.get("image") for c in want_spec.get("containers") or []), "")
    reasons = []
    if image != want_image:
        reasons.append(f"image changed ({image} -> {want_image})")
    hash_key = "octavo.io/config-hash"
    if ((pod.get("metadata") or {}).get("annotations") or {}).get(hash_key) != \
            ((template.get("metadata") or {}).get("annotations") or {}).get(hash_key):
        reasons.append("bookie settings changed")
    return " and ".join(reasons) or "pod template changed"


def pod_state(pod: Mapping[str, Any], template: Mapping[str, Any], update_revision: str, answers: bool) -> PodState:
    """A pod of the StatefulSet as the roll sees it; `answers`: whether its bookie answered the operator."""
    meta = pod.get("metadata") or {}
    pod_status = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in pod_status.get("conditions") or [])
    return PodState(meta["name"], int(meta["name"].rsplit("-", 1)[1]), str(
        (meta.get("labels") or {}).get("controller-revision-hash") or ""), ready, answers,
        bool(meta.get("deletionTimestamp")), restart_reason(pod, template, update_revision), not_ready_cause(pod))


def not_ready_cause(pod: Mapping[str, Any]) -> str:
    """Why a pod's container does not serve, from its container status (the last exit, a waiting reason)."""
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        state = c.get("state") or {}
        last = (c.get("lastState") or {}).get("terminated") or {}
        waiting = state.get("waiting") or {}
        if last:
            return (f"its container exited with code {last.get('exitCode')} ({last.get('reason') or 'Error'})"
                    f"{': ' + str(last.get('message'))[-300:] if last.get('message') else ''}, "
                    f"restarted {c.get('restartCount', 0)} times")
        if waiting:
            return f"its container is waiting: {waiting.get('reason')} {waiting.get('message') or ''}".strip()
    return ""
