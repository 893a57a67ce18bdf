"""The planted bugs (sim/planted/*.patch, `make sim-planted`) still apply to the code, so they do not rot: a
change to the lines one of them edits makes this fail, and the patch is made again on the new code."""

from __future__ import annotations

import pytest

from octavo.sim.planted import check_applies, patches


def test_there_are_three_planted_bugs() -> None:
    assert len(patches()) == 3


@pytest.mark.parametrize("patch", patches(), ids=lambda p: p.stem)
def test_planted_bug_applies_to_head(patch) -> None:  # type: ignore[no-untyped-def]
    assert "PLANTED BUG" in patch.read_text()
    assert check_applies(patch) == ""
