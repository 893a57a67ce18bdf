"""`octavo node` settings: flags over environment over config file over defaults, with clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from octavo.cli.main import UsageError, build_parser, resolve_node_config


def resolve(argv: list[str], env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return resolve_node_config(build_parser().parse_args(["node", *argv]), env or {})


def test_precedence_flag_over_env_over_file_over_default(tmp_path: Path) -> None:
    cfg = tmp_path / "bookie.toml"
    cfg.write_text('data_dir = "/from/file"\nport = 1111\nlog_size_bytes_max = 134217728\nfsync_policy = "batch"\n')
    config = resolve(["--config", str(cfg), "--port", "3333"],
                     {"OCTAVO_NODE_PORT": "2222", "OCTAVO_NODE_LOG_SIZE_BYTES_MAX": "268435456"})
    assert config.port == 3333  # flag
    assert config.log_size_bytes_max == 268435456  # environment over file
    assert config.fsync_policy == "batch" and config.data_dir == "/from/file"  # file
    assert config.batch_entries_max == 10_000  # default


@pytest.mark.parametrize(("argv", "env", "text"), [
    ([], {}, "--data-dir (or OCTAVO_NODE_DATA_DIR, or data_dir in --config) is required"),
    (["--data-dir", "d", "--port", "x"], {}, "setting port must be an integer"),
    (["--data-dir", "d"], {"OCTAVO_NODE_BATCH_BYTES_MAX": "lots"}, "setting batch_bytes_max must be an integer"),
    (["--data-dir", "d", "--log-size-bytes-max", "10"], {}, "log_size_bytes_max must be in"),
    (["--data-dir", "d", "--config", "/no/such/file.toml"], {}, "cannot read config file"),
])
def test_bad_settings_are_usage_errors(argv: list[str], env: dict[str, str], text: str) -> None:
    with pytest.raises(UsageError, match=text.replace("(", r"\(").replace(")", r"\)")):
        resolve(argv, env)


def test_unknown_key_in_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('data_dir = "d"\nwrite_cache_entrys_max = 5\n')
    with pytest.raises(UsageError, match=r"unknown setting.*write_cache_entrys_max"):
        resolve(["--config", str(cfg)])


def test_help_explains_every_setting(capsys: pytest.CaptureFixture[str]) -> None:
    from octavo.node.config import NodeConfig

    with pytest.raises(SystemExit):
        build_parser().parse_args(["node", "--help"])
    out = capsys.readouterr().out
    for name in NodeConfig.field_names():
        assert "--" + name.replace("_", "-") in out
    assert "OCTAVO_NODE_" in out


def test_compaction_window_arguments_and_the_progress_bar() -> None:
    import argparse
    import io

    from octavo.cli.bookie import CliError, ProgressBar, parse_window

    def ns(**kw: object) -> argparse.Namespace:
        base = {"clear": False, "for_": None, "until": None}
        base.update(kw)
        return argparse.Namespace(**base)

    assert parse_window(ns(clear=True)) == 0
    assert parse_window(ns(for_="90m"), now_s=1000.0) == (1000 + 5400) * 1000
    now = 1795400000.0  # 2026-11-23T02:13:20Z
    assert parse_window(ns(until="2026-11-23T06:00"), now_s=now) == 1795413600000
    assert parse_window(ns(until="2026-11-23T06:00+01:00"), now_s=now) == 1795413600000 - 3600 * 1000
    # A window that has already ended would silently turn scheduled compaction off: refused.
    for bad in (ns(for_="0h"), ns(for_="soon"), ns(until="tomorrow"), ns(until="2026-11-23T02:00")):
        try:
            parse_window(bad, now_s=now)
        except CliError as e:
            assert e.code == 2
        else:
            raise AssertionError(f"{bad} was accepted")

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    bar = ProgressBar(out, enabled=True)
    bar.update("major compaction", 50, 200, "1/4 logs")
    bar.finish()
    assert "[#######-----------------------]  25% 1/4 logs" in out.getvalue() and out.getvalue().endswith("\n")
    quiet = io.StringIO()  # not a terminal: no bar at all
    ProgressBar(quiet, enabled=True).update("x", 1, 2, "")
    assert quiet.getvalue() == ""


def test_node_help_shows_each_default_once(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["node", "--help"])
    out = capsys.readouterr().out
    assert "(default: None)" not in out and "(default: 3181)" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("octavo ")


def test_where_etcd_is_flag_then_environment_then_dev_cluster(tmp_path: Path) -> None:
    import argparse
    import json

    from octavo.cli.common import CliError, resolve_target

    (tmp_path / "cluster.json").write_text(json.dumps({"etcd": "127.0.0.1:9", "cluster": "dev", "bookies": []}))

    def ns(**kw: object) -> argparse.Namespace:
        return argparse.Namespace(**{"etcd": None, "dev_dir": None, "cluster": None, **kw})

    t = resolve_target(ns(etcd="h:1", dev_dir=str(tmp_path)), {"OCTAVO_ETCD": "e:2"})
    assert t is not None and (t.etcd, t.cluster) == ("h:1", "dev")
    t = resolve_target(ns(dev_dir=str(tmp_path)), {"OCTAVO_ETCD": "e:2", "OCTAVO_CLUSTER": "c"})
    assert t is not None and (t.etcd, t.cluster) == ("e:2", "c")
    t = resolve_target(ns(), {"OCTAVO_DEV_DIR": str(tmp_path)})
    assert t is not None and (t.etcd, t.cluster) == ("127.0.0.1:9", "dev")
    t = resolve_target(ns(etcd="h:1"), {})
    assert t is not None and t.cluster == "default"
    with pytest.raises(CliError, match="where is etcd") as missing:
        resolve_target(ns(), {})
    assert missing.value.code == 2
    with pytest.raises(CliError, match="holds no dev cluster"):
        resolve_target(ns(dev_dir=str(tmp_path / "none")), {})


def test_bookie_addresses_ids_and_the_default_port() -> None:
    from octavo.cli.common import CliError, Target, bookie_address

    dev = Target("e:1", "default", {"bookies": [{"id": "bookie-1", "address": "127.0.0.1:4000"}]})
    assert bookie_address("bookie-1", dev) == "127.0.0.1:4000"
    assert bookie_address("bookie-9", None, {"bookie-9": "10.0.0.9:3181"}) == "10.0.0.9:3181"
    assert bookie_address("node-a", None) == "node-a:3181"  # no port: the bookie port, not 443
    assert bookie_address("node-a:4181", None) == "node-a:4181"
    assert bookie_address("[::1]", None) == "[::1]:3181"
    with pytest.raises(CliError):
        bookie_address("a:b:c", None)


def test_passwords_from_argument_file_or_environment(tmp_path: Path) -> None:
    import argparse

    from octavo.cli.common import CliError, resolve_password

    secret = tmp_path / "pw"
    secret.write_bytes(b"from-file\n")
    assert resolve_password(argparse.Namespace(password="arg", password_file=None), {}) == b"arg"
    assert resolve_password(argparse.Namespace(password=None, password_file=str(secret)), {}) == b"from-file"
    assert resolve_password(argparse.Namespace(password=None, password_file=None),
                            {"OCTAVO_PASSWORD": "env"}) == b"env"
    assert resolve_password(argparse.Namespace(password=None, password_file=None), {}) == b""
    with pytest.raises(CliError, match="cannot read --password-file"):
        resolve_password(argparse.Namespace(password=None, password_file=str(tmp_path / "no")), {})


def test_json_is_snake_case_with_64_bit_numbers_as_numbers() -> None:
    from octavo.cli.common import proto_to_dict
    from octavo.v1 import bookie_pb2 as pb

    status = pb.BookieStatus(bookie_id="b", log_total_bytes=2**40, started_unix_ms=1795400000000,
                             mode=pb.MODE_READ_ONLY,
                             directories=[pb.DirectoryUsage(path="/d", total_bytes=2**41, usage_ratio=0.5)])
    d = proto_to_dict(status)
    assert d["log_total_bytes"] == 2**40 and d["started_unix_ms"] == 1795400000000
    assert d["mode"] == "MODE_READ_ONLY" and d["directories"][0]["total_bytes"] == 2**41
    assert "logTotalBytes" not in d and d["registration_error"] == ""


def test_payloads_print_as_text_when_printable_and_hex_otherwise() -> None:
    from octavo.cli.common import format_payload

    assert format_payload(b"hello world", "auto") == "hello world"
    assert format_payload(b"a\nb", "auto") == "a\\nb"
    assert format_payload(b"\x00\xff", "auto") == "00ff"
    assert format_payload(b"hi", "hex") == "6869"
    assert format_payload(b"\xff", "text") == "\\xff"


def test_confirmation_needs_yes_when_not_at_a_terminal() -> None:
    import io

    from octavo.cli.common import CliError, confirm

    with pytest.raises(CliError, match="refusing without --yes") as refused:
        confirm("delete ledger 1", False, stdin=io.StringIO("yes\n"), stderr=io.StringIO())
    assert refused.value.code == 2
    confirm("delete ledger 1", True, stdin=io.StringIO(""), stderr=io.StringIO())

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    prompt = io.StringIO()
    confirm("delete ledger 1", False, stdin=Tty("yes\n"), stderr=prompt)
    assert "Type 'yes'" in prompt.getvalue()
    with pytest.raises(CliError, match="not confirmed"):
        confirm("delete ledger 1", False, stdin=Tty("no\n"), stderr=io.StringIO())


def test_bad_numbers_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["bookie", "status", "--bookie", "b", "--timeout", "0"],
                 ["bookie", "gc", "--bookie", "b", "--timeout", "-1"],
                 ["dataset", "gc", "d", "--grace-s", "0"],
                 ["ledger", "read", "-1"]):
        with pytest.raises(SystemExit) as done:
            build_parser().parse_args(argv)
        assert done.value.code == 2, argv
    assert "must be" in capsys.readouterr().err


def test_unusable_data_directories_and_taken_ports_are_one_line_errors(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    octavo = [sys.executable, "-m", "octavo.cli.main"]
    a_file = tmp_path / "file"
    a_file.write_text("not a directory")
    for argv in (["node", "--data-dir", str(a_file / "d"), "--port", "0"],
                 ["dev", "up", "--data-dir", str(a_file / "dev")]):
        run = subprocess.run([*octavo, *argv], capture_output=True, text=True, timeout=60)
        assert run.returncode == 1 and "Not a directory" in run.stderr and "Traceback" not in run.stderr, argv
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run([*octavo, "node", "--data-dir", str(tmp_path / "fresh"), "--port", str(port)],
                             capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "fresh").exists(), "a taken port left a half-created data directory"


# -- issue 29: usage, addressing, messages -----------------------------------------------------------------
@pytest.mark.parametrize(("argv", "usage", "hint"), [
    (["ledger", "ls", "--jsn"], "usage: octavo ledger ls", "did you mean --json?"),
    (["bookie", "compaction", "resume", "--bookie", "b", "--jason"], "usage: octavo bookie compaction resume",
     "did you mean --json?"),
    (["dev", "down", "--data-dri", "x"], "usage: octavo dev down", "did you mean --data-dir?"),
    (["cluster", "status", "extra"], "usage: octavo cluster status", "unrecognized arguments: extra"),
])
def test_a_mistyped_flag_prints_the_subcommands_usage(argv: list[str], usage: str, hint: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from octavo.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith(usage) and hint in err, err
    assert "usage: octavo [-h]" not in err


@pytest.mark.parametrize("argv", [
    ["bookie", "status", "--bookie", "b"], ["bookie", "readonly", "--bookie", "b"],
    ["bookie", "compaction", "window", "--bookie", "b", "--clear"], ["bookie", "decommission", "--bookie", "b"],
    ["cluster", "check"], ["cluster", "recover", "--bookie", "b"], ["cluster", "status"], ["ledger", "ls"],
    ["dataset", "ls"],
])
def test_allow_empty_wherever_the_cluster_is_checked(argv: list[str]) -> None:
    assert build_parser().parse_args([*argv, "--cluster", "new", "--allow-empty"]).allow_empty is True


def test_every_node_setting_has_its_help_text() -> None:
    from octavo.cli.main import NODE_SETTING_HELP
    from octavo.node.config import NodeConfig

    assert not [n for n in NodeConfig.field_names() if n not in NODE_SETTING_HELP]


def test_the_mode_is_said_once_and_a_closed_window_is_no_date_in_1970() -> None:
    from octavo.cli.bookie import describe_mode, describe_window

    forced = "read-only: forced by an administrator (release with `octavo bookie writable`)"
    assert describe_mode("read-only", forced) == forced
    assert describe_mode("writable", "writable") == "writable"
    assert describe_mode("read-only", "disk full") == "read-only: disk full"
    now_ms = 1_800_000_000_000
    assert describe_window(0, now_ms) == "no window (always allowed)"
    assert describe_window(1, now_ms).startswith("window closed") and "1970" not in describe_window(1, now_ms)
    assert describe_window(now_ms + 3_600_000, now_ms).startswith("window open until 2027-01-15")
    assert describe_window(now_ms - 60_000, now_ms).startswith("window closed since 2027-01-15")


def test_cluster_status_shows_the_read_only_threshold_in_force() -> None:
    from octavo.cli.clusterstatus import disk_cell as _disk_cell

    row = {"disk_usage_ratio": 0.5, "disk_readonly_ratio": 0.95}
    assert _disk_cell(row) == "50% (read-only at 95%)"
    assert _disk_cell({**row, "forced_read_only": True}) == \
        "50% (read-only forced by an administrator; its own mark 95%)"
    by_operator = {**row, "forced_read_only": True, "forced_threshold_ratio": 0.9,
                   "forced_reason": "the operator: disk usage 91.0% reached readOnlyRatio 90%"}
    assert _disk_cell(by_operator) == "50% (read-only forced by the operator at 90%; its own mark 95%)"


def test_the_command_runs_without_the_operator_extra() -> None:
    """`pip install octavo` without `[operator]`: kopf, kubernetes and cronsim are missing, and every command but
    `octavo operator run` must still start (the parser once imported cronsim through the uninstall command)."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "class Missing:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('cronsim', 'kopf', 'kubernetes'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, Missing())\n"
        "from octavo.cli.main import main\n"
        "sys.exit(main(['node', '--help']))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--data-dir" in done.stdout
