"""The roll's decisions (rolling.py), as scripts: pods observed at a time, the step taken."""

from __future__ import annotations

from dataclasses import replace

from octavo.operator.rolling import (
    ROLL_READY_TIMEOUT_S,
    ROLL_SETTLE_S,
    PodState,
    RollMemory,
    RollStep,
    decide_roll,
    restart_reason,
)

WHY = "bookie settings changed"


def pods(outdated: set[int], not_ready: set[int] = frozenset(), n: int = 4,  # type: ignore[assignment]
         deleting: set[int] = frozenset()) -> list[PodState]:  # type: ignore[assignment]
    return [PodState(f"c-{i}", i, "old" if i in outdated else "new", i not in not_ready, i not in not_ready,
                     i in deleting, WHY if i in outdated else "") for i in range(n)]


def step(now: float, observed: list[PodState], memory: RollMemory | None, underreplicated: int | None = 0,
         generation: int = 7, template_current: bool = True) -> RollStep:
    return decide_roll(now, generation=generation, template_current=template_current, replicas=4, pods=observed,
                       underreplicated=underreplicated, memory=memory)


def test_a_roll_restarts_one_bookie_at_a_time_waiting_for_it_to_serve_settle_and_no_underreplication() -> None:
    s = step(0, pods({0, 1, 2, 3}), None)
    assert s.delete == ("c-3",) and s.memory is not None and s.memory.bookies == 4
    assert [e.message for e in s.events] == [
        f"Rolling update started: 4 of 4 bookies to restart ({WHY}, generation 7)",
        f"Restarting bookie c-3: {WHY} (generation 7)"]
    memory: RollMemory | None = s.memory
    # c-3 is being deleted, then recreated and not yet ready: nothing else is restarted.
    for observed in (pods({0, 1, 2, 3}, deleting={3}), pods({0, 1, 2}, not_ready={3})):
        s = step(1, observed, memory)
        assert s.delete == () and s.waiting_for == "c-3 to serve" and s.progress.endswith("of 4 bookies updated")
        memory = s.memory
    s = step(2, pods({0, 1, 2}), memory)  # c-3 serves: its writers settle
    assert s.delete == () and s.waiting_for == "writers of c-3 to settle" and s.progress == "1 of 4 bookies updated"
    memory = s.memory
    s = step(2 + ROLL_SETTLE_S, pods({0, 1, 2}), memory, underreplicated=3)
    assert s.delete == () and s.waiting_for == "3 under-replicated ledgers to be re-replicated"
    s = step(2 + ROLL_SETTLE_S, pods({0, 1, 2}), s.memory, underreplicated=None)
    assert s.delete == () and "etcd could not be read" in s.waiting_for
    s = step(3 + ROLL_SETTLE_S, pods({0, 1, 2}), s.memory, underreplicated=0)
    assert s.delete == ("c-2",) and s.events[-1].message == f"Restarting bookie c-2: {WHY} (generation 7)"
    memory = s.memory
    for victim in (1, 0):
        left = set(range(victim + 1))
        memory = step(100, pods(left), memory).memory  # the previous one serves
        s = step(100 + ROLL_SETTLE_S, pods(left), memory)
        assert s.delete == (f"c-{victim}",), s
        memory = s.memory
    memory = step(200, pods(set()), memory).memory
    s = step(200 + ROLL_SETTLE_S, pods(set()), memory)
    assert s.completed and s.memory is None
    assert s.events[-1].message == f"Rolling update complete: 4 bookies in {200 + ROLL_SETTLE_S:.0f} s"
    assert step(300, pods(set()), None) == step(300, pods(set()), None) and step(300, pods(set()), None).memory is None


def test_nothing_happens_until_the_statefulset_controller_has_seen_the_template() -> None:
    s = step(0, pods(set()), None, template_current=False)
    assert s.delete == () and s.memory is None and "StatefulSet controller" in s.waiting_for


def test_another_bookie_that_does_not_serve_holds_the_roll() -> None:
    s = step(0, pods({3, 2}, not_ready={0}), RollMemory(7, 0, 2))
    assert s.delete == () and s.waiting_for == "c-0 to serve"


def test_a_restarted_bookie_not_ready_in_time_halts_the_roll_once_and_a_revert_resumes_it() -> None:
    memory = step(0, pods({2, 3}), None).memory
    assert memory is not None and memory.restarting == "c-3"
    broken = [replace(p, not_ready_cause="container exited 1: index_map_size_bytes ...") if p.name == "c-3" else p
              for p in pods({2}, not_ready={3})]
    s = step(ROLL_READY_TIMEOUT_S - 1, broken, memory)
    assert s.delete == () and not s.events and s.memory is not None and not s.memory.halted
    s = step(ROLL_READY_TIMEOUT_S + 1, broken, s.memory)
    assert s.delete == () and s.memory is not None and "c-3 was not Ready within 300 s" in s.memory.halted
    assert [(e.warning, e.reason) for e in s.events] == [(True, "RollingUpdateHalted")]
    assert "index_map_size_bytes" in s.events[0].message
    again = step(ROLL_READY_TIMEOUT_S + 50, broken, s.memory)
    assert again.events == () and again.delete == ()  # halted: said once, nothing more restarted
    # The spec is reverted: the template's revision is the old one again, so c-3 (not ready) is the outdated one.
    reverted = [PodState(f"c-{i}", i, "x", i != 3, i != 3, False, "bookie settings changed" if i == 3 else "")
                for i in range(4)]
    s = step(ROLL_READY_TIMEOUT_S + 60, reverted, again.memory, generation=8)
    assert s.delete == ("c-3",) and s.memory is not None and not s.memory.halted
    assert "not Ready and its template is outdated" in s.events[0].message


def test_a_memory_survives_the_status_and_garbage_is_forgotten() -> None:
    memory = RollMemory(7, 1.5, 4, "c-3", 2.0, 0.0, "")
    assert RollMemory.from_status(memory.to_status()) == memory
    assert RollMemory.from_status({"generation": "x"}) is None and RollMemory.from_status(None) is None


def test_restart_reason_names_what_changed() -> None:
    def pod(image: str, config: str, revision: str) -> dict:  # type: ignore[type-arg]
        return {"metadata": {"labels": {"controller-revision-hash": revision},
                             "annotations": {"octavo.io/config-hash": config}},
                "spec": {"containers": [{"image": image}]}}

    template = {"metadata": {"annotations": {"octavo.io/config-hash": "b"}}, "spec": {"containers": [{"image": "o:2"}]}}
    assert restart_reason(pod("o:2", "b", "r2"), template, "r2") == ""
    assert restart_reason(pod("o:1", "b", "r1"), template, "r2") == "image changed (o:1 -> o:2)"
    assert restart_reason(pod("o:2", "a", "r1"), template, "r2") == "bookie settings changed"
    assert restart_reason(pod("o:2", "b", "r1"), template, "r2") == "pod template changed"
