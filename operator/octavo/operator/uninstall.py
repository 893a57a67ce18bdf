"""`octavo operator uninstall`: what `helm uninstall` runs first (the chart's pre-delete hook).

    octavo operator uninstall --namespace NS [--bookie-cluster NAME ...] [--compaction-policy NAME ...]
                              [--delete-volumes SELECTOR ...] [--delete-pods SELECTOR ...] [--timeout-s S]
                              [--kubeconfig FILE]

Helm deletes a release's objects all at once: the operator could stop before it has let go of the
BookieClusters and CompactionPolicies it holds a finalizer on, and they would hang in Terminating with nothing
left to release them. So the hook deletes those first, while the operator still runs, and waits until they are
gone (their StatefulSets, Services and ConfigMaps go with them, through owner references). If the operator does
not release one within --timeout-s (it is not running), the hook removes the operator's finalizer itself.
Volumes are kept unless --delete-volumes names them by a label selector (a bookie's data outlives its pod and,
by default, the release). --delete-pods removes pods Helm leaves behind, such as a finished `helm test` pod
(Helm does not delete hook resources it keeps for their logs).

Exit codes: 0 done, 1 something could not be deleted (the message says what), 2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the kubernetes client is imported only when the command runs (CLI start-up stays fast)
    from octavo.operator.kube import Kube

from octavo.operator.names import GROUP, VERSION

EXIT_OK = 0
EXIT_FAILED = 1
API_VERSION = f"{GROUP}/{VERSION}"
FINALIZER = "octavo.io/finalizer"  # handlers.FINALIZER (not imported: it imports kopf)
POLL_S = 1.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--namespace", "-n", required=True, help="the release's namespace")
    p.add_argument("--bookie-cluster", action="append", default=[], metavar="NAME",
                   help="a BookieCluster to delete (repeatable)")
    p.add_argument("--compaction-policy", action="append", default=[], metavar="NAME",
                   help="a CompactionPolicy to delete, after the clusters (repeatable)")
    p.add_argument("--delete-volumes", action="append", default=[], metavar="SELECTOR",
                   help="delete the PersistentVolumeClaims matching this label selector (repeatable)")
    p.add_argument("--delete-pods", action="append", default=[], metavar="SELECTOR",
                   help="delete the pods matching this label selector, e.g. finished test pods (repeatable)")
    p.add_argument("--timeout-s", type=float, default=120.0,
                   help="seconds to wait for the operator to release each object (default: 120)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: the pod's service account, then $KUBECONFIG)")


def run(args: argparse.Namespace) -> int:
    if not 0 < args.timeout_s <= 3600:
        print(f"octavo operator uninstall: --timeout-s must be in (0, 3600], got {args.timeout_s}", file=sys.stderr)
        return 2
    from octavo.operator.kube import Kube, KubeError, load_api_client

    kube = Kube(load_api_client(args.kubeconfig))
    try:
        return asyncio.run(uninstall(kube, args.namespace, args.bookie_cluster, args.compaction_policy,
                                     args.delete_volumes, args.timeout_s, pod_selectors=args.delete_pods))
    except KubeError as e:
        print(f"octavo operator uninstall: {e}", file=sys.stderr)
        return EXIT_FAILED


async def uninstall(kube: Kube, namespace: str, clusters: list[str], policies: list[str], volume_selectors: list[str],
                    timeout_s: float, out: Any = None, pod_selectors: list[str] | None = None) -> int:
    out = out or sys.stdout
    for selector in pod_selectors or []:
        for pod in await kube.list("v1", "pods", namespace, selector):
            await kube.delete("v1", "pods", namespace, pod["metadata"]["name"])
            print(f"deleted Pod {namespace}/{pod['metadata']['name']}", file=out, flush=True)
    # Clusters first: a cluster's poll reads its policy.
    for plural, names in (("bookieclusters", clusters), ("compactionpolicies", policies)):
        for name in names:
            await _delete_and_wait(kube, namespace, plural, name, timeout_s, out)
    for selector in volume_selectors:
        claims = await kube.list("v1", "persistentvolumeclaims", namespace, selector)
        for claim in claims:
            claim_name = claim["metadata"]["name"]
            await kube.delete("v1", "persistentvolumeclaims", namespace, claim_name)
            print(f"deleted PersistentVolumeClaim {namespace}/{claim_name}", file=out, flush=True)
        if not claims:
            print(f"no PersistentVolumeClaim in {namespace} matches {selector}", file=out, flush=True)
    return EXIT_OK


async def _delete_and_wait(kube: Kube, namespace: str, plural: str, name: str, timeout_s: float, out: Any) -> None:
    what = f"{plural}/{name} in {namespace}"
    if not await kube.delete(API_VERSION, plural, namespace, name):
        print(f"{what}: already gone", file=out, flush=True)
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await kube.get(API_VERSION, plural, namespace, name) is None:
            print(f"{what}: deleted (the operator released it)", file=out, flush=True)
            return
        await asyncio.sleep(POLL_S)
    body = await kube.get(API_VERSION, plural, namespace, name)
    if body is None:
        print(f"{what}: deleted", file=out, flush=True)
        return
    finalizers = [f for f in body.get("metadata", {}).get("finalizers") or [] if f != FINALIZER]
    await kube.patch(API_VERSION, plural, namespace, name, {"metadata": {"finalizers": finalizers or None}})
    print(f"{what}: the operator did not release it within {timeout_s:g} s (is it running?); removed its "
          f"finalizer", file=out, flush=True)
