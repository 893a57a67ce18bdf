"""`octavo bookie ...`: a bookie's status and its controls, over the BookieAdmin gRPC service.

--bookie takes HOST:PORT, HOST (port 3181), or a bookie id: looked up in the dev cluster of --data-dir, or in
etcd's registrations (--etcd, or OCTAVO_ETCD).

    octavo bookie status    --bookie HOST:PORT [--json]
    octavo bookie readonly  --bookie HOST:PORT [--json]          force read-only (kept across restarts)
    octavo bookie writable  --bookie HOST:PORT [--json]          release the forced mode (disk watermarks apply)
    octavo bookie gc        --bookie HOST:PORT [--json]          a garbage-collection pass now
    octavo bookie compact   --bookie HOST:PORT [--major|--minor] [--json] [--no-progress]
    octavo bookie compaction suspend|resume --bookie HOST:PORT [--json]
    octavo bookie compaction window --bookie HOST:PORT (--until TIME | --for DURATION | --clear) [--json]
    octavo bookie decommission --bookie ID [--dry-run] [--wait-s S] [--recover-open] [--json]
                            force it read-only, move every copy off it, retire its identity (see cluster.py)
    octavo bookie decommission --bookie ID --cancel
                            undo an unfinished one: its marks removed, the forced read-only mode released

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

from octavo.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    Target,
    add_bookie_id_arguments,
    add_etcd_arguments,
    admin_metadata,
    bookie_address,
    cli_tls,
    etcd_auth,
    fmt_age,
    fmt_bytes,
    fmt_time,
    looks_like_bookie_id,
    positive_float,
    print_json,
    proto_to_dict,
    resolve_target,
    table,
)
from octavo.meta.tls import sync_channel

DECOMMISSION_WAIT_S_DEFAULT = 600.0
WINDOW_ENDED_LONG_AGO_UNIX_MS = 946_684_800_000  # 2000-01-01: an end before it is a "closed" marker, not a time
DURATION = re.compile(r"^(\d+)([smhd])$")
DURATION_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bookie", help="inspect and control a bookie")
    bsub = p.add_subparsers(dest="bookie_cmd", required=True)

    def command(name: str, help_text: str, timeout_s: float) -> Any:
        c = bsub.add_parser(name, help=help_text)
        _common_arguments(c, timeout_s)
        return c

    command("status", "show a bookie's status", 5.0)
    command("readonly", "force the bookie read-only (kept across restarts)", 10.0)
    command("writable", "release a forced read-only mode (the disk watermarks still apply)", 10.0)
    command("gc", "run a garbage-collection pass now", 600.0)
    command("scrub", "verify every flushed record's checksum now (one scrub pass) and print what is damaged",
            24 * 3600.0)
    c = command("compact", "run a compaction pass now, with a progress bar", 24 * 3600.0)
    kind = c.add_mutually_exclusive_group()
    kind.add_argument("--major", action="store_true", help="rewrite logs below the major threshold (default)")
    kind.add_argument("--minor", action="store_true", help="rewrite logs below the minor threshold only")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    d = bsub.add_parser("decommission", help="move every copy off a live bookie, then retire its identity",
                        description="Force a live bookie read-only, move every copy it holds to other bookies, "
                                    "then retire its identity. Interrupted or unfinished, run it again to go on, "
                                    "or with --cancel to undo it.")
    add_bookie_id_arguments(d, "the bookie id (as registered, e.g. bookie-3)")
    d.add_argument("--cancel", action="store_true",
                   help="undo an interrupted or unfinished decommission: remove its under-replication marks and "
                        "release the forced read-only mode (copies already moved stay where they are)")
    d.add_argument("--dry-run", action="store_true", help="list what would move; change nothing")
    d.add_argument("--wait-s", type=positive_float, default=DECOMMISSION_WAIT_S_DEFAULT,
                   help="how long to wait for writers of open ledgers to move off the bookie (default: "
                        "%(default)gs); the marks stay for the workers after it")
    d.add_argument("--recover-open", action="store_true",
                   help="fence and close open ledgers whose last segment names the bookie instead of waiting")
    d.add_argument("--rate-bytes-per-s", type=int, default=64 << 20,
                   help="copy at most this many bytes per second (0: unlimited; default %(default)s)")
    d.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    d.add_argument("--json", action="store_true", help="print JSON")
    add_etcd_arguments(d)
    cp = bsub.add_parser("compaction", help="suspend, resume or window scheduled compaction")
    csub = cp.add_subparsers(dest="compaction_cmd", required=True)
    for name, help_text in (("suspend", "suspend compaction (a running pass stops at a safe point)"),
                            ("resume", "resume compaction"),
                            ("window", "allow scheduled compaction until a time")):
        w = csub.add_parser(name, help=help_text)
        _common_arguments(w, 10.0)
        if name == "window":
            g = w.add_mutually_exclusive_group(required=True)
            g.add_argument("--until", help="ISO 8601 time (UTC unless it says otherwise), e.g. 2026-11-23T06:00")
            g.add_argument("--for", dest="for_", metavar="DURATION", help="from now, e.g. 90m, 4h, 1d")
            g.add_argument("--clear", action="store_true", help="no window: compaction always allowed")


def _common_arguments(c: Any, timeout_s: float) -> None:
    c.add_argument("--bookie", required=True, metavar="ID|HOST[:PORT]",
                   help="the bookie: its id, or its address (port 3181 unless given)")
    c.add_argument("--json", action="store_true", help="print JSON")
    c.add_argument("--timeout", type=positive_float, default=timeout_s,
                   help=f"seconds to wait for the bookie (default: {timeout_s:g})")
    add_etcd_arguments(c)



def parse_window(args: Namespace, now_s: float | None = None) -> int:
    """The window's end in unix ms from --until / --for / --clear (0 for --clear). A window that has already
    ended is refused: it would silently turn scheduled compaction off."""
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
    if when.timestamp() <= now_s:
        raise CliError(f"--until {args.until} is in the past ({fmt_time(int(when.timestamp() * 1000))}; now is "
                       f"{fmt_time(int(now_s * 1000))}): that would turn scheduled compaction off; use "
                       "`compaction suspend` for that", EXIT_USAGE)
    return int(when.timestamp() * 1000)


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
    if args.bookie_cmd == "decommission":
        from octavo.cli.cluster import decommission

        return decommission(args)
    try:
        target = resolve_target(args, required=False)
        args.address = _resolve_bookie(args.bookie, target, check_cluster=not args.allow_empty)
        with sync_channel(args.address, cli_tls(target), metadata=admin_metadata()) as channel:
            stub = pb_grpc.BookieAdminStub(channel)
            handler = {"status": _status, "readonly": _readonly, "writable": _writable, "gc": _gc,
                       "compact": _compact, "compaction": _compaction, "scrub": _scrub}[args.bookie_cmd]
            return handler(stub, args)
    except CliError as e:
        print(f"octavo bookie {name}: {e}", file=sys.stderr)
        return e.code
    except grpc.RpcError as e:
        where = args.bookie if args.bookie == args.address else f"{args.bookie} at {args.address}"
        if e.code() == grpc.StatusCode.UNAVAILABLE:
            hint = ("; with TLS on, a certificate either side refuses also shows so (check OCTAVO_TLS_CA_FILE, "
                    "OCTAVO_TLS_CERT_FILE, OCTAVO_TLS_KEY_FILE)" if "Socket closed" in (e.details() or "")
                    or "handshake" in (e.details() or "").lower() else "")
            print(f"octavo bookie {name}: cannot reach bookie {where}: {e.details()}{hint}", file=sys.stderr)
        elif e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            print(f"octavo bookie {name}: bookie {where} did not answer within --timeout {args.timeout:g}s",
                  file=sys.stderr)
        else:
            print(f"octavo bookie {name}: bookie {where}: {e.code().name}: {e.details()}", file=sys.stderr)
        return EXIT_FAILED


def _resolve_bookie(spec: str, target: Target | None, check_cluster: bool = True) -> str:
    """--bookie as HOST:PORT: an id known to a dev cluster or to etcd, or an address. A name without a port
    that is neither a registered bookie nor a host name is refused here, saying so (gRPC would only say its DNS
    lookup failed); so is a cluster with nothing in etcd (a mistyped --cluster), unless check_cluster is off."""
    known_to_dev = target is not None and target.dev_state and any(
        b.get("id") == spec for b in target.dev_state.get("bookies", []))
    registered: dict[str, str] = {}
    if target is not None and not known_to_dev and looks_like_bookie_id(spec):
        import asyncio

        from octavo.meta.errors import OctavoError

        try:
            registered = asyncio.run(_registered_addresses(target, check_cluster))
        except OctavoError as e:
            raise CliError(f"cannot look up bookie {spec!r} in etcd: {e}") from None
        if spec not in registered and not _is_host_name(spec):
            raise CliError(f"bookie {spec!r} is not registered in cluster {target.cluster!r} (etcd {target.etcd}); "
                           f"registered: {', '.join(sorted(registered)) or 'none'}. A bookie that is down is not "
                           "registered; an address is HOST[:PORT]")
    elif target is None and looks_like_bookie_id(spec) and not _is_host_name(spec):
        raise CliError(f"no host named {spec!r}, and no cluster to look it up in as a bookie id: give --etcd "
                       f"HOST:PORT (or $OCTAVO_ETCD, or --data-dir of a dev cluster), or the bookie's HOST:PORT",
                       EXIT_USAGE)
    return bookie_address(spec, target, registered)


def _is_host_name(name: str) -> bool:
    import socket

    try:
        socket.getaddrinfo(name.strip("[]"), None)
    except (OSError, UnicodeError):
        return False
    return True


async def _registered_addresses(target: Target, check_cluster: bool) -> dict[str, str]:
    from octavo.cli.common import check_cluster_exists
    from octavo.meta.etcd import EtcdClient
    from octavo.meta.layout import Layout
    from octavo.meta.metadata import MetadataStore

    async with EtcdClient(target.etcd, auth=etcd_auth(target)) as etcd:
        registered = {b: info.address
                      for b, info in (await MetadataStore(etcd, Layout(target.cluster)).bookies()).items()}
        if not registered and check_cluster:
            await check_cluster_exists(etcd, target.cluster, target.etcd)
        return registered


def describe_mode(mode: str, reason: str) -> str:
    """The mode once: the bookie's reason already starts with it ("read-only: forced by ..."; "writable")."""
    return reason if reason.startswith(mode) else f"{mode}: {reason}" if reason else mode


