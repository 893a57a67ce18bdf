"""Small state files replaced atomically: the recovery point and the bookie's own record of itself.

Both are JSON with a crc32c over the canonical body, written with FileIO.write_file_atomic (write, fsync,
rename, fsync the directory). A file that fails its checksum is reported, never trusted.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import crc32c

from octavo.node.fileio import FileIO
from octavo.node.files import NODE_STATE_FILE, RECOVERY_POINT_FILE
from octavo.node.recoverypoint import RecoveryPoint

# Present while a bookie runs on the directory; found at startup, it means the last stop was unclean.
CHECKPOINT_FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A state file exists but is not valid."""


def _encode(body: dict[str, Any]) -> bytes:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return json.dumps({"body": body, "crc32c": crc32c.crc32c(canonical.encode())}, sort_keys=True).encode()


def _decode(data: bytes, what: str) -> dict[str, Any]:
    try:
        outer = json.loads(data)
        body = outer["body"]
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
        ok = crc32c.crc32c(canonical.encode()) == outer["crc32c"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{what} is not valid JSON of the expected shape: {e}") from e
    if not ok:
        raise CheckpointError(f"{what} failed its checksum")
    if body.get("version") != CHECKPOINT_FORMAT_VERSION:
        raise CheckpointError(f"{what} has unsupported version {body.get('version')!r}")
    return dict(body)


def read_recovery_point(io: FileIO, data_dir: str) -> RecoveryPoint | None:
    """The last recovery point written, or None for a fresh directory. CheckpointError if corrupt."""
    raw = io.read_file(os.path.join(data_dir, RECOVERY_POINT_FILE))
    if raw is None:
        return None
    body = _decode(raw, RECOVERY_POINT_FILE)
    log_id = body.get("recovery_point_log_id")
    if not isinstance(log_id, int) or log_id < 0:
        raise CheckpointError(f"{RECOVERY_POINT_FILE} holds an invalid log id {log_id!r}")
    return RecoveryPoint(log_id)


def write_recovery_point(io: FileIO, data_dir: str, point: RecoveryPoint) -> None:
    body = {"version": CHECKPOINT_FORMAT_VERSION, "recovery_point_log_id": point.log_id}
    io.write_file_atomic(os.path.join(data_dir, RECOVERY_POINT_FILE), _encode(body))


@dataclass
class NodeState:
    """What the bookie remembers about itself across restarts."""

    # Made once per data directory; the cookie in etcd holds the same id, so a wiped or swapped directory
    # is noticed.
    instance_id: str
    created_unix_ms: int
    unclean_restart_count: int = 0
    last_unclean_restart_unix_ms: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def read_node_state(io: FileIO, data_dir: str) -> NodeState | None:
    raw = io.read_file(os.path.join(data_dir, NODE_STATE_FILE))
    if raw is None:
        return None
    body = _decode(raw, NODE_STATE_FILE)
    body.pop("version")
    try:
        return NodeState(**body)
    except TypeError as e:
        raise CheckpointError(f"{NODE_STATE_FILE} has unexpected fields: {e}") from e


def write_node_state(io: FileIO, data_dir: str, state: NodeState) -> None:
    body = {"version": CHECKPOINT_FORMAT_VERSION, **asdict(state)}
    io.write_file_atomic(os.path.join(data_dir, NODE_STATE_FILE), _encode(body))
