"""What every `octavo` command shares: where etcd is, which cluster, bookie addresses, passwords, JSON and
human output, confirmation. Pure helpers and small IO; the commands live in their own modules.

Where etcd is (the first that is given): `--etcd HOST:PORT[,...]`, the environment variable OCTAVO_ETCD, the
`cluster.json` of a dev cluster named with `--data-dir DIR` (or OCTAVO_DEV_DIR). The cluster: `--cluster`,
OCTAVO_CLUSTER, the dev cluster's, else "default".

JSON output (`--json`): one object per command on one line, or one object per line for streams (`ledger
read`); keys in snake_case; 64-bit integers as JSON numbers; times as `*_unix_ms` numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

ETCD_ENV = "OCTAVO_ETCD"
CLUSTER_ENV = "OCTAVO_CLUSTER"
DEV_DIR_ENV = "OCTAVO_DEV_DIR"
PASSWORD_ENV = "OCTAVO_PASSWORD"
DEV_STATE_FILE = "cluster.json"
BOOKIE_PORT_DEFAULT = 3181
DEFAULT_CLUSTER = "default"
PASSWORD_FILE_BYTES_MAX = 64 * 1024


class CliError(Exception):
    """A failure to report in one line (no traceback) with an exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


# -- argument types ----------------------------------------------------------------------------------------
def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


# -- where the cluster is ----------------------------------------------------------------------------------
def add_etcd_arguments(parser: argparse.ArgumentParser) -> None:
    """--etcd, --data-dir, --cluster, and --allow-empty: every command that takes a cluster checks it has
    something in etcd (a mistyped --cluster would otherwise look like an empty cluster) unless told not to."""
    parser.add_argument("--etcd", help=f"etcd endpoints HOST:PORT[,HOST:PORT...] (default: ${ETCD_ENV}, or the "
                                       "dev cluster of --data-dir)")
    parser.add_argument("--data-dir", dest="dev_dir", metavar="DIR",
                        help=f"a dev cluster's directory (`octavo dev up --data-dir DIR`) instead of --etcd "
                             f"(default: ${DEV_DIR_ENV})")
    parser.add_argument("--cluster", help=f"cluster name (default: ${CLUSTER_ENV}, the dev cluster's, or "
                                          f"{DEFAULT_CLUSTER!r})")
    parser.add_argument("--allow-empty", action="store_true",
                        help="accept a cluster with nothing in etcd yet (by default that is taken for a typo)")


def add_bookie_id_arguments(parser: Any, help_text: str) -> None:
    """The bookie as `--bookie ID`, like every bookie command; the positional form of earlier versions is
    kept (resolve_bookie_id reads either)."""
    parser.add_argument("bookie_id", nargs="?", metavar="BOOKIE_ID", help=f"{help_text} (or --bookie ID)")
    parser.add_argument("--bookie", dest="bookie_flag", metavar="ID", help=help_text)


def resolve_bookie_id(args: argparse.Namespace) -> str:
    flag, positional = getattr(args, "bookie_flag", None), getattr(args, "bookie_id", None)
    if flag and positional and flag != positional:
        raise CliError(f"two bookies given: --bookie {flag} and {positional}; name one", EXIT_USAGE)
    if not (flag or positional):
        raise CliError("which bookie? give --bookie ID (e.g. --bookie bookie-3)", EXIT_USAGE)
    return str(flag or positional)


def read_dev_state(dev_dir: str) -> dict[str, Any]:
    path = Path(dev_dir) / DEV_STATE_FILE
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise CliError(f"{dev_dir} holds no dev cluster ({DEV_STATE_FILE} is missing): start one with "
                       f"`octavo dev up --data-dir {dev_dir}`", EXIT_USAGE) from None
    except (OSError, ValueError) as e:
        raise CliError(f"cannot read {path}: {e}", EXIT_USAGE) from None
    return state


@dataclass(frozen=True)
class Target:
    etcd: str
    cluster: str
    dev_state: dict[str, Any] | None  # the dev cluster's cluster.json, when one was named