def describe_window(until_unix_ms: int, now_unix_ms: int) -> str:
    """A compaction window as people read it: none, open until a time, or closed (the operator closes one with
    an end at the epoch's first millisecond: never "until 1970-01-01")."""
    if not until_unix_ms:
        return "no window (always allowed)"
    if until_unix_ms > now_unix_ms:
        return f"window open until {fmt_time(until_unix_ms)}"
    if until_unix_ms < WINDOW_ENDED_LONG_AGO_UNIX_MS:
        return "window closed (scheduled passes wait for the next one)"
    return f"window closed since {fmt_time(until_unix_ms)} (scheduled passes wait for the next one)"


def _status(stub: Any, args: Namespace) -> int:
    from octavo.v1 import bookie_pb2 as pb

    status = stub.GetStatus(pb.GetStatusRequest(include_entry_logs=True), timeout=args.timeout)
    if args.json:
        print(json.dumps(proto_to_dict(status)))
        return EXIT_OK
    print(f"bookie      {status.bookie_id} at {status.address} (version {status.version}, instance "
          f"{status.instance_id})")
    if status.cluster:
        print(f"cluster     {status.cluster}: {describe_registration(status, time.time())}")
    mode = pb.BookieMode.Name(status.mode).removeprefix("MODE_").lower().replace("_", "-")
    print(f"mode        {describe_mode(mode, status.mode_reason)}")
    metrics = f"http://{status.metrics_address}/metrics" if status.metrics_address else "off (--metrics-port)"
    print(f"metrics     {metrics}")
    for d in status.directories:
        print(f"disk        {d.path}: {fmt_bytes(d.used_bytes)} of {fmt_bytes(d.total_bytes)} used "
              f"({d.usage_ratio:.1%}); warn at {status.disk_warn_ratio:.0%}, read-only at "
              f"{status.disk_readonly_ratio:.0%}, writable below {status.disk_writable_ratio:.0%}")
    live = status.log_live_bytes / status.log_total_bytes if status.log_total_bytes else 1.0
    print(f"logs        {status.entry_log_count} entry logs; active {status.active_log_id}; recovery point "
          f"{status.recovery_point_log_id}; flushed {fmt_bytes(status.log_total_bytes)}, {live:.0%} live")
    wc = status.write_cache
    print(f"write cache {wc.entries} of {wc.entries_max} entries (~{fmt_bytes(wc.estimated_bytes)})")
    print(f"ledgers     {status.ledger_count}; fsync policy {status.fsync_policy}")
    if status.gc_last_run_unix_ms:
        print(f"gc          last pass {fmt_time(status.gc_last_run_unix_ms)}: {status.gc_ledgers_dropped} deleted "
              f"ledgers dropped, {status.gc_logs_deleted} logs deleted, {fmt_bytes(status.gc_bytes_reclaimed)} "
              f"reclaimed in {status.gc_duration_s:.2f}s")
    c = status.compaction
    state = "suspended" if c.suspended else ("enabled" if c.enabled else "disabled (scheduled passes)")
    window = (f"; {describe_window(c.window_until_unix_ms, int(time.time() * 1000))}" if c.window_until_unix_ms
              else "")
    print(f"compaction  {state}{window}; minor below {c.minor_threshold:.0%}, major below {c.major_threshold:.0%}, "
          f"rate {fmt_bytes(c.rate_bytes_per_s) + '/s' if c.rate_bytes_per_s else 'unlimited'}"
          f"{'; ' + c.blocked_reason if c.blocked_reason and not c.suspended else ''}")
    if c.running:
        print(f"            running {c.running_kind}: {fmt_bytes(c.running_bytes_done)} of "
              f"{fmt_bytes(c.running_bytes_total)} copied")
    if c.last_run.finished_unix_ms:
        print(f"            last pass {_describe_run(c.last_run)}")
    print(f"scrub       {describe_scrub(status.scrub)}")
    last = "unclean" if status.last_start_was_unclean else "clean"
    print(f"restarts    last start {last}; {status.unclean_restart_count} unclean so far; last recovery scanned "
          f"{status.recovery_logs_scanned} logs, replayed {status.recovery_records_replayed} records, cut "
          f"{status.recovery_bytes_truncated} bytes")
    return EXIT_OK


