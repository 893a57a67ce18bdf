"""`octavo cluster status`: every bookie (writable, read-only, forced and by whom at what threshold, gone) with
its disk and compaction; the auditor and its replicas check; under-replicated ledgers and re-replication in
progress; damaged copies; and etcd's health (its alarms, its database against its quota). A raised NOSPACE or
CORRUPT alarm comes first, in capitals: etcd refuses writes. `--json` gives the same as one object.
"""

from __future__ import annotations

import asyncio
import os
import time
from argparse import ArgumentTypeError, Namespace
from typing import Any

from octavo.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    admin_metadata,
    cli_tls,
    fmt_age,
    print_json,
    resolve_target,
    table,
)
from octavo.meta.etcdhealth import ETCD_QUOTA_BYTES_DEFAULT, etcd_health
from octavo.meta.tls import aio_channel

# The etcd quota `cluster status` measures the database against when etcd does not report its own (3.5 does not).
ETCD_QUOTA_BYTES_ENV = "OCTAVO_ETCD_QUOTA_BYTES"
ETCD_QUOTA_BYTES_MAX = 1 << 40


def bounded_int(text: str, high: int) -> int:
    """A flag's integer in 1..high, or the argparse error that says why not."""
    try:
        value = int(text)
    except ValueError:
        raise ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 1 <= value <= high:
        raise ArgumentTypeError(f"must be in 1..{high}, got {value}")
    return value


def quota_bytes(text: str) -> int:
    return bounded_int(text, ETCD_QUOTA_BYTES_MAX)


async def damage_rows(client: Any) -> list[dict[str, Any]]:
    """The damage marks (octavo.meta.damage): copies on a bookie that fail their checksum, until repaired."""
    from octavo.meta.damage import Damage

    now_ms = time.time() * 1000
    return [{"ledger_id": m.ledger_id, "bookie_id": m.bookie_id, "entries": m.entries,
             "ranges": [list(r) for r in m.ranges], "reason": m.reason, "found_by": m.found_by,
             "marked_unix_ms": m.marked_unix_ms, "age_s": round((now_ms - m.marked_unix_ms) / 1000, 3)}
            async for m in Damage(client.etcd, client.metadata_store.layout).marks()]


async def _bookie_status(address: str, timeout_s: float, tls: Any) -> tuple[Any, str]:
    """A bookie's admin status, or None and why it could not be had."""
    import grpc

    from octavo.v1 import bookie_pb2 as pb
    from octavo.v1 import bookie_pb2_grpc as pb_grpc

    async with aio_channel(address, tls, metadata=admin_metadata()) as channel:
        try:
            return await pb_grpc.BookieAdminStub(channel).GetStatus(pb.GetStatusRequest(), timeout=timeout_s), ""
        except grpc.aio.AioRpcError as e:
            return None, f"{e.code().name}: {e.details()}"


