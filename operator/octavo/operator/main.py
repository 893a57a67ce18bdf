"""`octavo operator run`: the operator process (kopf underneath).

    octavo operator run [--namespace NS ...] [--kubeconfig FILE] [--poll-interval-s S] [--liveness HOST:PORT]
                        [--peering NAME [--priority N]] [--log-level LEVEL] [--log-format text|json]
                        [--metrics-port PORT]

Without --namespace it serves every namespace. Without --peering it runs standalone (run one replica); with
it, operators sharing a peering name elect one active operator (kopf's peering; its KopfPeering CRD must be
installed). The liveness endpoint answers on http://HOST:PORT/healthz once the operator serves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
DEFAULT_LIVENESS = "0.0.0.0:8080"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("operator", help="run the Kubernetes operator")
    osub = p.add_subparsers(dest="operator_cmd", required=True)
    run = osub.add_parser(
        "run", help="run the operator (BookieCluster, CompactionPolicy)",
        description="Run the Octavo operator: it reconciles BookieClusters into StatefulSets and schedules "
                    "compaction windows and read-only modes from their CompactionPolicy and disk usage.")
    run.add_argument("--namespace", "-n", action="append", default=[], metavar="NS",
                     help="serve this namespace (repeatable; globs like 'team-*' allowed); default: all")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: the pod's service account, then "
                                          "$KUBECONFIG, then ~/.kube/config)")
    run.add_argument("--poll-interval-s", type=float, default=10.0,
                     help="how often each cluster's bookies are read and decided on (default: 10)")
    run.add_argument("--admin-timeout-s", type=float, default=5.0,
                     help="deadline of each call to a bookie's admin API (default: 5)")
    run.add_argument("--roll-ready-timeout-s", type=float, default=300.0,
                     help="a rolling restart halts when a restarted bookie is not Ready within this (default: 300)")
    run.add_argument("--decommission-rate-bytes-per-s", type=int, default=4 << 20,
                     help="copy rate of a scale-down's decommission (default: 4 MiB/s; 0: unlimited)")
    run.add_argument("--liveness", default=DEFAULT_LIVENESS, metavar="HOST:PORT",
                     help=f"serve /healthz here (default: {DEFAULT_LIVENESS}; empty: none)")
    run.add_argument("--peering", metavar="NAME", help="elect one active operator among those of this name")
    run.add_argument("--priority", type=int, default=0, help="peering priority (the highest is active)")
    run.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    run.add_argument("--metrics-port", type=int, default=-1,
                     help="serve Prometheus metrics on http://HOST:PORT/metrics (-1: off, the default; 0: a free "
                          "port)")
    run.add_argument("--metrics-host", default="0.0.0.0", help="address of the metrics endpoint (default: 0.0.0.0)")
    run.add_argument("--metrics-tls", action="store_true",
                     help="serve /metrics over TLS with the operator's certificate ($OCTAVO_TLS_CERT_FILE, "
                          "$OCTAVO_TLS_KEY_FILE)")
    run.add_argument("--otlp-endpoint", default="",
                     help="also push the metrics to this OpenTelemetry collector (host:port; https:// for TLS)")
    from octavo.telemetry.logs import add_log_format_argument
    add_log_format_argument(run)
    uninstall = osub.add_parser(
        "uninstall", help="delete a release's clusters and policies while the operator runs (Helm's pre-delete)",
        description="Delete BookieClusters and CompactionPolicies and wait until the operator has released "
                    "them (else remove its finalizer); optionally delete volumes by label selector.")
    from octavo.operator.uninstall import add_arguments
    add_arguments(uninstall)


def run(args: argparse.Namespace) -> int:
    if args.operator_cmd == "uninstall":
        from octavo.operator import uninstall
        return uninstall.run(args)
    try:
        import kopf

        from octavo.operator import handlers
    except ImportError as e:
        print(f"octavo operator: the operator extra is not installed ({e.name}): pip install 'octavo[operator]'",
              file=sys.stderr)
        return EXIT_FAILED
    from octavo.operator.config import OperatorConfig, OperatorState
    config = OperatorConfig(
        poll_interval_s=args.poll_interval_s, admin_timeout_s=args.admin_timeout_s,
        roll_ready_timeout_s=args.roll_ready_timeout_s,
        decommission_rate_bytes_per_s=args.decommission_rate_bytes_per_s, kubeconfig=args.kubeconfig,
        metrics_port=args.metrics_port, metrics_host=args.metrics_host, metrics_tls=args.metrics_tls,
        otlp_endpoint=args.otlp_endpoint)
    try:
        config.validate()
        liveness = _liveness_url(args.liveness)
    except ValueError as e:
        print(f"octavo operator run: {e}", file=sys.stderr)
        return EXIT_USAGE
    from octavo.telemetry import configure_logging
    try:
        configure_logging(args.log_level, args.log_format, service="octavo-operator")
    except ValueError as e:
        print(f"octavo operator run: {e} (from --log-format or $OCTAVO_LOG_FORMAT)", file=sys.stderr)
        return EXIT_USAGE
    registry = kopf.OperatorRegistry()
    handlers.register(registry, config, OperatorState.start(config))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(kopf.operator(
            registry=registry, clusterwide=not args.namespace, namespaces=args.namespace,
            standalone=args.peering is None, peering_name=args.peering, priority=args.priority,
            liveness_endpoint=liveness))
    return EXIT_OK


def _liveness_url(value: str) -> str | None:
    if not value:
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--liveness must be HOST:PORT, got {value!r}")
    return f"http://{host}:{port}/healthz"