def resolve_target(args: argparse.Namespace, environ: dict[str, str] | None = None,
                   required: bool = True) -> Target | None:
    environ = dict(os.environ) if environ is None else environ
    dev_dir = getattr(args, "dev_dir", None) or environ.get(DEV_DIR_ENV)
    dev_state = read_dev_state(dev_dir) if dev_dir else None
    etcd = getattr(args, "etcd", None) or environ.get(ETCD_ENV) or (dev_state or {}).get("etcd")
    if not etcd:
        if not required:
            return None
        raise CliError(f"where is etcd? give --etcd HOST:PORT, set {ETCD_ENV}, or name a dev cluster with "
                       f"--data-dir DIR", EXIT_USAGE)
    cluster = (getattr(args, "cluster", None) or environ.get(CLUSTER_ENV) or (dev_state or {}).get("cluster")
               or DEFAULT_CLUSTER)
    return Target(etcd, cluster, dev_state)


async def check_cluster_exists(etcd: Any, cluster: str, endpoint: str) -> None:
    """CliError if etcd holds nothing for `cluster` (a mistyped --cluster would otherwise look like an empty
    cluster and every command would "succeed"); names the clusters that do exist."""
    from octavo.meta.layout import Layout

    if await etcd.get_prefix(Layout(cluster).root, limit=1, keys_only=True):
        return
    known = await known_clusters(etcd)
    raise CliError(f"cluster {cluster!r} has nothing in etcd at {endpoint} (no bookie, ledger or dataset ever); "
                   f"clusters there: {', '.join(known) or 'none'}. A typo? Use --allow-empty for a new cluster.")


KNOWN_CLUSTERS_MAX = 20


async def known_clusters(etcd: Any) -> list[str]:
    """The cluster names under /octavo/ in etcd, found by skipping from one cluster's keys to the next (one
    read of one key per cluster, at most KNOWN_CLUSTERS_MAX)."""
    from octavo.meta.keyrange import prefix_end

    names: list[str] = []
    start = b"/octavo/"
    while len(names) < KNOWN_CLUSTERS_MAX:
        found = await etcd.range_from(start, prefix_end(b"/octavo/"))
        if found is None:
            break
        name = found[len(b"/octavo/"):].split(b"/", 1)[0].decode(errors="replace")
        names.append(name)
        start = prefix_end(b"/octavo/" + name.encode() + b"/")
    return names


def bookie_address(spec: str, target: Target | None, registered: dict[str, str] | None = None) -> str:
    """HOST:PORT for --bookie: a bookie id (from the dev cluster's state or etcd's registrations), or an
    address; an address without a port gets the bookie port, 3181."""
    if target is not None and target.dev_state:
        for bookie in target.dev_state.get("bookies", []):
            if bookie.get("id") == spec:
                return str(bookie["address"])
    if registered and spec in registered:
        return registered[spec]
    host, sep, port = spec.rpartition(":")
    if sep and port.isdigit() and host and not host.endswith(":"):
        return spec
    if (spec.startswith("[") and spec.endswith("]")) or ":" not in spec:
        return f"{spec}:{BOOKIE_PORT_DEFAULT}"
    raise CliError(f"--bookie {spec!r} is neither a bookie id nor HOST[:PORT]", EXIT_USAGE)


def looks_like_bookie_id(spec: str) -> bool:
    """Worth looking up in etcd: no port given (an id, or a host name meant with the default port)."""
    return ":" not in spec


# -- passwords ---------------------------------------------------------------------------------------------
def add_password_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--password", help=f"the ledger password (visible in `ps`: prefer --password-file or "
                                      f"${PASSWORD_ENV})")
    g.add_argument("--password-file", metavar="FILE", help="read the password from FILE (one trailing newline "
                                                           "is dropped)")


def resolve_password(args: argparse.Namespace, environ: dict[str, str] | None = None) -> bytes:
    """--password, else --password-file, else $OCTAVO_PASSWORD, else empty."""
    environ = dict(os.environ) if environ is None else environ
    if getattr(args, "password", None) is not None:
        return str(args.password).encode()
    path = getattr(args, "password_file", None)
    if path:
        try:
            with open(path, "rb") as f:
                data = f.read(PASSWORD_FILE_BYTES_MAX + 1)
        except OSError as e:
            raise CliError(f"cannot read --password-file {path}: {e.strerror or e}", EXIT_USAGE) from None
        if len(data) > PASSWORD_FILE_BYTES_MAX:
            raise CliError(f"--password-file {path} is over {PASSWORD_FILE_BYTES_MAX} bytes", EXIT_USAGE)
        return data[:-1] if data.endswith(b"\n") else data
    return environ.get(PASSWORD_ENV, "").encode()