def describe_registration(status: Any, now_s: float) -> str:
    """What the bookie knows of its registration in etcd, and since when."""
    refreshed = status.registration_refreshed_unix_ms / 1000
    ago = f"{now_s - refreshed:.1f}s ago" if refreshed else "never"
    if status.registered:
        text = f"registered (lease of {status.registration_ttl_s}s refreshed {ago})"
    elif refreshed and status.registration_ttl_s:
        text = (f"NOT registered as far as the bookie knows: its lease ({status.registration_ttl_s}s) was last "
                f"refreshed {ago} and has expired by now")
    else:
        text = "NOT registered"
    if status.registration_error:
        since = status.registration_failing_since_unix_ms / 1000
        text += (f"; etcd unreachable since {fmt_time(status.registration_failing_since_unix_ms)} "
                 f"({now_s - since:.0f}s): {status.registration_error}")
    return text


def _describe_run(r: Any) -> str:
    text = (f"{r.kind} at {fmt_time(r.finished_unix_ms)}: {r.logs_compacted} logs compacted into "
            f"{r.compaction_logs}, {r.entries_copied} entries ({fmt_bytes(r.bytes_copied)}) copied, "
            f"{fmt_bytes(r.bytes_reclaimed)} reclaimed in {r.duration_s:.2f}s")
    if r.corrupt_records:
        text += f"; {r.corrupt_records} corrupt records skipped"
    if r.stopped:
        text += f"; stopped early: {r.stopped}"
    if r.error:
        text += f"; FAILED: {r.error}"
    return text


