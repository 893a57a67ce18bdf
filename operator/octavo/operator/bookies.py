"""The operator's calls to bookies, over their admin API (gRPC): what each one reports, turned into the
`Observed` the policy decides from, and the policy's actions carried out.

A bookie that does not answer within the timeout is observed as unreachable (the policy then leaves it alone);
an action that fails comes back as a message for the BookieCluster's events, never as an exception.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import grpc

from octavo.meta.tls import TlsFiles, admin_token_metadata, aio_channel
from octavo.operator.policy import CLOSE_WINDOW, FORCE_READ_ONLY, OPEN_WINDOW, RELEASE_READ_ONLY, Action, Observed
from octavo.v1 import bookie_pb2 as pb
from octavo.v1 import bookie_pb2_grpc as pb_grpc

ADMIN_TIMEOUT_S = 5.0


def _admin_metadata() -> tuple[tuple[str, str], ...]:
    """The operator's admin token for bookies that require one: the file $OCTAVO_ADMIN_TOKEN_FILE names."""
    return admin_token_metadata(os.environ.get("OCTAVO_ADMIN_TOKEN_FILE", ""))


def observed_from_status(bookie_id: str, status: pb.BookieStatus) -> Observed:
    usage = max((d.usage_ratio for d in status.directories), default=0.0)
    return Observed(bookie_id=bookie_id, reachable=True, writable=status.mode == pb.MODE_WRITABLE,
                    forced_read_only=status.forced_read_only, disk_usage_ratio=usage,
                    compacting=status.compaction.running,
                    window_until_unix_ms=status.compaction.window_until_unix_ms,
                    last_compaction_unix_ms=status.compaction.last_run.finished_unix_ms,
                    scrub_last_pass_unix_ms=status.scrub.last_pass_unix_ms,
                    damaged_entries=status.scrub.damage_entries_damaged)


@dataclass(frozen=True)
class Reach:
    """How the operator reaches one cluster's bookies: plaintext (tls None), or TLS with the operator's own
    certificate ($OCTAVO_TLS_*), checking each bookie's certificate against its DNS name (the operator dials
    the pod IP, which the certificate does not name)."""

    tls: TlsFiles | None = None
    server_names: Mapping[str, str] = field(default_factory=dict)

    def channel_options(self, bookie_id: str) -> tuple[tuple[str, str], ...]:
        name = self.server_names.get(bookie_id, "") if self.tls is not None else ""
        return (("grpc.ssl_target_name_override", name),) if name else ()


PLAINTEXT = Reach()


async def observe_one(bookie_id: str, address: str, timeout_s: float = ADMIN_TIMEOUT_S,
                      reach: Reach = PLAINTEXT) -> Observed:
    if not address:
        return Observed(bookie_id, reachable=False)
    try:
        async with aio_channel(address, reach.tls, reach.channel_options(bookie_id),
                               metadata=_admin_metadata()) as channel:
            status = await pb_grpc.BookieAdminStub(channel).GetStatus(pb.GetStatusRequest(), timeout=timeout_s)
    except grpc.RpcError:
        return Observed(bookie_id, reachable=False)
    return observed_from_status(bookie_id, status)


async def observe(addresses: Mapping[str, str], timeout_s: float = ADMIN_TIMEOUT_S,
                  reach: Reach = PLAINTEXT) -> list[Observed]:
    """Every bookie of the cluster at once (bookie id -> address; an empty address: no pod IP yet)."""
    ids = sorted(addresses)
    return list(await asyncio.gather(*(observe_one(b, addresses[b], timeout_s, reach) for b in ids)))


async def apply_one(action: Action, address: str, timeout_s: float = ADMIN_TIMEOUT_S,
                    reach: Reach = PLAINTEXT) -> str:
    """Carry out one action; the error in words, or "" when it was done."""
    try:
        async with aio_channel(address, reach.tls, reach.channel_options(action.bookie_id),
                               metadata=_admin_metadata()) as channel:
            admin = pb_grpc.BookieAdminStub(channel)
            if action.kind in (FORCE_READ_ONLY, RELEASE_READ_ONLY):
                force = action.kind == FORCE_READ_ONLY
                request = pb.SetReadOnlyRequest(read_only=force, reason=f"the operator: {action.reason}"[:512]
                                                if force else "", threshold_ratio=action.threshold_ratio)
                await admin.SetReadOnly(request, timeout=timeout_s)
            elif action.kind in (OPEN_WINDOW, CLOSE_WINDOW):
                await admin.SetCompactionWindow(pb.SetCompactionWindowRequest(until_unix_ms=action.until_unix_ms),
                                                timeout=timeout_s)
            else:
                return f"unknown action {action.kind}"
    except grpc.RpcError as e:
        return f"{action.kind} on bookie {action.bookie_id} at {address} failed: {e.code().name}: {e.details()}"
    return ""


async def apply(actions: Sequence[Action], addresses: Mapping[str, str],
                timeout_s: float = ADMIN_TIMEOUT_S, reach: Reach = PLAINTEXT) -> list[tuple[Action, str]]:
    """Every action, in order per bookie; returns each with its error ("" when done)."""
    results = []
    for action in actions:
        address = addresses.get(action.bookie_id, "")
        error = await apply_one(action, address, timeout_s, reach) if address else (
            f"{action.kind} on bookie {action.bookie_id}: no address (its pod has no IP)")
        results.append((action, error))
    return results


def after(observed: Sequence[Observed], results: Sequence[tuple[Action, str]]) -> list[Observed]:
    """What the bookies look like once the actions that succeeded took effect (for a status that is current
    at once rather than one poll later)."""
    by_id = {b.bookie_id: b for b in observed}
    for action, error in results:
        b = by_id.get(action.bookie_id)
        if error or b is None:
            continue
        if action.kind == FORCE_READ_ONLY:
            b = replace(b, writable=False, forced_read_only=True)
        elif action.kind == RELEASE_READ_ONLY:
            b = replace(b, forced_read_only=False, writable=True)
        elif action.kind in (OPEN_WINDOW, CLOSE_WINDOW):
            b = replace(b, window_until_unix_ms=action.until_unix_ms)
        by_id[b.bookie_id] = b
    return [by_id[b.bookie_id] for b in observed]
