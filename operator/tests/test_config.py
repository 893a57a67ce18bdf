"""The operator's settings (frozen, checked) and its live state (one per operator, nothing at module level)."""

from __future__ import annotations

import ast
import dataclasses
from datetime import UTC, datetime
from pathlib import Path

import pytest

from octavo.operator.config import OperatorConfig, OperatorState

OPERATOR = Path(__file__).resolve().parents[1] / "octavo" / "operator"
# What a module-level name may be made by: immutable values only.
IMMUTABLE_MAKERS = {"frozenset", "MappingProxyType", "re.compile", "logging.getLogger", "TypeVar",
                    "Reach"}  # Reach: a frozen dataclass (bookies.py)


def test_the_settings_are_frozen_and_refused_out_of_their_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    config = OperatorConfig(poll_interval_s=2.0).validate()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.poll_interval_s = 1.0  # type: ignore[misc]
    for bad, words in ((OperatorConfig(poll_interval_s=0.01), "poll_interval_s must be in [0.1, 3600]"),
                       (OperatorConfig(roll_ready_timeout_s=0.5), "--roll-ready-timeout-s must be in [1, 86400]"),
                       (OperatorConfig(metrics_port=70000), "--metrics-port must be in [-1, 65535]"),
                       (OperatorConfig(decommission_rate_bytes_per_s=-1), "decommission_rate_bytes_per_s")):
        with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
            bad.validate()
    monkeypatch.delenv("OCTAVO_TLS_CERT_FILE", raising=False)
    with pytest.raises(ValueError, match="--metrics-tls serves the operator's certificate"):
        OperatorConfig(metrics_tls=True).validate()


def test_two_operators_in_one_process_share_no_state() -> None:
    config = OperatorConfig()
    one, two = OperatorState.start(config), OperatorState.start(config, clock_offset_s=3600)
    assert one.lock(("ns", "logs")) is one.lock(("ns", "logs"))
    assert one.lock(("ns", "logs")) is not two.lock(("ns", "logs"))
    assert one.metrics is not two.metrics and one.telemetry is not two.telemetry
    assert 3590 < (two.now() - one.now()).total_seconds() < 3610
    assert abs((one.now() - datetime.now(UTC)).total_seconds()) < 60
    two.clock_offset_s = 0.0  # a test moves an operator's clock while it runs
    assert abs((two.now() - one.now()).total_seconds()) < 60
    with pytest.raises(RuntimeError, match="no Kubernetes client yet"):
        _ = one.kube


def _mutable_at_module_level(source: str) -> list[str]:
    """Module-level names bound to a dict, list or set, or to an object not made by an IMMUTABLE_MAKER."""
    found = []
    for node in ast.parse(source).body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp | ast.SetComp) or (
                isinstance(value, ast.Call) and ast.unparse(value.func) not in IMMUTABLE_MAKERS):
            found.append(f"{node.lineno}: {ast.unparse(value)[:60]}")
    return found


def test_no_operator_module_holds_mutable_state_at_module_level() -> None:
    """Settings and live state are handed to the handlers (config.py); a module-level dict, list, set or object
    would be state shared by every operator in the process, as the old module-level CONFIG was."""
    assert _mutable_at_module_level("CONFIG = OperatorState()\nLOCKS: dict[str, int] = {}\n"
                                    "NAMES = frozenset({'a'})\nLIMIT = 3\n") == [
        "1: OperatorState()", "2: {}"]
    for path in sorted(OPERATOR.glob("*.py")):
        source = path.read_text()
        assert _mutable_at_module_level(source) == [], path.name
        assert "global " not in source, path.name