# -- output ------------------------------------------------------------------------------------------------
def print_json(obj: Any) -> None:
    print(json.dumps(obj, separators=(",", ":"), sort_keys=False))


def proto_to_dict(message: Any) -> dict[str, Any]:
    """A protobuf message as JSON-ready data: field names as in the .proto (snake_case), every field present,
    64-bit integers as numbers (protobuf's own JSON writes them as strings), enums by name."""
    from google.protobuf.descriptor import FieldDescriptor

    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)

        def one(v: Any, f: Any = field) -> Any:
            if f.type == FieldDescriptor.TYPE_MESSAGE:
                return proto_to_dict(v)
            if f.type == FieldDescriptor.TYPE_ENUM:
                return f.enum_type.values_by_number[v].name if v in f.enum_type.values_by_number else v
            if f.type == FieldDescriptor.TYPE_BYTES:
                return v.hex()
            return v

        repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
        if repeated and field.message_type is not None and field.message_type.GetOptions().map_entry:
            out[field.name] = {k: one(v, field.message_type.fields_by_name["value"]) for k, v in value.items()}
        elif repeated:
            out[field.name] = [one(v) for v in value]
        else:
            out[field.name] = one(value)
    return out


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def fmt_time(unix_ms: int) -> str:
    return datetime.fromtimestamp(unix_ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def fmt_age(seconds: float) -> str:
    if seconds < 0:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Columns padded to their widest cell; numbers (cells that start with a digit) right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if c[:1].isdigit() else c.ljust(w)
                         for c, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


def format_payload(data: bytes, how: str) -> str:
    """An entry for people: `text` (UTF-8, escapes for what is not printable), `hex`, or `auto` (text when
    the bytes are printable UTF-8, hex otherwise)."""
    if how == "hex" or (how == "auto" and not _printable(data)):
        return data.hex()
    return data.decode("utf-8", errors="backslashreplace").replace("\n", "\\n").replace("\t", "\\t")


def _printable(data: bytes) -> bool:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(c.isprintable() or c in "\n\t" for c in text)


# -- confirmation ------------------------------------------------------------------------------------------
def confirm(what: str, yes: bool, stdin: Any = None, stderr: Any = None) -> None:
    """Go on only with --yes, or when the person at the terminal types 'yes'; a script without --yes is told
    what to add (exit code 2), never left waiting on a prompt."""
    stdin = stdin or sys.stdin
    stderr = stderr or sys.stderr
    if yes:
        return
    if not (hasattr(stdin, "isatty") and stdin.isatty()):
        raise CliError(f"{what}: refusing without --yes when not at a terminal", EXIT_USAGE)
    stderr.write(f"{what}. Type 'yes' to go on: ")
    stderr.flush()
    answer = stdin.readline().strip().lower()
    if answer != "yes":
        raise CliError("nothing done (not confirmed)")


# -- clients -----------------------------------------------------------------------------------------------
def cli_tls(target: Target | None = None) -> Any:
    """The TLS files the commands use towards bookies: $OCTAVO_TLS_CA_FILE, $OCTAVO_TLS_CERT_FILE and
    $OCTAVO_TLS_KEY_FILE (docs/security.md), else those of the dev cluster named (`dev up --tls` writes them
    into its cluster.json); none: plaintext."""
    from octavo.meta.tls import TlsError, TlsFiles

    tls = TlsFiles.from_env()
    dev_tls = (target.dev_state or {}).get("tls") if target is not None else None
    if not tls.enabled and dev_tls:
        tls = TlsFiles(dev_tls["cert_file"], dev_tls["key_file"], dev_tls["ca_file"])
    try:
        return tls.check("OCTAVO_TLS") if tls.enabled else tls
    except TlsError as e:
        raise CliError(str(e), EXIT_USAGE) from None


def etcd_settings(target: Target | None = None, environ: dict[str, str] | None = None) -> dict[str, str]:
    """How the commands reach etcd securely: $OCTAVO_ETCD_TLS_CA_FILE, $OCTAVO_ETCD_TLS_CERT_FILE,
    $OCTAVO_ETCD_TLS_KEY_FILE, $OCTAVO_ETCD_USERNAME, $OCTAVO_ETCD_PASSWORD_FILE, else the dev cluster's
    (`dev up --tls`); as ClientOptions field names."""
    env = os.environ if environ is None else environ
    names = {"etcd_tls_ca_file": "OCTAVO_ETCD_TLS_CA_FILE", "etcd_tls_cert_file": "OCTAVO_ETCD_TLS_CERT_FILE",
             "etcd_tls_key_file": "OCTAVO_ETCD_TLS_KEY_FILE", "etcd_username": "OCTAVO_ETCD_USERNAME",
             "etcd_password_file": "OCTAVO_ETCD_PASSWORD_FILE"}
    settings = {field: env.get(var, "") for field, var in names.items()}
    dev = (target.dev_state or {}).get("etcd_tls") if target is not None else None
    if not any(settings.values()) and dev:
        settings.update({"etcd_tls_ca_file": dev["ca_file"], "etcd_tls_cert_file": dev["cert_file"],
                         "etcd_tls_key_file": dev["key_file"]})
    return settings


def etcd_auth(target: Target | None = None) -> Any:
    from octavo.meta.etcd import EtcdAuth

    s = etcd_settings(target)
    try:
        return EtcdAuth.from_settings(s["etcd_tls_ca_file"], s["etcd_tls_cert_file"], s["etcd_tls_key_file"],
                                      s["etcd_username"], s["etcd_password_file"])
    except ValueError as e:
        raise CliError(f"{e} (from OCTAVO_ETCD_* or the dev cluster)", EXIT_USAGE) from None


def admin_metadata() -> Any:
    """The admin token the commands send to bookies' admin planes: the file $OCTAVO_ADMIN_TOKEN_FILE names
    (docs/security.md); none: no token."""
    from octavo.meta.tls import TlsError, admin_token_metadata

    try:
        return admin_token_metadata(os.environ.get("OCTAVO_ADMIN_TOKEN_FILE", ""))
    except TlsError as e:
        raise CliError(f"{e} (OCTAVO_ADMIN_TOKEN_FILE)", EXIT_USAGE) from None


def client_options(target: Target | None = None) -> Any:
    from octavo.client import ClientOptions

    tls = cli_tls(target)
    etcd_auth(target)  # checked here: a bad file is a usage error with its name
    etcd = etcd_settings(target)
    return ClientOptions(tls_ca_file=tls.ca_file, tls_cert_file=tls.cert_file, tls_key_file=tls.key_file,
                         etcd_tls_ca_file=etcd["etcd_tls_ca_file"], etcd_tls_cert_file=etcd["etcd_tls_cert_file"],
                         etcd_tls_key_file=etcd["etcd_tls_key_file"], etcd_username=etcd["etcd_username"],
                         etcd_password_file=etcd["etcd_password_file"])


@contextlib.asynccontextmanager
async def cluster_client(args: argparse.Namespace) -> AsyncIterator[Any]:
    """A Client for the cluster the arguments name, checked to exist unless --allow-empty."""
    from octavo.client import Client
    from octavo.meta.etcd import parse_endpoints

    target = resolve_target(args)
    assert target is not None
    try:
        parse_endpoints(target.etcd)
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    async with Client(target.etcd, target.cluster, client_options(target)) as client:
        if not getattr(args, "allow_empty", False):
            await check_cluster_exists(client.etcd, target.cluster, target.etcd)
        yield client


def run_async(label: str, main: Coroutine[Any, Any, int]) -> int:
    """Run a command's coroutine; a CliError, an OctavoError or a ValueError becomes one line on stderr,
    prefixed with `label` (e.g. "octavo ledger read"), and an exit code."""
    from octavo.meta.errors import OctavoError

    try:
        return asyncio.run(main)
    except CliError as e:
        print(f"{label}: {e}", file=sys.stderr)
        return e.code
    except (OctavoError, ValueError) as e:
        print(f"{label}: {e}", file=sys.stderr)
        return EXIT_FAILED
