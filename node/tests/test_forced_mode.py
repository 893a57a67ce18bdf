"""Who forced a bookie read-only and at what disk usage share: kept with the forced mode (across restarts), shown
by every status, limited in size, and read from node states written before it was kept."""

from __future__ import annotations

import math
from pathlib import Path

import grpc
import pytest

from octavo.node.checkpoint import read_node_state, write_node_state
from octavo.node.disk import FORCED_REASON_MAX_CHARS, STATE_FORCED_REASON, STATE_FORCED_THRESHOLD, DiskMonitor
from octavo.node.storage import Storage
from octavo.node.testing import BookieConnection, BookieProcess, small_config
from octavo.v1 import bookie_pb2 as pb

BY_OPERATOR = "the operator: disk usage 91.0% reached readOnlyRatio 90%"


def test_the_reason_and_threshold_survive_a_restart_and_go_with_the_release(tmp_path: Path) -> None:
    cfg = small_config(tmp_path / "b")
    s = Storage.open(cfg)
    DiskMonitor(s).set_forced(True, BY_OPERATOR, 0.9)
    s.close()
    s = Storage.open(cfg)
    try:
        monitor = DiskMonitor(s)
        monitor.check()
        assert monitor.read_only and monitor.forced_reason == BY_OPERATOR and monitor.forced_threshold_ratio == 0.9
        assert monitor.reason().startswith(f"read-only: forced by {BY_OPERATOR} (release with")
        monitor.set_forced(False)
        assert (monitor.forced_reason, monitor.forced_threshold_ratio) == ("", 0.0) and not monitor.read_only
    finally:
        s.close()
    s = Storage.open(cfg)
    try:
        assert DiskMonitor(s).forced_reason == ""  # the release was persisted too
    finally:
        s.close()


def test_a_node_state_from_before_the_reason_was_kept_reads_as_forced_by_an_administrator(tmp_path: Path) -> None:
    cfg = small_config(tmp_path / "b")
    s = Storage.open(cfg)
    DiskMonitor(s).set_forced(True, BY_OPERATOR, 0.9)
    s.close()
    # Rewrite the state as the previous release wrote it: the forced flag only.
    state = read_node_state(s.io, cfg.data_dir)
    assert state is not None
    del state.extra[STATE_FORCED_REASON], state.extra[STATE_FORCED_THRESHOLD]
    write_node_state(s.io, cfg.data_dir, state)
    s = Storage.open(cfg)
    try:
        monitor = DiskMonitor(s)
        assert monitor.read_only and monitor.forced_reason == "" and monitor.forced_threshold_ratio == 0.0
        assert monitor.reason().startswith("read-only: forced by an administrator")
    finally:
        s.close()


def test_set_read_only_refuses_an_oversized_reason_or_a_threshold_outside_0_1(tmp_path: Path) -> None:
    bookie = BookieProcess(str(tmp_path / "b"))
    address = bookie.start()
    try:
        with BookieConnection(address) as conn:
            for bad in (pb.SetReadOnlyRequest(read_only=True, reason="x" * (FORCED_REASON_MAX_CHARS + 1)),
                        pb.SetReadOnlyRequest(read_only=True, threshold_ratio=1.5),
                        pb.SetReadOnlyRequest(read_only=True, threshold_ratio=math.nan)):
                with pytest.raises(grpc.RpcError) as refused:
                    conn.admin.SetReadOnly(bad, timeout=10)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "FORCED_REASON_MAX_CHARS" in refused.value.details() or "[0, 1]" in refused.value.details()
            assert conn.status().mode == pb.MODE_WRITABLE  # nothing refused took effect
            mode = conn.admin.SetReadOnly(pb.SetReadOnlyRequest(read_only=True, reason=BY_OPERATOR,
                                                                threshold_ratio=0.9), timeout=10)
            assert mode.forced_reason == BY_OPERATOR and mode.forced_threshold_ratio == pytest.approx(0.9)
            status = conn.status()
            assert status.forced_reason == BY_OPERATOR and status.forced_threshold_ratio == pytest.approx(0.9)
    finally:
        bookie.stop()
