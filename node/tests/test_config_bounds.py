"""Every numeric bookie setting has a lowest and a highest value, checked at startup with a message naming it
(issue 37: a 1 PiB index map passed and the bookie blamed its index)."""

from __future__ import annotations

import dataclasses

import pytest

from octavo.node.config import BOUNDS, ConfigError, NodeConfig


def numeric_fields() -> list[str]:
    return [f.name for f in dataclasses.fields(NodeConfig)
            if f.type in ("int", "float") or f.type in (int, float)]


def test_every_numeric_setting_has_bounds_that_hold_its_default() -> None:
    assert sorted(numeric_fields()) == sorted(BOUNDS), "add the new setting's [lowest, highest] to BOUNDS"
    for name, (low, high) in BOUNDS.items():
        default = getattr(NodeConfig(data_dir="/d"), name)
        assert low <= default <= high, (name, default)


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_a_value_past_either_bound_is_refused_naming_the_setting(name: str) -> None:
    low, high = BOUNDS[name]
    kind = type(getattr(NodeConfig(data_dir="/d"), name))
    for bad in (low - 1, high + 1) if kind is int else (low - 0.5, high + 0.5):
        with pytest.raises(ConfigError, match=rf"\b{name}\b[^;]* must be"):
            NodeConfig(data_dir="/d", **{name: kind(bad)}).validate()


def test_the_index_map_of_issue_37_is_refused_with_its_range() -> None:
    with pytest.raises(ConfigError, match=r"index_map_size_bytes must be in \[64 MiB, 16 TiB\], got 1125899906842624"):
        NodeConfig(data_dir="/d", index_map_size_bytes=1 << 50).validate()


def test_every_problem_is_reported_at_once() -> None:
    problems = NodeConfig(data_dir="/d", gc_interval_ms=-1, port=70000, trace_sample_ratio=2.0).problems()
    assert sorted(p.split(" ", 1)[0] for p in problems) == ["gc_interval_ms", "port", "trace_sample_ratio"]
    with pytest.raises(ConfigError, match=r"port must be in .*; .*gc_interval_ms must be in"):
        NodeConfig(data_dir="/d", gc_interval_ms=-1, port=70000).validate()


TIME_WORDS = ("interval", "delay", "ttl", "grace", "wait", "time", "timeout", "age", "period")
TIME_UNITS = ("ms", "s")


@pytest.mark.parametrize("name", numeric_fields())
def test_every_duration_setting_names_its_unit_once(name: str) -> None:
    """Issue 30: NodeConfig mixes milliseconds (gc_interval_ms) and seconds (audit_interval_s), so every duration
    says its unit in its name (the unit last, or before _max/_min), and only one."""
    parts = name.split("_")
    units = [p for p in parts if p in TIME_UNITS]
    if any(word in parts for word in TIME_WORDS):
        assert len(units) == 1, f"{name}: a duration names exactly one unit ({'/'.join(TIME_UNITS)})"
        rest = parts[parts.index(units[0]) + 1:]
        assert rest in ([], ["max"], ["min"]), f"{name}: the unit goes last (or before _max/_min)"
    else:
        assert units in ([], ["s"]) and (not units or parts[-3:] == ["bytes", "per", "s"]), \
            f"{name}: a time unit in a setting that is not a duration or a rate"
