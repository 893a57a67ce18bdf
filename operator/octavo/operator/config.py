"""The operator's two objects, handed to every handler by `handlers.register`: its settings and its live state.

`OperatorConfig` is what `octavo operator run` was told (its flags; $OCTAVO_TLS_* for --metrics-tls): frozen,
checked once by `validate`. `OperatorState` is what the operator holds while it runs: the Kubernetes client, a
lock per cluster, the scale-downs under way, its metrics, its clock. One of each per operator: a test that starts
several operators in one process gives each its own, and nothing of either lives at module level.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from octavo.meta.tls import TlsError, TlsFiles
from octavo.operator.bookies import ADMIN_TIMEOUT_S
from octavo.operator.kube import Kube, load_api_client
from octavo.operator.operatormetrics import OperatorMetrics
from octavo.operator.rolling import ROLL_READY_TIMEOUT_S
from octavo.operator.scaling import ScaleDownStep
from octavo.telemetry import Telemetry

# A cluster, as the operator's state keys it: (namespace, name).
ClusterKey = tuple[str, str]


@dataclass(frozen=True)
class OperatorConfig:
    """The operator's settings (`octavo operator run` flags)."""

    poll_interval_s: float = 10.0
    admin_timeout_s: float = ADMIN_TIMEOUT_S
    # A rolling restart halts when a restarted bookie is not Ready within this (rolling.py).
    roll_ready_timeout_s: float = ROLL_READY_TIMEOUT_S
    # The copy rate of a scale-down's decommission, per decommission (the same default as re-replication).
    decommission_rate_bytes_per_s: int = 4 << 20
    kubeconfig: str | None = None
    # Metrics: served on /metrics at metrics_host:metrics_port (-1: no endpoint; 0: a free port).
    metrics_port: int = -1
    metrics_host: str = "0.0.0.0"
    # Serve /metrics over TLS with the operator's own certificate ($OCTAVO_TLS_CERT_FILE, $OCTAVO_TLS_KEY_FILE).
    metrics_tls: bool = False
    # Also push the metrics to this OpenTelemetry collector (host:port; https:// for TLS); empty: none.
    otlp_endpoint: str = ""

    def validate(self) -> OperatorConfig:
        if not 0.1 <= self.poll_interval_s <= 3600:
            raise ValueError(f"poll_interval_s must be in [0.1, 3600], got {self.poll_interval_s}")
        if not 0.1 <= self.admin_timeout_s <= 300:
            raise ValueError(f"admin_timeout_s must be in [0.1, 300], got {self.admin_timeout_s}")
        if not 1 <= self.roll_ready_timeout_s <= 86400:
            raise ValueError(f"--roll-ready-timeout-s must be in [1, 86400], got {self.roll_ready_timeout_s}")
        if self.decommission_rate_bytes_per_s < 0:
            raise ValueError("decommission_rate_bytes_per_s must be >= 0 (0: unlimited)")
        if not -1 <= self.metrics_port <= 65535:
            raise ValueError(f"--metrics-port must be in [-1, 65535] (-1: off), got {self.metrics_port}")
        if self.metrics_tls:
            tls = TlsFiles.from_env()
            if not tls.cert_file or not tls.key_file:
                raise ValueError("--metrics-tls serves the operator's certificate: set OCTAVO_TLS_CERT_FILE and "
                                 "OCTAVO_TLS_KEY_FILE")
            try:
                tls.check("OCTAVO_TLS")
            except TlsError as e:
                raise ValueError(str(e)) from None
        return self


@dataclass
class OperatorState:
    """What a running operator holds. Made by `start`; its Kubernetes client by `connect`, at the operator's
    startup (kopf runs startup handlers before any resource handler)."""

    telemetry: Telemetry
    metrics: OperatorMetrics
    # The operator's clock runs this far ahead of the machine's: for trying compaction windows out (tests,
    # demos, which move it while the operator runs); 0 in production.
    clock_offset_s: float = 0.0
    locks: dict[ClusterKey, asyncio.Lock] = field(default_factory=dict)
    scale_downs: dict[ClusterKey, asyncio.Task[ScaleDownStep]] = field(default_factory=dict)
    # The last refusal of each cluster's scale-down: its Warning event is posted once per change of reason.
    scale_down_refusals: dict[ClusterKey, str] = field(default_factory=dict)
    # The last refused spec of each cluster reported in an InvalidSpec event (until a spec is applied).
    spec_errors: dict[ClusterKey, str] = field(default_factory=dict)
    last_poll_unix_s: float = 0.0
    _kube: Kube | None = None

    @classmethod
    def start(cls, config: OperatorConfig, clock_offset_s: float = 0.0) -> OperatorState:
        telemetry = Telemetry("octavo-operator", otlp_endpoint=config.otlp_endpoint)
        return cls(telemetry, OperatorMetrics(telemetry), clock_offset_s=clock_offset_s)

    def connect(self, config: OperatorConfig) -> None:
        """The Kubernetes client (a pod's service account, else the kubeconfig); once."""
        if self._kube is None:
            self._kube = Kube(load_api_client(config.kubeconfig))

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            raise RuntimeError("the operator has no Kubernetes client yet: its startup handler makes it (connect)")
        return self._kube

    def now(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=self.clock_offset_s)

    def lock(self, key: ClusterKey) -> asyncio.Lock:
        """One reconcile at a time per cluster (a change and a poll may come together)."""
        return self.locks.setdefault(key, asyncio.Lock())