def describe_scrub(s: Any) -> str:
    every = f"every {fmt_age(s.interval_s)}" if s.enabled else "only when asked"
    line = f"{every} at {fmt_bytes(s.rate_bytes_per_s)}/s; {s.passes} passes"
    if s.running:
        line += " (one running)"
    if s.last_pass_unix_ms:
        line += (f"; last {fmt_time(s.last_pass_unix_ms)}: {fmt_bytes(s.last_pass_bytes)} in "
                 f"{s.last_pass_duration_s:.1f}s, {s.last_pass_damaged} damaged")
    return (line + f"; damage marks naming this bookie {s.damage_marks_open} ({s.damage_entries_damaged} entries), "
            f"{s.damage_entries_repaired} repaired, {s.damage_entries_refuted} reported but good"
            + (f"; last error: {s.damage_last_error}" if s.damage_last_error else ""))


def _scrub(stub: Any, args: Namespace) -> int:
    from octavo.v1 import bookie_pb2 as pb

    state = stub.RunScrub(pb.RunScrubRequest(), timeout=args.timeout)
    if args.json:
        print(json.dumps(proto_to_dict(state)))
        return EXIT_OK
    print(f"scrubbed {fmt_bytes(state.last_pass_bytes)} in {state.last_pass_duration_s:.1f}s: "
          f"{state.last_pass_damaged} damaged records")
    if state.findings:
        print(table(["LEDGER", "ENTRY", "LOG", "OFFSET", "DAMAGE"], [
            [str(f.ledger_id), str(f.entry_id), str(f.log_id), str(f.offset), f.reason] for f in state.findings]))
    return EXIT_OK


