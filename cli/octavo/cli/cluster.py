"""`octavo cluster ...`: the cluster as a whole.

    octavo cluster recover --bookie ID [--dry-run] [--recover-open] [--rate-bytes-per-s N] [--json] [--no-progress]
                                  copy a dead bookie's share of every ledger from the other replicas
    octavo cluster status [--json] [--etcd-quota-bytes N]
                                  every bookie (writable, read-only, forced, gone) with its disk and compaction,
                                  the auditor, under-replicated ledgers and re-replication in progress, and
                                  etcd's health: its alarms and its database against its quota (a raised NOSPACE
                                  or CORRUPT alarm comes first, in capitals: etcd refuses writes)
    octavo cluster underreplicated [--json]
                                  the ledgers marked as missing copies, and who is restoring them
    octavo cluster check [--entries N] [--entry-bytes N] [--ensemble E --write-quorum W --ack-quorum A] [--json]
                                  a smoke test end to end: create a ledger, write entries, close it, read them
                                  back through a recovery open, compare byte for byte, delete the ledger (the
                                  Helm chart's `helm test`); exit 0 when everything came back identical

`recover` is for a bookie that is gone for good (its registration expired): it marks every ledger naming it
under-replicated in etcd, re-replicates them one by one, and unmarks each one done. It can be interrupted and
run again; it refuses to start when the other bookies cannot hold some ledger's ensemble. Open ledgers whose
last segment names the bookie belong to their writer; --recover-open fences and closes them first (their writer
is taken to be gone too). Entries no surviving replica holds are reported as lost (exit code 1) and their
ledgers stay marked. Exit codes: 0 success, 1 the operation failed or left work (message on stderr), 2 bad usage.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from argparse import Namespace
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from octavo.cli.clusterstatus import ETCD_QUOTA_BYTES_ENV, damage_rows, status
from octavo.cli.clusterstatus import bounded_int as _bounded
from octavo.cli.clusterstatus import quota_bytes as _quota_bytes
from octavo.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    add_bookie_id_arguments,
    add_etcd_arguments,
    admin_metadata,
    cli_tls,
    cluster_client,
    fmt_age,
    fmt_bytes,
    non_negative_int,
    print_json,
    resolve_bookie_id,
    resolve_target,
    run_async,
    table,
)
from octavo.meta.etcdhealth import ETCD_QUOTA_BYTES_DEFAULT
from octavo.meta.tls import aio_channel

REPLICATION_RATE_BYTES_PER_S_DEFAULT = 64 << 20
REPLICATION_BATCH_BYTES_MAX_DEFAULT = 4 << 20


def add_parser(sub: Any) -> None:
    p = sub.add_parser("cluster", help="the cluster as a whole: recover a dead bookie, under-replicated ledgers")
    csub = p.add_subparsers(dest="cluster_cmd", required=True)
    c = csub.add_parser("recover", help="copy a dead bookie's data from the other replicas to other bookies")
    add_bookie_id_arguments(c, "the bookie id (as registered, e.g. bookie-2)")
    c.add_argument("--dry-run", action="store_true", help="list what would move; change nothing")
    c.add_argument("--recover-open", action="store_true",
                   help="fence and close open ledgers whose last segment names the bookie (their writer is gone)")
    c.add_argument("--rate-bytes-per-s", type=non_negative_int, default=REPLICATION_RATE_BYTES_PER_S_DEFAULT,
                   help="copy at most this many bytes per second (0: unlimited; default %(default)s)")
    c.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    add_etcd_arguments(c)
    c.add_argument("--json", action="store_true", help="print JSON")
    s = csub.add_parser("status", help="every bookie, the auditor, under-replicated ledgers, replication")
    add_etcd_arguments(s)
    s.add_argument("--json", action="store_true", help="print JSON")
    s.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for each bookie (default: 3)")
    s.add_argument("--etcd-quota-bytes", type=_quota_bytes, default=None,
                   help="the --quota-backend-bytes etcd runs with, used when etcd does not report its quota (3.5 "
                        f"does not; default: ${ETCD_QUOTA_BYTES_ENV}, or etcd's own default "
                        f"{ETCD_QUOTA_BYTES_DEFAULT})")
    u = csub.add_parser("underreplicated", help="list the ledgers marked as missing copies")
    add_etcd_arguments(u)
    u.add_argument("--json", action="store_true", help="print JSON")
    k = csub.add_parser("check", help="write a ledger, read it back, compare and delete it (a smoke test)")
    add_etcd_arguments(k)
    k.add_argument("--entries", type=_check_count, default=100, help="entries to write (1..100000; default 100)")
    k.add_argument("--entry-bytes", type=_check_size, default=1024,
                   help="bytes per entry (1..1048576; default 1024)")
    k.add_argument("--ensemble", type=_check_count, default=3, help="ensemble size (default 3)")
    k.add_argument("--write-quorum", type=_check_count, default=3, help="write quorum (default 3)")
    k.add_argument("--ack-quorum", type=_check_count, default=2, help="ack quorum (default 2)")
    k.add_argument("--json", action="store_true", help="print JSON")


CHECK_ENTRIES_MAX = 100_000
CHECK_ENTRY_BYTES_MAX = 1 << 20
# No etcd takes a quota this large (etcd suggests at most 8 GiB): a bigger number is a typo.


def _check_count(text: str) -> int:
    return _bounded(text, CHECK_ENTRIES_MAX)


def _check_size(text: str) -> int:
    return _bounded(text, CHECK_ENTRY_BYTES_MAX)


def run(args: Namespace) -> int:
    return run_async(f"octavo cluster {args.cluster_cmd}", _run(args))


async def _run(args: Namespace) -> int:
    async with cluster_client(args) as client:
        if args.cluster_cmd == "underreplicated":
            return await _underreplicated(client, args)
        if args.cluster_cmd == "status":
            return await status(client, args)
        if args.cluster_cmd == "check":
            return await _check(client, args)
        return await _recover(client, args)


async def _check(client: Any, args: Namespace) -> int:
    """Write, close, read back through a recovery open, compare, delete. Each step is timed and reported; the
    ledger is deleted even when a step fails, so a failing check leaves nothing behind."""

    try:
        from octavo.meta.ledger_metadata import check_quorums
        check_quorums(args.ensemble, args.write_quorum, args.ack_quorum)
    except Exception as e:
        raise CliError(str(e), EXIT_USAGE) from None
    payloads = [os.urandom(args.entry_bytes) for _ in range(args.entries)]
    steps: dict[str, float] = {}
    started = time.monotonic()
    writer = await client.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum,
                                        metadata={"octavo.io/purpose": "cluster check"})
    ledger_id = writer.ledger_id
    steps["create_s"] = time.monotonic() - started
    mismatched: list[int] = []
    try:
        t = time.monotonic()
        ids = await writer.append_many(payloads)
        await writer.close()
        steps["write_s"] = time.monotonic() - t
        if ids != list(range(len(payloads))):
            raise CliError(f"ledger {ledger_id}: the write acknowledged entries {_ids(ids)}, expected "
                           f"0..{len(payloads) - 1}")
        t = time.monotonic()
        reader = await client.open_ledger(ledger_id)
        if reader.last_entry_id != len(payloads) - 1:
            raise CliError(f"ledger {ledger_id}: closed at entry {reader.last_entry_id}, expected "
                           f"{len(payloads) - 1}")
        read = 0
        async for entry in reader.read(0, reader.last_entry_id):
            if entry.data != payloads[entry.entry_id]:
                mismatched.append(entry.entry_id)
            read += 1
        steps["read_s"] = time.monotonic() - t
        if read != len(payloads):
            raise CliError(f"ledger {ledger_id}: read {read} entries back, wrote {len(payloads)}")
    finally:
        with contextlib.suppress(Exception):
            await client.delete_ledger(ledger_id)
    ok = not mismatched
    result = {"ok": ok, "ledger": ledger_id, "entries": len(payloads), "entry_bytes": args.entry_bytes,
              "mismatched": mismatched, **{k: round(v, 3) for k, v in steps.items()}}
    if args.json:
        print_json(result)
    elif ok:
        print(f"ok: ledger {ledger_id}: wrote {len(payloads)} entries of {args.entry_bytes} bytes "
              f"(E{args.ensemble} Qw{args.write_quorum} Qa{args.ack_quorum}) in {steps['write_s']:.2f} s, read "
              f"them back identical in {steps['read_s']:.2f} s, deleted the ledger")
    if not ok:
        print(f"octavo cluster check: ledger {ledger_id}: {len(mismatched)} entries came back different: "
              f"{_ids(mismatched)}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


async def _underreplicated(client: Any, args: Namespace) -> int:
    from octavo.meta.underreplication import UnderReplication

    marks = UnderReplication(client.etcd, client.metadata_store.layout)
    now_ms = time.time() * 1000
    rows: list[dict[str, Any]] = []
    async for mark in marks.marks():
        rows.append({"ledger_id": mark.ledger_id, "missing": list(mark.missing), "marked_by": mark.by,
                     "marked_unix_ms": mark.marked_unix_ms, "age_s": round((now_ms - mark.marked_unix_ms) / 1000, 3),
                     "worker": await marks.lock_owner(mark.ledger_id)})
    damaged = await damage_rows(client)
    if args.json:
        print_json({"underreplicated": rows, "damaged": damaged})
        return EXIT_OK
    if not rows and not damaged:
        print("(no under-replicated ledgers, no damaged copies)", file=sys.stderr)
        return EXIT_OK
    if rows:
        print(table(["LEDGER", "MISSING", "AGE", "MARKED BY", "WORKER"], [
            [str(r["ledger_id"]), ",".join(r["missing"]), fmt_age(r["age_s"]), r["marked_by"], r["worker"] or "-"]
            for r in rows]))
    if damaged:
        print(table(["LEDGER", "DAMAGED ON", "ENTRIES", "RANGES", "AGE", "FOUND BY", "REASON"], [
            [str(r["ledger_id"]), r["bookie_id"], str(r["entries"]),
             ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in r["ranges"][:4])
             + (",..." if len(r["ranges"]) > 4 else ""), fmt_age(r["age_s"]), r["found_by"], r["reason"][:60]]
            for r in damaged]))
    return EXIT_OK


async def _recover(client: Any, args: Namespace) -> int:
    from octavo.client.replication import Replicator, ledgers_naming, recover_bookie
    from octavo.meta.metadata import MetadataStore

    bookie_id = resolve_bookie_id(args)
    store: MetadataStore = client.metadata_store
    registered = await client.bookies(refresh=True)
    if bookie_id in registered:
        raise CliError(f"bookie {bookie_id} is registered (alive, at {registered[bookie_id].address}): `recover` "
                       "is for a bookie that is gone for good. Stop it first (its registration then expires), or "
                       "move its data off while it runs with a decommission")
    if not args.dry_run and await store.read_cookie(bookie_id) is None and not await ledgers_naming(client, bookie_id):
        raise CliError(f"unknown bookie {bookie_id!r}: it has no cookie in cluster {store.layout.cluster!r} and no "
                       "ledger names it")
    started = time.monotonic()
    progress = _progress(not args.no_progress and not args.json and sys.stderr.isatty())

    replicator = Replicator(client, args.rate_bytes_per_s, REPLICATION_BATCH_BYTES_MAX_DEFAULT)
    result = await recover_bookie(client, bookie_id, replicator, by="cli", dry_run=args.dry_run,
                                  recover_open=args.recover_open, progress=progress)
    took = time.monotonic() - started
    out = {"bookie_id": bookie_id, "dry_run": args.dry_run, "ledgers": result.ledgers,
           "replicated": result.replicated, "left_open": result.left_open, "busy": result.busy,
           "lost": _lost_json(result.lost), "retry": result.retry,
           "entries_copied": result.entries_copied, "bytes_copied": result.bytes_copied,
           "segments_to_move": result.segments_to_move, "took_s": round(took, 3)}
    if args.json:
        print_json(out)
    elif args.dry_run:
        print(f"{len(result.ledgers)} ledgers name {bookie_id}; {result.segments_to_move} segments would get a "
              f"new bookie" + (f"; {len(result.left_open)} open ledgers' last segments are their writers' "
                               f"(--recover-open to take them): {_ids(result.left_open)}" if result.left_open else ""))
        if result.ledgers:
            print(f"ledgers: {_ids(result.ledgers)}")
    else:
        print(f"{bookie_id}: {len(result.replicated)} of {len(result.ledgers)} ledgers re-replicated, "
              f"{result.entries_copied} entries ({fmt_bytes(result.bytes_copied)}) copied in {took:.1f}s")
        if result.left_open:
            print(f"left to their writers (open; --recover-open to take them): {_ids(result.left_open)}")
        if result.busy:
            print(f"being re-replicated by another worker: {_ids(result.busy)}")
        if result.retry:
            print(f"some copies could not be read now (a registered replica did not answer; not lost): run the "
                  f"command again: {_ids(result.retry)}")
    for lost in result.lost:
        print(f"LOST: {lost}", file=sys.stderr)
    if args.dry_run:
        return EXIT_OK
    return EXIT_OK if result.done else EXIT_FAILED


def _progress(enabled: bool) -> Callable[[int, int, object], None]:
    """A progress line on stderr (a terminal only): ledgers done of all."""
    def progress(done: int, total: int, _: object) -> None:
        if enabled:
            print(f"\r{done}/{total} ledgers", end="" if done < total else "\n", file=sys.stderr, flush=True)
    return progress


def _lost_json(lost: list[Any]) -> list[dict[str, Any]]:
    return [{"ledger_id": x.ledger_id, "bookie": x.bookie, "first": x.first, "last": x.last} for x in lost]


def _ids(ids: list[int]) -> str:
    return ", ".join(map(str, ids[:50])) + (f" ... ({len(ids)} in all)" if len(ids) > 50 else "")


DECOMMISSION_PROGRESS_INTERVAL_S = 10.0  # how often a decommission waiting on open ledgers says so


def decommission(args: Namespace) -> int:
    """`octavo bookie decommission --bookie ID` (parsed in bookie.py). Interrupted (Ctrl-C) once the bookie is
    forced read-only, it says how to go on or undo it."""
    args.forced_read_only = False
    try:
        return run_async("octavo bookie decommission", _decommission_main(args))
    except KeyboardInterrupt:
        bookie = getattr(args, "resolved_bookie", None)
        if bookie and args.forced_read_only:
            where = _where_args(args)
            print(f"octavo bookie decommission: interrupted: {bookie} stays forced read-only and its ledgers stay "
                  f"marked under-replicated (bookies running autorecovery go on moving them). "
                  f"`octavo bookie decommission --bookie {bookie}{where}` goes on; `octavo bookie decommission "
                  f"--bookie {bookie}{where} --cancel` undoes it (marks removed, writable again)", file=sys.stderr)
        else:
            print("octavo bookie decommission: interrupted before anything changed", file=sys.stderr)
        return 130


def _where_args(args: Namespace) -> str:
    """The flags naming the cluster, as given, for a command to paste."""
    out = ""
    for flag, value in (("--etcd", args.etcd), ("--data-dir", args.dev_dir), ("--cluster", args.cluster)):
        if value:
            out += f" {flag} {value}"
    return out


async def _decommission_main(args: Namespace) -> int:
    args.resolved_bookie = resolve_bookie_id(args)
    async with cluster_client(args) as client:
        if args.cancel:
            return await _cancel_decommission(client, args, args.resolved_bookie)
        return await _decommission(client, args)


async def _set_read_only(client: Any, args: Namespace, bookie_id: str, address: str, read_only: bool) -> Any:
    import grpc

    from octavo.v1 import bookie_pb2 as pb
    from octavo.v1 import bookie_pb2_grpc as pb_grpc

    tls = cli_tls(resolve_target(args, required=False))
    async with aio_channel(address, tls, metadata=admin_metadata()) as channel:
        try:
            reason = "octavo bookie decommission" if read_only else ""
            request = pb.SetReadOnlyRequest(read_only=read_only, reason=reason)
            return await pb_grpc.BookieAdminStub(channel).SetReadOnly(request, timeout=10)
        except grpc.aio.AioRpcError as e:
            what = "force" if read_only else "release the forced read-only mode of"
            raise CliError(f"cannot {what} bookie {bookie_id} at {address}: {e.code().name}: "
                           f"{e.details()}") from None


async def _decommission(client: Any, args: Namespace) -> int:
    from octavo.client.replication import Replicator, check_enough_bookies, ledgers_naming, recover_bookie

    bookie_id = args.resolved_bookie
    store = client.metadata_store
    registered = await client.bookies(refresh=True)
    metas = await ledgers_naming(client, bookie_id)
    if bookie_id not in registered:
        if await store.read_cookie(bookie_id) is not None or metas:
            raise CliError(f"bookie {bookie_id} is not registered (it is down or gone): a decommission moves copies "
                           f"off a live bookie. To restore its copies from the other replicas, use `octavo cluster "
                           f"recover --bookie {bookie_id}`")
        raise CliError(f"unknown bookie {bookie_id!r}: it is not registered, has no cookie in cluster "
                       f"{store.layout.cluster!r}, and no ledger names it")
    await check_enough_bookies(client, bookie_id, metas)
    if args.dry_run:
        result = await recover_bookie(client, bookie_id, Replicator(client), dry_run=True)
        if args.json:
            print_json({"bookie_id": bookie_id, "dry_run": True, "ledgers": result.ledgers,
                        "segments_to_move": result.segments_to_move, "open_ledgers": result.left_open})
        else:
            print(f"{len(result.ledgers)} ledgers name {bookie_id}; {result.segments_to_move} segments would get a "
                  f"new bookie now; {len(result.left_open)} open ledgers wait for their writers to move off it")
        return EXIT_OK
    address = registered[bookie_id].address
    mode = await _set_read_only(client, args, bookie_id, address, True)
    args.forced_read_only = True
    if not args.json:
        print(f"{bookie_id}: forced read-only ({mode.reason}); moving its copies (Ctrl-C stops; run again to go "
              "on, or with --cancel to undo)", file=sys.stderr)
    started = time.monotonic()
    progress = _progress(not args.no_progress and not args.json and sys.stderr.isatty())

    result = await _move_off(client, bookie_id, Replicator(client, args.rate_bytes_per_s), args, progress)
    took = time.monotonic() - started
    out = {"bookie_id": bookie_id, "dry_run": False, "ledgers": result.ledgers, "replicated": result.replicated,
           "left_open": result.left_open, "retry": result.retry,
           "lost": _lost_json(result.lost),
           "entries_copied": result.entries_copied, "bytes_copied": result.bytes_copied,
           "retired": result.retired, "took_s": round(took, 3)}
    if args.json:
        print_json(out)
    elif result.retired:
        print(f"{bookie_id}: decommissioned: {len(result.replicated)} ledgers re-replicated, {result.entries_copied} "
              f"entries ({fmt_bytes(result.bytes_copied)}) copied in {took:.1f}s; its cookie is removed and its "
              "data directory can never rejoin. Stop its process now.")
    else:
        why = []
        if result.left_open:
            why.append(f"open ledgers whose writers have not moved off: {_ids(result.left_open)} (--recover-open "
                       "closes them)")
        if result.retry:
            why.append(f"ledgers whose copies a registered bookie did not answer for (nothing is lost; they are "
                       f"tried again): {_ids(result.retry)}")
        print(f"{bookie_id}: NOT decommissioned yet: {len(result.left_open) + len(result.retry)} ledgers still "
              f"name it after --wait-s {args.wait_s:g}s: {'; '.join(why)}. It stays read-only: run the command "
              "again to go on, or with --cancel to undo it.", file=sys.stderr)
    for lost in result.lost:
        print(f"LOST: {lost}", file=sys.stderr)
    return EXIT_OK if result.retired else EXIT_FAILED


async def _move_off(client: Any, bookie_id: str, replicator: Any, args: Namespace,
                    progress: Callable[[int, int, object], None]) -> Any:
    """decommission_bookie (octavo.client.replication), saying every DECOMMISSION_PROGRESS_INTERVAL_S which open
    ledgers it waits on and how long their writers have left (--wait-s)."""
    from octavo.client.replication import DECOMMISSION_POLL_S, BookieRecovery, ledgers_naming, recover_bookie
    from octavo.meta.underreplication import DECOMMISSION_BY

    total = BookieRecovery(bookie_id)
    loop = asyncio.get_running_loop()
    began = loop.time()
    deadline = began + args.wait_s
    next_note = began
    seen: set[int] = set()
    while True:
        run = await recover_bookie(client, bookie_id, replicator, by=f"{DECOMMISSION_BY} of {bookie_id}",
                                   recover_open=args.recover_open, progress=progress)
        seen.update(run.ledgers)
        total.replicated += [lid for lid in run.replicated if lid not in total.replicated]
        total.entries_copied += run.entries_copied
        total.bytes_copied += run.bytes_copied
        total.lost += run.lost
        if run.lost:
            break
        remaining = [m.ledger_id for m in await ledgers_naming(client, bookie_id)]
        if not remaining:
            await client.metadata_store.retire_bookie(bookie_id)
            total.retired = True
            break
        now = loop.time()
        if now >= deadline:
            total.retry = [lid for lid in remaining if lid in run.retry]
            total.left_open = [lid for lid in remaining if lid not in run.retry]
            break
        if not args.json and now >= next_note:
            next_note = now + DECOMMISSION_PROGRESS_INTERVAL_S
            unanswered = [lid for lid in remaining if lid in run.retry]
            still_open = [lid for lid in remaining if lid not in run.retry]
            waits = [f"{len(still_open)} open ledgers whose writers have not moved off it yet (their next add "
                     f"does; --recover-open closes them now): {_ids(still_open)}"] if still_open else []
            if unanswered:
                waits.append(f"{len(unanswered)} ledgers whose copies a registered bookie did not answer for, "
                             f"tried again: {_ids(unanswered)}")
            print(f"{bookie_id}: waiting on {'; and '.join(waits)}; the grace ends in {fmt_age(deadline - now)} "
                  f"(--wait-s {args.wait_s:g}), then this stops and what is left stays marked",
                  file=sys.stderr, flush=True)
        await asyncio.sleep(DECOMMISSION_POLL_S)
    total.ledgers = sorted(seen)
    return total


async def _cancel_decommission(client: Any, args: Namespace, bookie_id: str) -> int:
    """Undo an unfinished decommission: take the bookie out of every under-replication mark that names it (but
    damage marks: those are about copies that fail their checksum), then release its forced read-only mode.
    Copies already moved stay where they are; the bookie keeps the others."""
    from octavo.meta.etcd import Txn
    from octavo.meta.underreplication import DAMAGE_BY, UnderReplication

    store = client.metadata_store
    registered = await client.bookies(refresh=True)
    if bookie_id not in registered and await store.read_cookie(bookie_id) is None:
        raise CliError(f"bookie {bookie_id} has no cookie in cluster {store.layout.cluster!r} and is not "
                       "registered: it was decommissioned already (or never joined): nothing to cancel")
    marks = UnderReplication(client.etcd, store.layout)
    unmarked: list[int] = []
    async for mark in marks.marks():
        if bookie_id not in mark.missing or mark.by.startswith(DAMAGE_BY):
            continue
        current: Any = mark
        while current is not None and bookie_id in current.missing:  # CAS: a worker may change it meanwhile
            rest = tuple(b for b in current.missing if b != bookie_id)
            key = store.layout.underreplicated_ledger(current.ledger_id)
            txn = Txn().mod_revision_is(key, current.revision)
            ok, _ = await client.etcd.txn(txn.put(key, replace(current, missing=rest).encode()) if rest
                                          else txn.delete(key))
            if ok:
                unmarked.append(current.ledger_id)
                break
            current = await marks.get(current.ledger_id)
    released = False
    if bookie_id in registered:
        mode = await _set_read_only(client, args, bookie_id, registered[bookie_id].address, False)
        released = True
    out = {"bookie_id": bookie_id, "cancelled": True, "unmarked": unmarked, "released_read_only": released}
    if args.json:
        print_json(out)
        return EXIT_OK
    print(f"{bookie_id}: decommission cancelled: {len(unmarked)} ledgers no longer marked as missing its copies"
          + (f" ({_ids(unmarked)})" if unmarked else "") + "; copies already moved stay where they are")
    if released:
        print(f"{bookie_id}: {mode.reason}")
    else:
        print(f"{bookie_id} is not registered now (down?): once it runs, `octavo bookie writable --bookie "
              f"{bookie_id}` releases its forced read-only mode", file=sys.stderr)
    return EXIT_OK
