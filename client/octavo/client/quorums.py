"""The client's quorum decisions, pure (no IO, no clock): which entries a writer may acknowledge, whether a
recovery open has fenced enough bookies, and what recovery makes of each entry's answers. The write handle
and recovery open do the IO around them; client/tests/test_quorums.py drives them with tables of events.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from octavo.meta.ledger_metadata import write_set


class AckMarks:
    """Acknowledgement by marks, one per bookie of the last ensemble: the highest entry id the bookie stored
    with every entry of its write sets before it (a bookie answers its requests in order, so one number per
    bookie is enough). An entry is acknowledged once Qa bookies of its write set have marks at or past it and
    every entry before it is acknowledged. A bookie that failed gets no further marks: a later answer on a new
    stream must not vouch for the failed request's entries."""

    def __init__(self, ensemble: Sequence[str]) -> None:
        self.marks: dict[str, int] = dict.fromkeys(ensemble, -1)
        self.dead: set[str] = set()

    def stored(self, bookie: str, last_entry_id: int) -> bool:
        """A bookie stored entries up to `last_entry_id`; True if its mark moved."""
        mark = self.marks.get(bookie)
        if mark is None or last_entry_id <= mark or bookie in self.dead:
            return False
        self.marks[bookie] = last_entry_id
        return True

    def failed(self, bookie: str) -> None:
        self.dead.add(bookie)

    def replaced(self, failed: str, replacement: str, last_add_confirmed: int) -> None:
        """A new segment from LAC + 1 has `replacement` in `failed`'s place: it holds nothing past the LAC. A
        replacement that failed before (taken back after its quarantine) starts afresh: the writer counts only
        answers to what it sends from now on."""
        self.marks.pop(failed, None)
        self.dead.discard(replacement)
        self.marks[replacement] = last_add_confirmed

    def acknowledged_up_to(self, lac: int, sent_to: int, ensemble: Sequence[str], write_quorum: int,
                           ack_quorum: int) -> int:
        """The highest entry id below `sent_to` that is acknowledged (at least `lac`). Entries past the LAC are
        all in the last segment, whose ensemble is `ensemble`."""
        marks = self.marks
        size = len(ensemble)
        if write_quorum == size:  # every bookie stores every entry: the Qa-th highest mark
            top = sorted(marks.values())[-ack_quorum] if len(marks) >= ack_quorum else -1
            return max(lac, min(top, sent_to - 1))
        top = lac
        while top + 1 < sent_to:
            e = top + 1
            held = sum(1 for p in write_set(e, size, write_quorum) if marks.get(ensemble[p], -1) >= e)
            if held < ack_quorum:
                break
            top = e
        return top


def fence_coverage_ok(ensemble: Sequence[str], write_quorum: int, ack_quorum: int, fenced: set[str]) -> bool:
    """Every write quorum of the ensemble has at least (Qw - Qa) + 1 fenced bookies: then no ack quorum of the
    old writer can complete any more."""
    need = write_quorum - ack_quorum + 1
    size = len(ensemble)
    return all(len({ensemble[p] for p in write_set(start, size, write_quorum)} & fenced) >= need
               for start in range(size))


class Answer(Enum):
    """One bookie's answer about one entry during recovery."""

    HAS = "has it"
    HAS_NOT = "says it does not have it"   # NO_SUCH_ENTRY or NO_SUCH_LEDGER
    CUT_SHORT = "read limit cut the reply"  # asked, not returned: ask again in the next window
    UNKNOWN = "cannot tell"                 # unreachable, UNKNOWN, corrupt, another error


class Verdict(Enum):
    FOUND = "found"          # re-replicate it and go on
    RETRY = "retry"          # ask again from this entry in the next window
    END = "end"              # the ledger ends before this entry
    UNDECIDED = "undecided"  # recovery must fail: closing here could lose an acknowledged entry


@dataclass(frozen=True)
class EntryAnswers:
    """The answers of an entry's write set, in write-set order, and which of those bookies may have lost
    their unsynced tail (their "do not have" never counts)."""

    answers: tuple[Answer, ...]
    suspect: tuple[bool, ...]


def recovery_verdict(entry: EntryAnswers, write_quorum: int, ack_quorum: int) -> Verdict:
    """What recovery open makes of one entry past the LAC: found on any bookie of its write set, it is kept;
    an entry (Qw - Qa) + 1 trustworthy bookies deny cannot have been acknowledged, so the ledger ends before
    it; anything less cannot decide, and recovery must not guess."""
    if Answer.HAS in entry.answers:
        return Verdict.FOUND
    if Answer.CUT_SHORT in entry.answers:
        return Verdict.RETRY
    denials = sum(1 for a, s in zip(entry.answers, entry.suspect, strict=True) if a is Answer.HAS_NOT and not s)
    return Verdict.END if denials >= write_quorum - ack_quorum + 1 else Verdict.UNDECIDED
