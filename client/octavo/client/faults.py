"""Named fault points in the client: places where a test can make a writer's process die with SIGKILL, as a
crashed application would, to test what readers and recovery opens make of what it left behind.

Off unless the environment variable OCTAVO_CLIENT_FAULT_POINTS names them (comma-separated `name` or `name@N` to
die on the N-th hit), read once at import, as the bookie's OCTAVO_FAULT_POINTS (octavo.node.faults). A variable
of its own: a process that runs bookies and clients together must not have a bookie's point refused as unknown
here, nor the other way round. Applications never set it; `hit()` then costs one dict lookup.
"""

from __future__ import annotations

from octavo.meta.faultpoints import FaultPoints

CLIENT_FAULT_POINTS_ENV = "OCTAVO_CLIENT_FAULT_POINTS"

# The writer's ensemble change, after the CAS that put the new segment in etcd and before the entries past the
# LAC are sent to the replacement bookie: the replacement then holds none of them.
ENSEMBLE_CHANGE_AFTER_SEGMENT_CAS = "ensemble_change.after_segment_cas"
# Every point the code knows, so a test cannot name one that does not exist.
KNOWN_POINTS = frozenset({ENSEMBLE_CHANGE_AFTER_SEGMENT_CAS})


_points = FaultPoints(KNOWN_POINTS, CLIENT_FAULT_POINTS_ENV, "client fault point")
parse = _points.parse
hit = _points.hit
arm = _points.arm
