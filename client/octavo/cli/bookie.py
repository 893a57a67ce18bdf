"""`octavo bookie ...`: a bookie's status and its controls, over the BookieAdmin gRPC service.

    octavo bookie status    --bookie HOST:PORT [--json]
    octavo bookie readonly  --bookie HOST:PORT [--json]          force read-only (kept across restarts)
    octavo bookie writable  --bookie HOST:PORT [--json]          release the forced mode (disk watermarks apply)
    octavo bookie gc        --bookie HOST:PORT [--json]          a garbage-collection pass now
    octavo bookie compact   --bookie HOST:PORT [--major|--minor] [--json] [--no-progress]
    octavo bookie compaction suspend|resume --bookie HOST:PORT [--json]
    octavo bookie compaction window --bookie HOST:PORT (--until TIME | --for DURATION | --clear) [--json]

Output is for people by default and one JSON object with --json. `compact` draws a progress bar on stderr
when stderr is a terminal. Exit codes: 0 success, 1 the operation failed (message on stderr), 2 bad usage.
"""

from __future__ import annotations

import json
import re
import sys
import time
from argparse import Namespace
from datetime import UTC, datetime
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

DURATION = re.compile(r"^(\d+)([smhd])$")
DURATION_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bookie", help="inspect and control a bookie")
    bsub = p.add_subparsers(dest="bookie_cmd", required=True)

    def command(name: str, help_text: str, timeout_s: float) -> Any:
        c = bsub.add_parser(name, help=help_text)
        c.add_argument("--bookie", required=True, help="HOST:PORT of the bookie")
        c.add_argument("--json", action="store_true", help="print JSON")
        c.add_argument("--timeout", type=float, default=timeout_s, help="seconds to wait for the bookie")
        return c

    command("status", "show a bookie's status", 5.0)
    command("readonly", "force the bookie read-only (kept across restarts)", 10.0)
    command("writable", "release a forced read-only mode (the disk watermarks still apply)", 10.0)
    command("gc", "run a garbage-collection pass now", 600.0)
    c = command("compact", "run a compaction pass now, with a progress bar", 24 * 3600.0)
    kind = c.add_mutually_exclusive_group()
    kind.add_argument("--major", action="store_true", help="rewrite logs below the major threshold (default)")
    kind.add_argument("--minor", action="store_true", help="rewrite logs below the minor threshold only")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    cp = bsub.add_parser("compaction", help="suspend, resume or window scheduled compaction")
    csub = cp.add_subparsers(dest="compaction_cmd", required=True)
    for name, help_text in (("suspend", "suspend compaction (a running pass stops at a safe point)"),
                            ("resume", "resume compaction"),
                            ("window", "allow scheduled compaction until a time")):
        w = csub.add_parser(name, help=help_text)
        w.add_argument("--bookie", required=True, help="HOST:PORT of the bookie")
        w.add_argument("--json", action="store_true", help="print JSON")
        w.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the bookie")
        if name == "window":
            g = w.add_mutually_exclusive_group(required=True)
            g.add_argument("--until", help="ISO 8601 time (UTC unless it says otherwise), e.g. 2026-11-23T06:00")
            g.add_argument("--for", dest="for_", metavar="DURATION", help="from now, e.g. 90m, 4h, 1d")
            g.add_argument("--clear", action="store_true", help="no window: compaction always allowed")


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def parse_window(args: Namespace, now_s: float | None = None) -> int:
    """The window's end in unix ms from --until / --for / --clear (0 for --clear)."""
    now_s = time.time() if now_s is None else now_s
    if args.clear:
        return 0
    if args.for_ is not None:
        m = DURATION.match(args.for_.strip())
        if not m or int(m.group(1)) <= 0:
            raise CliError(f"--for wants a positive duration like 90m, 4h or 1d, got {args.for_!r}", EXIT_USAGE)
        return int((now_s + int(m.group(1)) * DURATION_UNITS_S[m.group(2)]) * 1000)
    try:
        when = datetime.fromisoformat(args.until)
    except ValueError:
        raise CliError(f"--until wants an ISO 8601 time like 2026-11-23T06:00, got {args.until!r}",
                       EXIT_USAGE) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _fmt_time(unix_ms: int) -> str:
    return datetime.fromtimestamp(unix_ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _to_dict(message: Any) -> dict[str, Any]:
    from google.protobuf import json_format

    out: dict[str, Any] = json_format.MessageToDict(message, always_print_fields_with_no_presence=True)
    return out


class ProgressBar:
    """A one-line progress bar on a terminal stream; silent when the stream is not a terminal."""

    WIDTH = 30

    def __init__(self, stream: Any, enabled: bool) -> None:
        self.stream = stream
        self.enabled = enabled and hasattr(stream, "isatty") and stream.isatty()
        self.drawn = False

    def update(self, label: str, done: int, total: int, detail: str) -> None:
        if not self.enabled:
            return
        share = min(1.0, done / total) if total else 1.0
        filled = int(share * self.WIDTH)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        self.stream.write(f"\r{label} [{bar}] {share:4.0%} {detail}\x1b[K")
        self.stream.flush()
        self.drawn = True

    def finish(self) -> None:
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()


def run(args: Namespace) -> int:
    import grpc

    from octavo.v1 import bookie_pb2_grpc as pb_grpc

    name = args.bookie_cmd if args.bookie_cmd != "compaction" else f"compaction {args.compaction_cmd}"
    try:
        with grpc.insecure_channel(args.bookie) as channel:
            stub = pb_grpc.BookieAdminStub(channel)
            handler = {"status": _status, "readonly": _readonly, "writable": _writable, "gc": _gc,
                       "compact": _compact, "compaction": _compaction}[args.bookie_cmd]
            return handler(stub, args)
    except CliError as e:
        print(f"octavo bookie {name}: {e}", file=sys.stderr)
        return e.code
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.UNAVAILABLE:
            print(f"octavo bookie {name}: cannot reach bookie {args.bookie}: {e.details()}", file=sys.stderr)
        else:
            print(f"octavo bookie {name}: bookie {args.bookie}: {e.code().name}: {e.details()}", file=sys.stderr)
        return EXIT_FAILED


def _status(stub: Any, args: Namespace) -> int:
    from octavo.v1 import bookie_pb2 as pb

    status = stub.GetStatus(pb.GetStatusRequest(include_entry_logs=True), timeout=args.timeout)
    if args.json:
        print(json.dumps(_to_dict(status), indent=2))
        return EXIT_OK
    print(f"bookie      {status.bookie_id} at {status.address} (version {status.version}, instance "
          f"{status.instance_id})")
    if status.cluster:
        print(f"cluster     {status.cluster}: {'registered' if status.registered else 'NOT registered'}")
    print(f"mode        {pb.BookieMode.Name(status.mode).removeprefix('MODE_').lower()}: {status.mode_reason}")
    for d in status.directories:
        print(f"disk        {d.path}: {_fmt_bytes(d.used_bytes)} of {_fmt_bytes(d.total_bytes)} used "
              f"({d.usage_ratio:.1%}); warn at {status.disk_warn_ratio:.0%}, read-only at "
              f"{status.disk_readonly_ratio:.0%}, writable below {status.disk_writable_ratio:.0%}")
    live = status.log_live_bytes / status.log_total_bytes if status.log_total_bytes else 1.0
    print(f"logs        {status.entry_log_count} entry logs; active {status.active_log_id}; recovery point "
          f"{status.recovery_point_log_id}; flushed {_fmt_bytes(status.log_total_bytes)}, {live:.0%} live")
    wc = status.write_cache
    print(f"write cache {wc.entries} of {wc.entries_max} entries (~{_fmt_bytes(wc.estimated_bytes)})")
    print(f"ledgers     {status.ledger_count}; fsync policy {status.fsync_policy}")
    if status.gc_last_run_unix_ms:
        print(f"gc          last pass {_fmt_time(status.gc_last_run_unix_ms)}: {status.gc_ledgers_dropped} deleted "
              f"ledgers dropped, {status.gc_logs_deleted} logs deleted, {_fmt_bytes(status.gc_bytes_reclaimed)} "
              f"reclaimed in {status.gc_duration_s:.2f}s")
    c = status.compaction
    state = "suspended" if c.suspended else ("enabled" if c.enabled else "disabled (scheduled passes)")
    window = f"; window until {_fmt_time(c.window_until_unix_ms)}" if c.window_until_unix_ms else ""
    print(f"compaction  {state}{window}; minor below {c.minor_threshold:.0%}, major below {c.major_threshold:.0%}, "
          f"rate {_fmt_bytes(c.rate_bytes_per_s) + '/s' if c.rate_bytes_per_s else 'unlimited'}"
          f"{'; ' + c.blocked_reason if c.blocked_reason and not c.suspended else ''}")
    if c.running:
        print(f"            running {c.running_kind}: {_fmt_bytes(c.running_bytes_done)} of "
              f"{_fmt_bytes(c.running_bytes_total)} copied")
    if c.last_run.finished_unix_ms:
        print(f"            last pass {_describe_run(c.last_run)}")
    last = "unclean" if status.last_start_was_unclean else "clean"
    print(f"restarts    last start {last}; {status.unclean_restart_count} unclean so far; last recovery scanned "
          f"{status.recovery_logs_scanned} logs, replayed {status.recovery_records_replayed} records, cut "
          f"{status.recovery_bytes_truncated} bytes")
    return EXIT_OK


def _describe_run(r: Any) -> str:
    text = (f"{r.kind} at {_fmt_time(r.finished_unix_ms)}: {r.logs_compacted} logs compacted into "
            f"{r.compaction_logs}, {r.entries_copied} entries ({_fmt_bytes(r.bytes_copied)}) copied, "
            f"{_fmt_bytes(r.bytes_reclaimed)} reclaimed in {r.duration_s:.2f}s")
    if r.corrupt_records:
        text += f"; {r.corrupt_records} corrupt records skipped"
    if r.stopped:
        text += f"; stopped early: {r.stopped}"
    if r.error:
        text += f"; FAILED: {r.error}"
    return text


def _set_mode(stub: Any, args: Namespace, read_only: bool) -> int:
    from octavo.v1 import bookie_pb2 as pb

    mode = stub.SetReadOnly(pb.SetReadOnlyRequest(read_only=read_only), timeout=args.timeout)
    if args.json:
        print(json.dumps(_to_dict(mode)))
    else:
        print(f"{pb.BookieMode.Name(mode.mode).removeprefix('MODE_').lower()}: {mode.reason}")
    return EXIT_OK


def _readonly(stub: Any, args: Namespace) -> int:
    return _set_mode(stub, args, True)


def _writable(stub: Any, args: Namespace) -> int:
    code = _set_mode(stub, args, False)
    from octavo.v1 import bookie_pb2 as pb

    status = stub.GetStatus(pb.GetStatusRequest(), timeout=args.timeout)
    if status.mode == pb.MODE_READ_ONLY and not args.json:
        print("note: the bookie stays read-only until its disk is below the low-water mark", file=sys.stderr)
    return code


def _gc(stub: Any, args: Namespace) -> int:
    from octavo.v1 import bookie_pb2 as pb

    result = stub.RunGc(pb.RunGcRequest(), timeout=args.timeout)
    if args.json:
        print(json.dumps(_to_dict(result)))
    else:
        print(f"dropped {result.ledgers_dropped} deleted ledgers; deleted {result.logs_deleted} of "
              f"{result.logs_checked} flushed logs; reclaimed {_fmt_bytes(result.bytes_reclaimed)} in "
              f"{result.duration_s:.2f}s")
    return EXIT_OK


def _compact(stub: Any, args: Namespace) -> int:
    from octavo.v1 import bookie_pb2 as pb

    bar = ProgressBar(sys.stderr, enabled=not args.no_progress and not args.json)
    report = None
    try:
        for update in stub.RunCompaction(pb.RunCompactionRequest(major=not args.minor), timeout=args.timeout):
            if update.done:
                report = update.report
                break
            bar.update(f"{update.kind} compaction", update.bytes_done, update.bytes_total,
                       f"{update.logs_done}/{update.logs_total} logs, {_fmt_bytes(update.bytes_done)} of "
                       f"{_fmt_bytes(update.bytes_total)}")
    finally:
        bar.finish()
    if report is None:
        raise CliError("the bookie ended the call without a report")
    if args.json:
        print(json.dumps(_to_dict(report)))
    else:
        print(_describe_run(report))
    return EXIT_FAILED if report.error else EXIT_OK


def _compaction(stub: Any, args: Namespace) -> int:
    from octavo.v1 import bookie_pb2 as pb

    if args.compaction_cmd == "window":
        until = parse_window(args)
        state = stub.SetCompactionWindow(pb.SetCompactionWindowRequest(until_unix_ms=until), timeout=args.timeout)
    else:
        state = stub.SuspendCompaction(pb.SuspendCompactionRequest(suspend=args.compaction_cmd == "suspend"),
                                       timeout=args.timeout)
    if args.json:
        print(json.dumps(_to_dict(state)))
        return EXIT_OK
    what = "suspended" if state.suspended else "active"
    window = (f"allowed until {_fmt_time(state.window_until_unix_ms)}" if state.window_until_unix_ms
              else "no window (always allowed)")
    print(f"compaction {what}; {window}" + (f"; {state.blocked_reason}" if state.blocked_reason else ""))
    return EXIT_OK
