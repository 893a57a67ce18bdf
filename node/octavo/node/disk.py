"""The disk monitor: watermarks and the bookie's mode (writable or read-only).

Every disk_check_interval_ms the monitor measures each data directory's filesystem (or, with
disk_capacity_bytes set, the bytes under the directory against that capacity). Thresholds, as shares:

- past `disk_warn_ratio`: a warning in the log (once per crossing);
- past `disk_readonly_ratio` (the high-water mark) in any directory: read-only;
- back below `disk_writable_ratio` (the low-water mark, strictly lower) in every directory: writable again.
  Between the two marks the mode does not change, so a bookie hovering near the high mark does not flap.

An add that hits ENOSPC turns the bookie read-only at once (Engine.take_disk_full_seen), whatever the measured
usage; it too is released only below the low mark. An administrator may force read-only; the forced mode is
kept in the node state, so it survives restarts, and only the administrator releases it. The automatic mode
never keeps a bookie read-only once usage is below the low mark.

A read-only bookie refuses adds with READ_ONLY (writers change ensembles), serves reads, accepts recovery
adds, and is registered in the read-only set in etcd (server.py moves it). GC and compaction keep running.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass

from octavo.node.checkpoint import write_node_state
from octavo.node.engine import Engine
from octavo.node.watermarks import Watermarks, disk_full_next, warning_due

log = logging.getLogger(__name__)

STATE_FORCED_READ_ONLY = "forced_read_only"
STATE_FORCED_REASON = "forced_reason"
STATE_FORCED_THRESHOLD = "forced_threshold_ratio"
# The longest reason a SetReadOnly may carry (kept in the node state and shown by every status).
FORCED_REASON_MAX_CHARS = 512


@dataclass(frozen=True)
class DirUsage:
    path: str
    total_bytes: int
    used_bytes: int
    free_bytes: int

    @property
    def ratio(self) -> float:
        return self.used_bytes / self.total_bytes if self.total_bytes else 0.0


def forced_problem(reason: str, threshold_ratio: float) -> str:
    """What is wrong with a SetReadOnly's reason and threshold, or "" (the limits are named here)."""
    if len(reason) > FORCED_REASON_MAX_CHARS:
        return f"reason is {len(reason)} characters; at most {FORCED_REASON_MAX_CHARS} (FORCED_REASON_MAX_CHARS)"
    if not 0.0 <= threshold_ratio <= 1.0:  # also refuses NaN
        return f"threshold_ratio must be a share of capacity in [0, 1], got {threshold_ratio}"
    return ""


def tree_bytes(path: str) -> int:
    """Bytes allocated under a directory (what a quota counts)."""
    # What os.walk with an lstat per file counts (a symlink counts as itself and is never followed; a directory
    # that cannot be listed is skipped), with each scandir entry's own stat instead of a path join and a separate
    # lstat: the disk monitor runs this every disk_check_interval_ms (about 2.5 times faster).
    total = 0
    pending = [path]
    while pending:
        try:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir():
                            if not entry.is_symlink():
                                pending.append(entry.path)
                            continue
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
                    except FileNotFoundError:
                        continue
        except OSError:
            continue
    return total


class DiskMonitor:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.config = engine.config
        self.directories = [engine.data_dir]
        extra = engine.node_state.extra if engine.node_state else {}
        self.forced = bool(extra.get(STATE_FORCED_READ_ONLY, False))
        # Node states written before the reason and threshold were kept have neither: "an administrator", none.
        self.forced_reason = str(extra.get(STATE_FORCED_REASON, ""))
        self.forced_threshold_ratio = float(extra.get(STATE_FORCED_THRESHOLD, 0.0))
        self.disk_full = False
        self.full_path = ""
        self.full_by_enospc = False  # the read-only mode came from an add that hit ENOSPC
        self.usages: list[DirUsage] = []
        self._warned: set[str] = set()
        self.published_read_only = self.read_only  # the mode the engine (and the registration) last learned

    def measure(self, path: str) -> DirUsage:
        cap = self.config.disk_capacity_bytes
        if cap:
            used = tree_bytes(path)
            return DirUsage(path, cap, used, max(0, cap - used))
        usage = shutil.disk_usage(path)
        return DirUsage(path, usage.total, usage.used, usage.free)

    @property
    def read_only(self) -> bool:
        return self.forced or self.disk_full or bool(self.engine.sync_failed_reason)

    def reason(self) -> str:
        cfg = self.config
        if self.engine.sync_failed_reason:
            return f"read-only: {self.engine.sync_failed_reason}"
        if self.forced:
            by = self.forced_reason or "an administrator"
            return f"read-only: forced by {by} (release with `octavo bookie writable`)"
        if self.disk_full:
            usage = next((u for u in self.usages if u.path == self.full_path), None)
            share = f"{usage.ratio:.1%} full" if usage else "full"
            cause = "an add hit ENOSPC; " if self.full_by_enospc else ""
            return (f"read-only: {cause}disk of {self.full_path} is {share} (read-only at "
                    f"{cfg.disk_readonly_ratio:.0%}, writable again below {cfg.disk_writable_ratio:.0%})")
        return "writable"

    def check(self) -> bool:
        """Measure every directory and update the mode. Returns whether the mode changed."""
        cfg = self.config
        was = self.published_read_only  # not self.read_only: a failed sync makes that True between checks
        self.usages = [self.measure(path) for path in self.directories]
        worst = max(self.usages, key=lambda u: u.ratio)
        marks = Watermarks(cfg.disk_warn_ratio, cfg.disk_readonly_ratio, cfg.disk_writable_ratio)
        for u in self.usages:
            due = warning_due(u.ratio, u.path in self._warned, marks)
            if due:
                self._warned.add(u.path)
                log.warning("disk of %s is %.1f%% full (warning at %.0f%%, read-only at %.0f%%)", u.path,
                            100 * u.ratio, 100 * cfg.disk_warn_ratio, 100 * cfg.disk_readonly_ratio)
            elif due is False:
                self._warned.discard(u.path)
        enospc = self.engine.take_disk_full_seen()
        full = disk_full_next(self.disk_full, worst.ratio, enospc, marks)
        if full and not self.disk_full:
            self.full_path, self.full_by_enospc = worst.path, enospc
            if enospc:
                log.error("an add hit ENOSPC in %s: read-only until usage is below %.0f%%", worst.path,
                          100 * cfg.disk_writable_ratio)
        self.disk_full = full
        self._apply()
        changed = was != self.read_only
        if changed:
            log.warning("bookie is now %s", self.reason() if self.read_only else "writable",
                        extra={"event": "mode_change", "mode": "read_only" if self.read_only else "writable"})
        return changed

    def set_forced(self, forced: bool, reason: str = "", threshold_ratio: float = 0.0) -> bool:
        """Force read-only (with who forces it and at what usage share, see forced_problem) or release the
        forced mode (persisted before it returns). Returns whether the mode changed."""
        was = self.read_only
        self.forced = forced
        self.forced_reason, self.forced_threshold_ratio = (reason, threshold_ratio) if forced else ("", 0.0)
        state = self.engine.node_state
        if state is not None:
            state.extra[STATE_FORCED_READ_ONLY] = forced
            state.extra[STATE_FORCED_REASON] = self.forced_reason
            state.extra[STATE_FORCED_THRESHOLD] = self.forced_threshold_ratio
            write_node_state(self.engine.io, self.engine.data_dir, state)
        self._apply()
        return was != self.read_only

    def _apply(self) -> None:
        self.published_read_only = self.read_only
        self.engine.set_read_only_reason(self.reason() if self.read_only else "")