async def status(client: Any, args: Namespace) -> int:
    """`octavo cluster status`: one read of the whole cluster (see the module docstring)."""
    from octavo.meta.underreplication import UnderReplication

    layout = client.metadata_store.layout
    registered, cookies = await client.bookies(refresh=True), await client.metadata_store.cookie_holders()
    auditor_kv = await client.etcd.get(layout.auditor)
    auditor = auditor_kv.value.decode() if auditor_kv is not None else None
    ids = sorted(set(registered) | cookies)
    tls = cli_tls(resolve_target(args, required=False))
    statuses = await asyncio.gather(*(_bookie_status(registered[b].address, args.timeout, tls) if b in registered
                                      else _absent() for b in ids))
    auditor_status = next((st for b, (st, _) in zip(ids, statuses, strict=True) if b == auditor and st), None)
    missing_since = dict(auditor_status.autorecovery.missing_since_unix_ms) if auditor_status else {}
    now_ms = time.time() * 1000
    replicas = _replicas_check(auditor_status.autorecovery if auditor_status else None,
                               len(await client.etcd.get_prefix(layout.replicas_missing)), now_ms)
    bookies = [_bookie_row(b, registered.get(b), st, error, missing_since, now_ms)
               for b, (st, error) in zip(ids, statuses, strict=True)]
    count, missing, oldest_ms = await _marks_summary(UnderReplication(client.etcd, layout))
    locks = await client.etcd.get_prefix(layout.replication_locks)
    damaged = await damage_rows(client)
    etcd, etcd_summary = await _etcd_status(client, _etcd_quota_setting(args))
    out = {"cluster": layout.cluster, "bookies": bookies, "auditor": auditor, "etcd": etcd, "replicas_check": replicas,
           "underreplicated": {"ledgers": count, "missing_bookies": sorted(missing),
                               "oldest_mark_age_s": round((now_ms - oldest_ms) / 1000, 1) if oldest_ms else None},
           "replication_in_progress": [{"ledger_id": layout.ledger_id_under(layout.replication_locks,
                                                                            kv.key),
                                        "worker": kv.value.decode()} for kv in locks],
           "damaged": {"ledgers": len({d["ledger_id"] for d in damaged}), "entries": sum(d["entries"] for d in damaged),
                       "by_bookie": {b: sum(d["entries"] for d in damaged if d["bookie_id"] == b)
                                     for b in sorted({d["bookie_id"] for d in damaged})}}}
    if args.json:
        print_json(out)
        return EXIT_OK
    # What stops the whole cluster comes first, where nobody can miss it (and again beside etcd's figures).
    for problem in etcd.get("problems", []):
        if "REFUSES" in problem:
            print(f"!!! {problem}")
    print(f"cluster {layout.cluster}: {sum(1 for b in bookies if b['state'] != 'gone')} of {len(bookies)} bookies "
          f"registered; auditor {auditor or '(none)'}")
    print(table(["BOOKIE", "STATE", "DISK", "COMPACTION", "REPLICATING", "ADDRESS", "METRICS"], [
        [b["id"], b["state"] + (" (forced)" if b.get("forced_read_only") else "")
         + (f" for {fmt_age(b['gone_for_s'])}" if "gone_for_s" in b else ""),
         disk_cell(b) if "disk_usage_ratio" in b else ("unreachable: " + b["error"] if "error" in b else "-"),
         b.get("compaction", "-"), str(len(b.get("replicating_ledgers", []))) if "replicating_ledgers" in b else "-",
         b["address"] or "-", f"http://{b['metrics_address']}/metrics" if b.get("metrics_address") else "-"]
        for b in bookies]))
    print(_replicas_line(replicas))
    ur = out["underreplicated"]
    assert isinstance(ur, dict)
    if ur["ledgers"]:
        print(f"under-replicated: {ur['ledgers']} ledgers missing copies of {', '.join(ur['missing_bookies'])}; "
              f"oldest mark {fmt_age(ur['oldest_mark_age_s'])} old; {len(locks)} being re-replicated now")
    else:
        print("under-replicated: none")
    dm = out["damaged"]
    assert isinstance(dm, dict)
    if dm["entries"]:
        print(f"damaged copies: {dm['entries']} entries of {dm['ledgers']} ledgers, being repaired in place ("
              + ", ".join(f"{b}: {n}" for b, n in dm["by_bookie"].items()) + ")")
    else:
        print("damaged copies: none")
    if "error" in etcd:
        print(f"etcd: status unavailable: {etcd['error']}")
    else:
        print(f"etcd: {etcd_summary}")
        for problem in etcd["problems"]:
            print(f"etcd: {problem}")
    return EXIT_OK


def _bookie_row(bookie_id: str, info: Any, st: Any, error: str, missing_since: dict[str, int],
                now_ms: float) -> dict[str, Any]:
    """One bookie's line of `cluster status` (its registration `info`, its BookieStatus `st` if it answered)."""
    row: dict[str, Any] = {"id": bookie_id, "address": info.address if info else None,
                           "state": ("read-only" if info.readonly else "writable") if info else "gone"}
    if info is None and bookie_id in missing_since:
        row["gone_for_s"] = round((now_ms - missing_since[bookie_id]) / 1000, 1)
    if st is None:
        return {**row, "error": error} if info is not None else row
    return {**row,
            "forced_read_only": st.forced_read_only, "mode_reason": st.mode_reason,
            "forced_reason": st.forced_reason or None, "forced_threshold_ratio": st.forced_threshold_ratio or None,
            "disk_usage_ratio": max((d.usage_ratio for d in st.directories), default=0.0),
            "disk_readonly_ratio": st.disk_readonly_ratio, "disk_writable_ratio": st.disk_writable_ratio,
            "compaction": ("suspended" if st.compaction.suspended else
                           f"running {st.compaction.running_kind}" if st.compaction.running else "idle"),
            "replicating_ledgers": list(st.autorecovery.replicating_ledgers),
            "ledgers": st.ledger_count, "version": st.version,
            # Where the figures below are served as metrics (docs/operations.md maps fields to metrics).
            "metrics_address": st.metrics_address or None}


