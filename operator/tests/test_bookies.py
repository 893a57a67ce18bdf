"""The operator's calls to a real bookie process over its admin API: observing it, forcing and releasing
read-only mode, opening and closing compaction windows; a bookie that does not answer."""

from __future__ import annotations

import time
from pathlib import Path

from octavo.cli.localcluster import free_port
from octavo.node.testing import BookieProcess
from octavo.operator.bookies import apply, observe
from octavo.operator.policy import CLOSE_WINDOW, FORCE_READ_ONLY, OPEN_WINDOW, RELEASE_READ_ONLY, Action


async def test_observe_and_act_on_a_real_bookie(tmp_path: Path) -> None:
    bookie = BookieProcess(str(tmp_path / "b"), args=["--disk-capacity-bytes", str(1 << 30)])
    address = bookie.start()
    dead = f"127.0.0.1:{free_port()}"
    try:
        addresses = {"b-0": address, "b-1": dead, "b-2": ""}
        seen = {o.bookie_id: o for o in await observe(addresses, timeout_s=2)}
        assert seen["b-0"].reachable and seen["b-0"].writable and not seen["b-0"].forced_read_only
        assert 0 <= seen["b-0"].disk_usage_ratio < 0.01  # a fresh data directory against a 1 GiB capacity
        assert not seen["b-1"].reachable and not seen["b-2"].reachable

        now_ms = int(time.time() * 1000)
        results = await apply([Action(FORCE_READ_ONLY, "b-0"), Action(OPEN_WINDOW, "b-0", now_ms + 3_600_000)],
                              addresses)
        assert [e for _, e in results] == ["", ""]
        (b,) = await observe({"b-0": address})
        assert not b.writable and b.forced_read_only and b.window_until_unix_ms == now_ms + 3_600_000

        results = await apply([Action(RELEASE_READ_ONLY, "b-0"), Action(CLOSE_WINDOW, "b-0", now_ms)], addresses)
        assert [e for _, e in results] == ["", ""]
        (b,) = await observe({"b-0": address})
        assert b.writable and not b.forced_read_only and b.window_until_unix_ms == now_ms

        failed = await apply([Action(FORCE_READ_ONLY, "b-1"), Action(FORCE_READ_ONLY, "b-2")], addresses, 1.0)
        assert "ForceReadOnly on bookie b-1" in failed[0][1] and "UNAVAILABLE" in failed[0][1]
        assert "no address" in failed[1][1]
    finally:
        bookie.stop()
