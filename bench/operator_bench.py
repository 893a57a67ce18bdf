"""The operator's cost, in one run:

1. On the cluster: a writer's add throughput (1 KB entries, E3/Qw3/Qa2, batches of 100, in a process of its
   own) on 3 real bookies run by the pod runner, with no operator, with `octavo operator run` polling every
   bookie at the default interval (10 s), and at 1 s. The phases alternate within each round; medians.
2. How one reconcile grows with the cluster: 3, 30 and 300 emulated bookies (a BookieAdmin gRPC server bound
   to one loopback address per bookie, answering GetStatus with a fixed status; the pods written straight into
   the emulated API), timing the operator's whole poll of a cluster (the API calls, the admin calls to every
   bookie, the pure decision, the status patch) and the pure decision alone.

Writes the `operator` section of docs/benchmarks.md.
Usage: python bench/operator_bench.py [--rounds N] [--phase-s S] [--no-report]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The emulated Kubernetes API (kmock) and pod runner: bench-only, not installed (bench/emulator/README.md).
sys.path.insert(0, str(Path(__file__).resolve().parent / "emulator"))

from common import machine_line, median, table, write_section

from octavo.cli.localcluster import EtcdProcess, free_port
from octavo.localk8s.apiserver import ApiServer
from octavo.localk8s.podrunner import PodRunner

WRITER = r"""
import asyncio, sys, time
from octavo.client import Client
async def main(etcd, seconds):
    async with Client(etcd, "bench") as client:
        handles = [await client.create_ledger(3, 3, 2) for _ in range(4)]
        entry = b"x" * 1024
        count = 0
        deadline = time.monotonic() + seconds
        async def one(h):
            nonlocal count
            while time.monotonic() < deadline:
                await h.append_many([entry] * 100)
                count += 100
        start = time.monotonic()
        await asyncio.gather(*(one(h) for h in handles))
        print(count / (time.monotonic() - start))