async def _marks_summary(marks: Any) -> tuple[int, set[str], int | None]:
    """How many ledgers are marked under-replicated, the bookies they miss, and the oldest mark's time."""
    count, missing, oldest_ms = 0, set(), None
    async for mark in marks.marks():
        count += 1
        missing.update(mark.missing)
        oldest_ms = mark.marked_unix_ms if oldest_ms is None else min(oldest_ms, mark.marked_unix_ms)
    return count, missing, oldest_ms


def disk_cell(b: dict[str, Any]) -> str:
    """Disk usage and the read-only threshold in force: the bookie's own watermark, unless something forced it
    read-only (the operator at its CompactionPolicy's readOnlyRatio, or `octavo bookie readonly`): then the
    forced mode holds whatever the disk, and the bookie's own mark does not apply until it is released."""
    usage = f"{b['disk_usage_ratio']:.0%}"
    if b.get("forced_read_only"):
        threshold = b.get("forced_threshold_ratio")
        at = f" at {threshold:.0%}" if threshold else ""
        by = str(b.get("forced_reason") or "").split(":")[0] or "an administrator"
        return f"{usage} (read-only forced by {by}{at}; its own mark {b['disk_readonly_ratio']:.0%})"
    return f"{usage} (read-only at {b['disk_readonly_ratio']:.0%})"


def _etcd_quota_setting(args: Namespace) -> int:
    """--etcd-quota-bytes, else $OCTAVO_ETCD_QUOTA_BYTES, else etcd's own default."""
    if args.etcd_quota_bytes is not None:
        return int(args.etcd_quota_bytes)
    text = os.environ.get(ETCD_QUOTA_BYTES_ENV, "")
    if not text:
        return ETCD_QUOTA_BYTES_DEFAULT
    try:
        return quota_bytes(text)
    except ArgumentTypeError as e:
        raise CliError(f"${ETCD_QUOTA_BYTES_ENV}: {e}", EXIT_USAGE) from None


async def _etcd_status(client: Any, quota_bytes_setting: int) -> tuple[dict[str, Any], str]:
    """The health of the etcd member the client talks to (its database against its quota, and the cluster's
    alarms: docs/operations.md, "What an etcd for Octavo needs"), and its one-line summary."""
    from octavo.meta.errors import MetadataUnavailableError

    try:
        st = await client.etcd.status()
    except MetadataUnavailableError as e:  # the rest of the status stays useful without it
        return {"error": str(e)}, ""
    health = etcd_health(st, quota_bytes_setting)
    return health.to_json(), health.summary()


def _replicas_check(state: Any, marks_open: int, now_ms: float) -> dict[str, Any]:
    """The auditor's replicas check (node/octavo/node/replicascheck.py) as its status says; figures are None when
    the auditor could not be asked or has made no pass yet."""
    last_ms = state.replicas_check_last_unix_ms if state is not None else 0
    return {"interval_s": state.replicas_check_interval_s if state is not None else None,
            "last_pass_age_s": round((now_ms - last_ms) / 1000, 1) if last_ms else None,
            "missing_entries": state.replicas_missing_entries if last_ms else None,
            "ledgers_marked": state.replicas_ledgers_marked if last_ms else None,
            "extra_copies": state.replicas_extra_copies if last_ms else None,
            "marks_open": marks_open}


def _replicas_line(rc: dict[str, Any]) -> str:
    if rc["interval_s"] is None:
        return f"replicas check: the auditor did not answer; {rc['marks_open']} ledgers marked missing copies"
    if not rc["interval_s"]:
        return "replicas check: off (replicas_check_interval_s = 0)"
    every = f"replicas check: every {fmt_age(rc['interval_s'])}"
    if rc["last_pass_age_s"] is None:
        return f"{every}, no pass yet"
    return (f"{every}, last pass {fmt_age(rc['last_pass_age_s'])} ago: {rc['missing_entries']} entries missing a "
            f"copy ({rc['ledgers_marked']} ledgers marked, {rc['marks_open']} marks left to restore), "
            f"{rc['extra_copies']} copies outside their ensembles (collectable)")


async def _absent() -> tuple[Any, str]:
    return None, "not registered"
