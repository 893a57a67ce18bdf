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
    assert parse_window(ns(until="2026-11-23T06:00")) == 1795413600000
    assert parse_window(ns(until="2026-11-23T06:00+01:00")) == 1795413600000 - 3600 * 1000
    for bad in (ns(for_="0h"), ns(for_="soon"), ns(until="tomorrow")):
        try:
            parse_window(bad)
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