def _set_mode(stub: Any, args: Namespace, read_only: bool) -> int:
    from octavo.v1 import bookie_pb2 as pb

    reason = "`octavo bookie readonly`" if read_only else ""
    mode = stub.SetReadOnly(pb.SetReadOnlyRequest(read_only=read_only, reason=reason), timeout=args.timeout)
    if args.json:
        print_json(proto_to_dict(mode))
    else:
        print(describe_mode(pb.BookieMode.Name(mode.mode).removeprefix("MODE_").lower().replace("_", "-"),
                            mode.reason))
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
        print_json(proto_to_dict(result))
    else:
        print(f"dropped {result.ledgers_dropped} deleted ledgers; deleted {result.logs_deleted} of "
              f"{result.logs_checked} flushed logs; reclaimed {fmt_bytes(result.bytes_reclaimed)} in "
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
                       f"{update.logs_done}/{update.logs_total} logs, {fmt_bytes(update.bytes_done)} of "
                       f"{fmt_bytes(update.bytes_total)}")
    finally:
        bar.finish()
    if report is None:
        raise CliError("the bookie ended the call without a report")
    if args.json:
        print_json(proto_to_dict(report))
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
        print_json(proto_to_dict(state))
        return EXIT_OK
    what = "suspended" if state.suspended else "active"
    window = describe_window(state.window_until_unix_ms, int(time.time() * 1000))
    print(f"compaction {what}; {window}" + (f"; {state.blocked_reason}" if state.blocked_reason else ""))
    return EXIT_OK
