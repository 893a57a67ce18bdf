"""Tenants: client identities limited to the ledgers of some datasets (docs/security.md).

`tenant_prefixes = "spark-sales=sales.,eu-sales.;spark-ads=ads."` limits the client certificate named
`spark-sales` (common name or a DNS/URI SAN, as admin_identities) to ledgers whose dataset (the `octavo.dataset`
entry of the ledger's custom metadata, which the Spark data source and the dataset API set) starts with `sales.`
or `eu-sales.`, and `spark-ads` to `ads.`. Every data-plane call of a listed identity (adds, reads, tail reads,
LAC reads and fences, write-close) is checked; a ledger outside its prefixes, without a dataset, or unknown to
etcd is refused with the result code PERMISSION_DENIED and a message naming the identity, the ledger and what
its prefixes are. Identities not listed (the bookies themselves, the operator, other trusted clients) are not
limited. The check needs the caller's certificate (tls_client_auth require) and etcd (a ledger's dataset is in
its metadata there): a ledger's dataset is read once and cached (it never changes after creation), so a
tenant's steady-state cost is one dict lookup per ledger of a request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from octavo.node.adminauth import peer_identities
from octavo.node.config import TenantSettingError, parse_tenants

__all__ = ["DATASET_CACHE_MAX", "Tenant", "TenantPolicy", "TenantSettingError", "parse_tenants"]

DATASET_CACHE_MAX = 100_000


@dataclass(frozen=True)
class Tenant:
    identity: str
    prefixes: tuple[str, ...]

    def allows(self, dataset: str | None) -> bool:
        return dataset is not None and dataset != "" and dataset.startswith(self.prefixes)


class TenantPolicy:
    def __init__(self, setting: str, dataset_of: Callable[[int], Awaitable[str | None]]) -> None:
        """`dataset_of(ledger_id)`: the ledger's dataset from etcd ("" without one, None if it does not exist)."""
        self.tenants = parse_tenants(setting)
        self._dataset_of = dataset_of
        self._datasets: dict[int, str] = {}
        self.refusals = 0

    def tenant(self, context: Any) -> Tenant | None:
        """The caller's tenant, None when its identity is not limited."""
        for name in peer_identities(context.auth_context()):
            prefixes = self.tenants.get(name)
            if prefixes is not None:
                return Tenant(name, prefixes)
        return None

    async def refusal(self, tenant: Tenant, ledger_id: int) -> str:
        """"" when the tenant may touch the ledger, else the message to refuse it with."""
        dataset = self._datasets.get(ledger_id)
        if dataset is None:
            try:
                found = await self._dataset_of(ledger_id)
            except Exception as e:  # etcd unreachable: refuse, and say so (never allow on doubt)
                self.refusals += 1
                return f"cannot check ledger {ledger_id}'s dataset in etcd for {tenant.identity}: {e}"
            if found is None:
                self.refusals += 1
                return (f"{tenant.identity} may only use ledgers of datasets under {', '.join(tenant.prefixes)}; "
                        f"ledger {ledger_id} does not exist")
            dataset = found
            self._datasets[ledger_id] = dataset
            if len(self._datasets) > DATASET_CACHE_MAX:
                del self._datasets[next(iter(self._datasets))]
        if tenant.allows(dataset):
            return ""
        self.refusals += 1
        what = f"dataset {dataset!r}" if dataset else "no dataset"
        return (f"{tenant.identity} may only use ledgers of datasets under {', '.join(tenant.prefixes)} "
                f"(tenant_prefixes); ledger {ledger_id} has {what}")
