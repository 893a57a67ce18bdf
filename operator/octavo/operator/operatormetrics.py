"""The operator's metrics (docs/operations.md): how long reconciles take, what it did to bookies, which
compaction windows are open, scale-downs under way. Served on /metrics when `octavo operator run` is given
--metrics-port (the chart sets it)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from opentelemetry.metrics import CallbackOptions, Observation

from octavo.telemetry import Telemetry


class OperatorMetrics:
    def __init__(self, telemetry: Telemetry) -> None:
        meter = telemetry.meter("octavo.operator")
        self.reconcile_duration = meter.create_histogram(
            "octavo.operator.reconcile.duration", unit="s",
            description="one reconcile of a BookieCluster (trigger: change or poll; result: ok, spec_error, error)")
        self.actions = meter.create_counter(
            "octavo.operator.actions", unit="{action}",
            description="actions on bookies by kind (ForceReadOnly, ReleaseReadOnly, OpenWindow, CloseWindow, "
                        "...) and result (ok, failed)")
        self.objects_applied = meter.create_counter(
            "octavo.operator.objects_applied", unit="{object}",
            description="owned objects (StatefulSet, Services, ConfigMap, PDB) created or changed")
        self.windows: dict[tuple[str, str], bool] = {}  # (namespace, policy) -> a window is open now
        self.scale_downs = 0
        meter.create_observable_gauge("octavo.operator.windows_open", [self._windows],
                                      description="1 for each CompactionPolicy whose compaction window is open now")
        meter.create_observable_up_down_counter("octavo.operator.scale_downs", [self._scale_downs],
                                                unit="{cluster}", description="scale-downs being decommissioned")

    @contextmanager
    def reconciling(self, trigger: str) -> Iterator[dict[str, str]]:
        """Time one reconcile; the block may set the result in the dict it gets ('ok' unless it raises)."""
        attributes = {"trigger": trigger, "result": "ok"}
        t0 = time.perf_counter()
        try:
            yield attributes
        except BaseException:
            attributes["result"] = "error"
            raise
        finally:
            self.reconcile_duration.record(time.perf_counter() - t0, attributes)

    def _windows(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(int(is_open), {"namespace": ns, "policy": name})
                for (ns, name), is_open in sorted(self.windows.items())]

    def _scale_downs(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self.scale_downs)]
