"""Invariants checked in code and kept on in production: Python drops `assert` under -O, so a condition that
guards data is checked with `check()`, which raises InvariantError (a bug in the bookie, never a user's error).
Checks on per-entry paths must stay O(1); build a costly message only after the condition failed."""

from __future__ import annotations


class InvariantError(RuntimeError):
    """A condition the bookie's own code guarantees did not hold: the operation stops before it can do harm."""


def check(condition: bool, message: str) -> None:
    """Raise InvariantError(message) unless `condition` holds."""
    if not condition:
        raise InvariantError(message)