asyncio.run(main(sys.argv[1], float(sys.argv[2])))
"""


def _request(url: str, method: str, body: Any = None, content_type: str = "application/json") -> Any:
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": content_type})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


def cluster_cost(rounds: int, phase_s: float) -> dict[str, list[float]]:
    root = Path(tempfile.mkdtemp(prefix="octavo-operator-bench-", dir=os.environ.get("OCTAVO_BENCH_DIR")))
    etcd = EtcdProcess(str(root / "etcd"))
    results: dict[str, list[float]] = {"none": [], "10 s": [], "1 s": []}
    try:
        endpoint = etcd.start()
        with ApiServer() as api, PodRunner(api.url, str(root / "kube")) as runner:
            base = f"{api.url}/apis/octavo.io/v1alpha1/namespaces/default/bookieclusters"
            _request(base, "POST", {"apiVersion": "octavo.io/v1alpha1", "kind": "BookieCluster",
                                    "metadata": {"name": "bench", "namespace": "default"},
                                    "spec": {"replicas": 3, "image": "octavo:dev", "storage": {"size": "1Gi"},
                                             "etcd": {"endpoints": endpoint},
                                             "bookie": {"log_size_bytes_max": 256 << 20}}})

            def operator(interval: float | None) -> subprocess.Popen[bytes] | None:
                if interval is None:
                    return None
                return subprocess.Popen([sys.executable, "-m", "octavo.cli.main", "operator", "run", "--kubeconfig",
                                         api.kubeconfig, "--poll-interval-s", str(interval), "--liveness",
                                         f"127.0.0.1:{free_port()}", "--log-level", "WARNING"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            first = operator(10.0)  # the StatefulSet is made by the operator
            deadline = time.monotonic() + 120
            while sum(1 for c in runner.containers.values() if c.ready) != 3:
                if time.monotonic() > deadline:
                    raise RuntimeError("the bookies did not start")
                time.sleep(0.2)
            assert first is not None
            first.terminate()
            first.wait()
            for r in range(rounds):
                phases = [("none", None), ("10 s", 10.0), ("1 s", 1.0)]
                random.Random(r).shuffle(phases)
                for name, interval in phases:
                    proc = operator(interval)
                    time.sleep(8.0 if proc else 0.0)  # past its start (imports, first list and watch)
                    out = subprocess.run([sys.executable, "-c", WRITER, endpoint, str(phase_s)], capture_output=True,
                                         text=True, check=True)
                    results[name].append(float(out.stdout.strip()))
                    if proc is not None:
                        proc.terminate()
                        proc.wait()
                    print(f"round {r + 1}: operator {name}: {results[name][-1]:,.0f} entries/s", flush=True)
    finally:
        etcd.stop(kill=True)
        shutil.rmtree(root, ignore_errors=True)
    return results


# -- reconcile time against N emulated bookies ---------------------------------------------------------------

async def _serve_bookies(addresses: list[str]) -> Any:
    import grpc

    from octavo.v1 import bookie_pb2 as pb
    from octavo.v1 import bookie_pb2_grpc as pb_grpc

    class Admin(pb_grpc.BookieAdminServicer):  # type: ignore[misc]
        async def GetStatus(self, request: Any, context: Any) -> Any:
            return pb.BookieStatus(mode=pb.MODE_WRITABLE, directories=[pb.DirectoryUsage(usage_ratio=0.42)])

    server = grpc.aio.server()
    pb_grpc.add_BookieAdminServicer_to_server(Admin(), server)
    for address in addresses:
        server.add_insecure_port(address)
    await server.start()
    return server


async def reconcile_time(bookies: int, repeats: int) -> tuple[float, float]:
    import kopf

    from octavo.operator import handlers
    from octavo.operator.config import OperatorConfig, OperatorState
    from octavo.operator.policy import Memory, Observed, Policy, Shape, decide
    from octavo.operator.resources import parse_policy
    from octavo.operator.windows import Window

    prefix = f"127.{random.randint(100, 250)}"
    port = free_port()
    addresses = [f"{prefix}.{i // 250}.{i % 250 + 1}:{port}" for i in range(bookies)]
    server = await _serve_bookies(addresses)
    try:
        with ApiServer() as api:
            config = OperatorConfig(kubeconfig=api.kubeconfig)
            state = OperatorState.start(config)
            state.connect(config)
            name, ns = f"c{bookies}", "default"
            spec = {"replicas": bookies, "minWritableBookies": 3, "image": "octavo:dev", "storage": {"size": "1Gi"},
                    "etcd": {"endpoints": "127.0.0.1:2379"}}
            body = {"apiVersion": "octavo.io/v1alpha1", "kind": "BookieCluster",
                    "metadata": {"name": name, "namespace": ns, "uid": "u-1", "generation": 1}, "spec": spec}
            _request(f"{api.url}/apis/octavo.io/v1alpha1/namespaces/{ns}/bookieclusters", "POST", body)
            from octavo.operator import builders
            for i in range(bookies):
                _request(f"{api.url}/api/v1/namespaces/{ns}/pods", "POST", {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"{name}-{i}", "namespace": ns, "labels": builders.labels(name)},
                    "spec": {"containers": [{"name": "bookie", "image": "octavo:dev"}]},
                    "status": {"podIP": addresses[i].rsplit(":", 1)[0]}})
            builders.BOOKIE_PORT = port  # the emulated bookies share one port per address, as pods do
            status: dict[str, Any] = {}
            took = []
            for _ in range(repeats + 1):
                patch = kopf.Patch()
                start = time.perf_counter()
                await handlers.reconcile(config, state, name, ns, body, status, patch, poll=True)
                took.append(time.perf_counter() - start)
                status = {**status, **dict(patch.get("status") or {})}
            policy = parse_policy({"windows": [{"schedule": "0 2 * * *", "duration": "2h"}]}).policy
            assert isinstance(policy, Policy) and isinstance(policy.windows[0], Window)
            observed = [Observed(f"{name}-{i}", disk_usage_ratio=0.42) for i in range(bookies)]
            now = datetime.now(UTC)
            pure = []
            for _ in range(repeats):
                start = time.perf_counter()
                decide(now, policy, Shape(bookies, 3), observed, Memory())
                pure.append(time.perf_counter() - start)
            return median(took[1:]), median(pure)
    finally:
        await server.stop(None)
        builders.BOOKIE_PORT = 3181


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--phase-s", type=float, default=15.0)
    parser.add_argument("--no-report", action="store_true")
    args = parser.parse_args()
    cost = cluster_cost(args.rounds, args.phase_s)
    scale = {}
    for n in (3, 30, 300):
        scale[n] = asyncio.run(reconcile_time(n, 10))
        print(f"{n} bookies: reconcile {scale[n][0] * 1000:.1f} ms, decision alone {scale[n][1] * 1000:.3f} ms",
              flush=True)
    # The machine's speed drifts between rounds more than the operator could cost: compare within each round.
    rows = [[name, f"{median(v):,.0f}", f"{median([x / n for x, n in zip(v, cost['none'], strict=True)]):.0%}",
             ", ".join(f"{x:,.0f}" for x in v)] for name, v in cost.items()]
    body = (f"## Operator\n\n{machine_line()}\n\n`bench/operator_bench.py`: a writer of 1 KB entries (E3/Qw3/Qa2, "
            f"batches of 100, four ledgers, a process of its own) on 3 real bookies run by the pod runner, for "
            f"{args.phase_s:g} s per phase, without the operator and with `octavo operator run` polling every "
            f"bookie every 10 s (the default) and every 1 s; phases in a shuffled order in each of {args.rounds} "
            "rounds.\n\n"
            + table(["operator polling", "median entries/s", "of no operator (median of per-round ratios)",
                     "per round"], rows)
            + "\n\nOne reconcile of a cluster (the operator's poll: the API reads, GetStatus from every bookie, the "
              "decision, the status patch), against emulated bookies (one gRPC server bound to a loopback address "
              "per bookie, answering a fixed status), median of 10; and the pure decision alone:\n\n"
            + table(["bookies", "reconcile", "decision alone"],
                    [[str(n), f"{t * 1000:.1f} ms", f"{p * 1000:.3f} ms"] for n, (t, p) in scale.items()]))
    print(body)
    if not args.no_report:
        write_section("operator", body)
        print("wrote docs/benchmarks.md (operator)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
