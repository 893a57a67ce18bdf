"""The `octavo` command: one CLI for every component.

    octavo node --data-dir DIR [--port PORT] [--config FILE] [...]   run a bookie
    octavo bookie status|readonly|writable|gc --bookie HOST:PORT      a bookie's status and controls
    octavo bookie compact --bookie HOST:PORT [--major|--minor]        run a compaction pass now (with progress)
    octavo bookie compaction suspend|resume|window --bookie HOST:PORT control scheduled compaction
    octavo dev up --data-dir DIR [--bookies N] [--detach] [--json]    run a local cluster (etcd + bookies)
    octavo dev down --data-dir DIR                                    stop a local cluster (or what a killed one left)
    octavo dev restart --data-dir DIR --bookie ID                     restart one bookie (same port, same data)
    octavo bookie decommission --bookie ID [--cancel]                 move a live bookie's copies off it, retire it
    octavo cluster status|underreplicated|check|recover               the cluster as a whole
    octavo ledger ls|show|read|delete [--etcd HOST:PORT] ...          look at and remove ledgers
    octavo dataset ls|show|compact|drop|gc [--etcd HOST:PORT] ...     datasets written by the Spark data source

etcd is found from --etcd, else $OCTAVO_ETCD, else the dev cluster of --data-dir (or $OCTAVO_DEV_DIR); the
`dev` commands take --data-dir or $OCTAVO_DEV_DIR too. A flag a subcommand does not know prints that
subcommand's usage, with the closest flag it has.
Exit codes: 0 success, 1 the operation failed, 2 bad usage or configuration. No command prints a traceback: a
failure is one line on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tomllib
from collections.abc import Sequence
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

ENV_PREFIX = "OCTAVO_NODE_"

# Help for every bookie setting; `octavo node --help` shows them with their defaults.
NODE_SETTING_HELP: dict[str, str] = {
    "data_dir": "directory for entry logs, index and state (required)",
    "host": "address to listen on",
    "port": "port to listen on (0: pick a free one; see --ready-file)",
    "advertised_address": "HOST:PORT other processes use to reach this bookie (default: host:port)",
    "etcd": "etcd endpoints host:port[,host:port...] to join a cluster (empty: run standalone)",
    "cluster": "cluster name: the key prefix in etcd",
    "bookie_id": "this bookie's identity in the cluster (default: its advertised address); keep it stable",
    "registration_ttl_s": "lease of the bookie's registration in etcd, in seconds",
    "tail_repair": "after an unclean stop across a reboot, copy lost entries back from peers (true/false)",
    "gc_interval_ms": "how often to collect ledgers deleted from etcd and logs with nothing alive (cluster only)",
    "log_size_bytes_max": "roll the active entry log at this size",
    "log_roll_interval_ms": "roll an active log whose oldest unsynced record is older than this",
    "log_rotate_on_close_bytes_min": "a fence or write-close rotates the active log only if it is at least this big",
    "fsync_policy": "'none' (default: no fsync on the add path) or 'batch' (fdatasync before acking each batch)",
    "write_cache_entries_max": "entries in logs not yet flushed; at this many, adds wait for the flusher",
    "add_wait_ms_max": "how long an add waits for write-cache room before failing",
    "entry_size_bytes_max": "largest entry payload accepted",
    "batch_entries_max": "most entries in one add request",
    "batch_bytes_max": "most payload bytes in one add request",
    "read_entries_max": "most entries returned by one read",
    "read_bytes_max": "most payload bytes returned by one read",
    "long_poll_wait_ms_max": "longest a tailing read's long poll is held before it is answered",
    "long_poll_waiters_max": "tailing reads held at once; more are answered BUSY",
    "open_log_files_max": "entry-log files kept open for reads",
    "index_map_size_bytes": "address space reserved for the LMDB index",
    "metrics_port": "serve Prometheus metrics on http://HOST:PORT/metrics (-1: off; 0: a free port, see --ready-file)",
    "otlp_endpoint": "push metrics and sampled spans to this OpenTelemetry collector (host:port; https:// for TLS)",
    "trace_sample_ratio": "share of requests without a sampled trace context that get a span (0-1; 0: none)",
    "tls_cert_file": "serve TLS with this certificate chain (PEM); also this bookie's identity towards peers",
    "tls_key_file": "the private key (PEM) of tls_cert_file",
    "tls_ca_file": "CA bundle (PEM) that clients' and peers' certificates must chain to",
    "tls_client_auth": "'require' (default: clients need a certificate of tls_ca_file) or 'none' (server TLS only)",
    "tenant_prefixes": "limit client identities to datasets: 'ID=PREFIX[,PREFIX...][;ID=...]' (needs mTLS, etcd)",
    "metrics_tls": "serve the metrics endpoint over TLS with tls_cert_file (true/false)",
    "etcd_tls_ca_file": "reach etcd over TLS: the CA bundle (PEM) etcd's certificate chains to",
    "etcd_tls_cert_file": "client certificate (PEM) for etcd (with --client-cert-auth its CN is the etcd user)",
    "etcd_tls_key_file": "the private key (PEM) of etcd_tls_cert_file",
    "etcd_username": "etcd user to authenticate as (with etcd_password_file)",
    "etcd_password_file": "file holding the etcd user's password (read at start; never logged)",
    "admin_identities": "comma-separated certificate CNs or SANs allowed on the admin plane (empty: any client)",
    "admin_token_file": "file holding a bearer token that also grants the admin plane (for the CLI)",
    "autorecovery_enabled": "audit the cluster for lost bookies and re-replicate their data (true/false)",
    "autorecovery_idle_interval_s": "the longest the self-healing passes go without reading etcd when no watched "
                                    "key changes",
    "lost_bookie_delay_s": "a bookie unregistered this long is taken for lost and its ledgers re-replicated",
    "audit_interval_s": "how often the auditor checks every ledger's ensembles for bookies that are gone",
    "replicas_check_interval_s": "how often the auditor checks that every entry is on every bookie of its write "
                                 "set and marks missing copies for restoring (0: off)",
    "open_ledger_grace_s": "an open ledger naming a lost bookie is left to its writer this long, then recovered",
    "replication_rate_bytes_per_s": "most bytes this bookie's replication workers copy per second (0: unlimited)",
    "replication_batch_bytes_max": "most bytes in one add of re-replicated entries",
    "replication_workers_max": "ledgers this bookie re-replicates at once",
    "scrub_interval_s": "how often a scrub pass verifies every flushed record's checksum (0: only when asked)",
    "scrub_rate_bytes_per_s": "most bytes a scrub pass reads per second",
    "damage_check_interval_s": "how often the bookie checks the damage marks naming it and repairs its copies",
    "etcd_compaction_interval_s": "the auditor compacts etcd's history to the revision of this long ago (0: off)",
    "dataset_maintenance_interval_s": "how often the auditor checkpoints datasets' logs and merges small ledgers "
                                      "(0: off)",
    "dataset_merge_target_bytes": "the auditor merges a dataset's small ledgers into ledgers of up to this size",
    "dataset_merge_budget_bytes": "most bytes the auditor's merges copy per maintenance interval (0: no merging)",
    "dataset_orphan_interval_s": "how often the auditor deletes ledgers no dataset version needs (0: off)",
    "dataset_orphan_grace_s": "an unreferenced dataset ledger is deleted only once this old (a write may be running)",
    "compaction_enabled": "run scheduled compaction passes (true/false); passes started by hand run regardless",
    "compaction_minor_threshold": "minor compaction rewrites logs whose live share is below this (0-1)",
    "compaction_major_threshold": "major compaction rewrites logs whose live share is below this (0-1, > minor)",
    "compaction_minor_interval_ms": "how often a scheduled minor compaction pass runs",
    "compaction_major_interval_ms": "how often a scheduled major compaction pass runs",
    "compaction_rate_bytes_per_s": "most bytes compaction copies per second (0: unlimited)",
    "compaction_run_time_ms_max": "a compaction pass stops at a safe point after this long",
    "disk_check_interval_ms": "how often the disk monitor checks each data directory's usage",
    "disk_warn_ratio": "log a warning when a data directory's filesystem is fuller than this (0-1)",
    "disk_readonly_ratio": "turn read-only when any data directory's filesystem is fuller than this (0-1)",
    "disk_writable_ratio": "turn writable again when every data directory is below this (0-1, < readonly)",
    "disk_capacity_bytes": "capacity to measure usage against instead of the filesystem's (0: the filesystem's)",
}


class UsageError(Exception):
    pass


def _add_node_parser(sub: Any) -> None:
    from octavo.node.config import NodeConfig

    p = sub.add_parser(
        "node", help="run a bookie",
        description="Run a bookie. Each setting comes from, in order of precedence: its flag, the environment "
                    f"variable {ENV_PREFIX}<SETTING> (e.g. {ENV_PREFIX}PORT), the TOML file given with "
                    "--config (keys as the setting names, e.g. log_size_bytes_max = 67108864), the default.",
    )
    p.add_argument("--config", help="TOML file of settings")
    p.add_argument("--ready-file", help="write HOST:PORT to this file once serving (for scripts and tests)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="(default: INFO)")
    from octavo.telemetry.logs import add_log_format_argument

    add_log_format_argument(p)
    for f in dataclasses.fields(NodeConfig):
        shown = "" if f.default is dataclasses.MISSING else f" (default: {f.default!r})"
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None,
                       help=f"{NODE_SETTING_HELP.get(f.name, '(no help text yet)')}{shown}")


def resolve_node_config(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Any:
    """Merge flags, environment and config file into a validated NodeConfig."""
    from octavo.node.config import ConfigError, NodeConfig

    environ = dict(os.environ) if environ is None else environ
    values: dict[str, Any] = {}
    if args.config:
        try:
            with open(args.config, "rb") as f:
                values.update(tomllib.load(f))
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise UsageError(f"cannot read config file {args.config}: {e}") from e
    known = {f.name: f for f in dataclasses.fields(NodeConfig)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise UsageError(f"unknown setting(s) in {args.config}: {', '.join(unknown)}")
    for name in known:
        env = environ.get(ENV_PREFIX + name.upper())
        if env is not None:
            values[name] = env
        flag = getattr(args, name, None)
        if flag is not None:
            values[name] = flag
    for name, value in list(values.items()):
        if isinstance(known[name].default, bool) and not isinstance(value, bool):
            if str(value).lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise UsageError(f"setting {name} must be true or false, got {value!r}")
            values[name] = str(value).lower() in ("true", "1", "yes")
        elif isinstance(known[name].default, float) and not isinstance(value, float):
            try:
                values[name] = float(value)
            except (TypeError, ValueError):
                raise UsageError(f"setting {name} must be a number, got {value!r}") from None
        elif isinstance(known[name].default, int) and not isinstance(value, int):
            try:
                values[name] = int(value)
            except ValueError:
                raise UsageError(f"setting {name} must be an integer, got {value!r}") from None
    if "data_dir" not in values:
        raise UsageError(f"--data-dir (or {ENV_PREFIX}DATA_DIR, or data_dir in --config) is required")
    try:
        return NodeConfig(**values).validate()
    except (ConfigError, TypeError) as e:
        raise UsageError(f"invalid configuration: {e}") from e


def cmd_node(args: argparse.Namespace) -> int:
    import asyncio

    from octavo.meta.errors import CookieMismatchError, MetadataUnavailableError
    from octavo.meta.tls import TlsError
    from octavo.node.errors import StorageError
    from octavo.node.server import serve

    config = resolve_node_config(args)
    from octavo.telemetry import configure_logging

    try:
        configure_logging(args.log_level, args.log_format, service="octavo-bookie")
    except ValueError as e:
        raise UsageError(f"{e} (from --log-format or $OCTAVO_LOG_FORMAT)") from None
    try:
        asyncio.run(serve(config, args.ready_file))
    except OSError as e:  # the data directory cannot be created, written or locked
        print(f"octavo node: {_describe_os_error(e)}", file=sys.stderr)
        return EXIT_FAILED
    except StorageError as e:
        print(f"octavo node: {e.message}", file=sys.stderr)
        return EXIT_FAILED
    except (TlsError, ValueError) as e:  # a TLS file or an etcd credential that cannot be used
        print(f"octavo node: {e}", file=sys.stderr)
        return EXIT_FAILED
    except (CookieMismatchError, MetadataUnavailableError) as e:
        print(f"octavo node: {e}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _describe_os_error(e: OSError) -> str:
    where = f" {e.filename}" if e.filename else ""
    return f"cannot use{where}: {e.strerror or e}"


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("octavo")
    except PackageNotFoundError:
        return "unknown (not installed)"


class Parser(argparse.ArgumentParser):
    """An argument parser whose subcommands report a flag they do not know themselves, with their own usage
    (`octavo bookie status --bokie x` prints `bookie status`'s usage and suggests --bookie), not the top-level
    usage argparse gives when the leftovers bubble up to it."""

    def parse_known_args(  # type: ignore[override]
            self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and self.prog != "octavo":  # a subcommand's parser: say it here (parse_args would say it above)
            self.error(self.unrecognized(extras))
        return parsed, extras

    def unrecognized(self, extras: list[str]) -> str:
        import difflib

        text = f"unrecognized arguments: {' '.join(extras)}"
        flags = [f for f in self._option_string_actions if f.startswith("--")]
        for extra in extras:
            if extra.startswith("-"):
                close = difflib.get_close_matches(extra.split("=", 1)[0], flags, n=1, cutoff=0.6)
                if close:
                    text += f" (did you mean {close[0]}?)"
                    break
        return text


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="octavo", description="Octavo: replicated log storage for data pipelines")
    parser.add_argument("--version", action="version", version=f"octavo {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_node_parser(sub)
    from octavo.cli import bookie, cluster, dataset, dev, ledger

    bookie.add_parser(sub)
    cluster.add_parser(sub)
    dataset.add_parser(sub)
    dev.add_parser(sub)
    ledger.add_parser(sub)
    from octavo.operator import main as operator_main

    operator_main.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _dispatch(parser, args)
    except UsageError as e:
        print(f"octavo {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (`octavo ledger read ... | head`): stop quietly, as Unix tools do. Point stdout
        # at /dev/null so the interpreter's final flush does not fail on the closed pipe too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"octavo {args.command}: interrupted", file=sys.stderr)
        return 130


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.command == "node":
        return cmd_node(args)
    if args.command == "bookie":
        from octavo.cli import bookie

        return bookie.run(args)
    if args.command == "cluster":
        from octavo.cli import cluster as cluster_cli

        return cluster_cli.run(args)
    if args.command == "dataset":
        from octavo.cli import dataset

        return dataset.run(args)
    if args.command == "ledger":
        from octavo.cli import ledger

        return ledger.run(args)
    if args.command == "dev":
        from octavo.cli import dev

        return dev.run(args)
    if args.command == "operator":
        from octavo.operator import main as operator_main

        return operator_main.run(args)
    parser.error("unknown command")
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
