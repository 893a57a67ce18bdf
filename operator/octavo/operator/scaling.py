"""Scale-down through decommission: the highest ordinal's copies move to the other bookies and its identity is
retired before its pod goes (`octavo bookie decommission`'s steps, run by the operator).

A step is resumable: the operator runs it again after a restart or a refusal, and it starts from what still
names the bookie. It never retires a bookie while a ledger still names it, and refuses (with the reason, for
the BookieCluster's condition) when the other bookies cannot hold some ledger's ensemble or entries would be
lost.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import grpc

from octavo.client import Client, ClientOptions
from octavo.client.replication import (
    Replicator,
    check_enough_bookies,
    decommission_bookie,
    ledgers_naming,
)
from octavo.meta.errors import OctavoError
from octavo.meta.tls import TlsFiles, admin_token_metadata, aio_channel
from octavo.v1 import bookie_pb2 as pb
from octavo.v1 import bookie_pb2_grpc as pb_grpc


def _admin_metadata() -> tuple[tuple[str, str], ...]:
    """The operator's admin token for bookies that require one: the file $OCTAVO_ADMIN_TOKEN_FILE names."""
    return admin_token_metadata(os.environ.get("OCTAVO_ADMIN_TOKEN_FILE", ""))


@dataclass(frozen=True)
class ScaleDownStep:
    bookie_id: str
    retired: bool
    refused: bool          # True: it cannot go on as things are (the message says what to change)
    message: str
    bytes_copied: int = 0


async def decommission_step(etcd: str, cluster: str, bookie_id: str, rate_bytes_per_s: int, wait_s: float,
                            admin_timeout_s: float = 10.0, tls: TlsFiles | None = None) -> ScaleDownStep:
    """`tls`: the operator's certificate when the cluster's bookies serve TLS (None: plaintext). etcd is reached
    with the operator's own etcd settings ($OCTAVO_ETCD_*)."""
    tls = tls or TlsFiles()
    try:
        secure = operator_etcd_settings()
        options = ClientOptions(tls_ca_file=tls.ca_file, tls_cert_file=tls.cert_file, tls_key_file=tls.key_file,
                                etcd_tls_ca_file=secure["etcd_tls_ca_file"],
                                etcd_tls_cert_file=secure["etcd_tls_cert_file"],
                                etcd_tls_key_file=secure["etcd_tls_key_file"], etcd_username=secure["etcd_username"],
                                etcd_password_file=secure["etcd_password_file"])
        async with Client(etcd, cluster, options) as client:
            return await _step(client, bookie_id, rate_bytes_per_s, wait_s, admin_timeout_s, tls)
    except OctavoError as e:
        return ScaleDownStep(bookie_id, False, True, f"decommission of {bookie_id} stopped: {e}")


def operator_etcd_settings() -> dict[str, str]:
    """etcd over TLS and with authentication for the operator: $OCTAVO_ETCD_TLS_CA_FILE,
    $OCTAVO_ETCD_TLS_CERT_FILE, $OCTAVO_ETCD_TLS_KEY_FILE, $OCTAVO_ETCD_USERNAME, $OCTAVO_ETCD_PASSWORD_FILE."""
    names = {"etcd_tls_ca_file": "OCTAVO_ETCD_TLS_CA_FILE", "etcd_tls_cert_file": "OCTAVO_ETCD_TLS_CERT_FILE",
             "etcd_tls_key_file": "OCTAVO_ETCD_TLS_KEY_FILE", "etcd_username": "OCTAVO_ETCD_USERNAME",
             "etcd_password_file": "OCTAVO_ETCD_PASSWORD_FILE"}
    return {field: os.environ.get(var, "") for field, var in names.items()}


async def _step(client: Client, bookie_id: str, rate_bytes_per_s: int, wait_s: float,
                admin_timeout_s: float, tls: TlsFiles) -> ScaleDownStep:
    registered = await client.bookies(refresh=True)
    metas = await ledgers_naming(client, bookie_id)
    if bookie_id not in registered:
        if metas:
            return ScaleDownStep(bookie_id, False, True, (
                f"bookie {bookie_id} is not registered (down) and {len(metas)} ledgers name it: a scale-down moves "
                "copies off a live bookie; bring it back, or let autorecovery (or `octavo cluster recover`) "
                "restore its copies first"))
        if await client.metadata_store.read_cookie(bookie_id) is not None:
            await client.metadata_store.retire_bookie(bookie_id)
        return ScaleDownStep(bookie_id, True, False, f"bookie {bookie_id} held no ledger; retired")
    await check_enough_bookies(client, bookie_id, metas)
    address = registered[bookie_id].address
    try:
        async with aio_channel(address, tls if tls.enabled else None, metadata=_admin_metadata()) as channel:
            request = pb.SetReadOnlyRequest(read_only=True, reason="the operator: a scale-down moves its copies off")
            await pb_grpc.BookieAdminStub(channel).SetReadOnly(request, timeout=admin_timeout_s)
    except grpc.RpcError as e:
        return ScaleDownStep(bookie_id, False, False, f"cannot force bookie {bookie_id} at {address} read-only: "
                                                      f"{e.code().name}: {e.details()}")
    result = await decommission_bookie(client, bookie_id, Replicator(client, rate_bytes_per_s), wait_s=wait_s)
    if result.lost:
        lost = "; ".join(str(x) for x in result.lost[:5])
        return ScaleDownStep(bookie_id, False, True, f"decommission of {bookie_id} would lose entries ({lost}): "
                                                     "the scale-down stops with the bookie read-only",
                             result.bytes_copied)
    if not result.retired:
        return ScaleDownStep(bookie_id, False, False, (
            f"decommissioning {bookie_id}: {len(result.left_open)} open ledgers still name it, waiting for their "
            "writers to move off"), result.bytes_copied)
    return ScaleDownStep(bookie_id, True, False, (
        f"decommissioned {bookie_id}: {len(result.replicated)} ledgers re-replicated, {result.bytes_copied} bytes "
        "copied; its identity is retired"), result.bytes_copied)
