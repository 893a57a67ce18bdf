"""One container of a pod: its process (started through launch.py), its restarts with back-off, its probes, and
the status a kubelet reports for it (state, lastState, restartCount, ready, started). The pod worker (pods.py)
drives it; `now` is time.monotonic(), passed in."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from octavo.cli.kubeagent import probes
from octavo.cli.kubeagent.volumes import Mount

LAUNCHER = str(Path(__file__).with_name("launch.py"))
RESTART_BACKOFF_S_MIN = 1.0   # the kubelet starts at 10 s; tests and `dev up` want a crash back sooner
RESTART_BACKOFF_S_MAX = 60.0  # the kubelet's cap is 300 s
BACKOFF_RESET_S = 60.0        # a container that ran this long starts its back-off again from the minimum
EXIT_SIGNAL_BASE = 128


def rfc3339(wall: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if wall is None else wall))


@dataclass
class Launch:
    """Everything the process needs; `argv` and `env` already expanded."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    hostname: str
    netns: str | None
    mounts: list[Mount]


@dataclass
class Container:
    spec: dict[str, Any]
    log_dir: Path
    init: bool = False
    proc: subprocess.Popen[bytes] | None = None
    launch: Launch | None = None
    restart_count: int = 0
    state: dict[str, Any] = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict[str, Any] = field(default_factory=dict)
    started_mono: float = 0.0
    exited_mono: float = 0.0
    backoff_s: float = 0.0
    ready: bool = False
    started: bool = False  # the startup probe passed (or there is none)
    probe_states: dict[str, probes.ProbeState] = field(default_factory=dict)
    exit_code: int | None = None

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    @property
    def previous_log_path(self) -> Path:
        return self.log_dir / f"{self.name}.previous.log"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def waiting(self, reason: str, message: str = "") -> None:
        self.state = {"waiting": {"reason": reason, **({"message": message[:1000]} if message else {})}}

    def start(self, launch: Launch, now: float) -> None:
        if self.running():
            raise RuntimeError(f"container {self.name} is running already")
        self.launch = launch
        if self.proc is not None and self.log_path.exists():  # a restart: the previous run's log stays readable
            os.replace(self.log_path, self.previous_log_path)
        spec_path = self.log_dir / f"{self.name}.launch.json"
        fd = os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the environment holds secrets
        with os.fdopen(fd, "w") as f:
            json.dump({"argv": launch.argv, "env": launch.env, "cwd": launch.cwd, "hostname": launch.hostname,
                       "netns": launch.netns, "mounts": [m.__dict__ for m in launch.mounts],
                       "keep": host_program_paths()}, f)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-S", LAUNCHER, str(spec_path)], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                         env={}, close_fds=True)
        self.started_mono, self.exit_code, self.ready = now, None, False
        self.state = {"running": {"startedAt": rfc3339()}}
        self.started = "startupProbe" not in self.spec
        self.probe_states = {kind: probes.ProbeState(self.spec[kind], now)
                             for kind in ("startupProbe", "livenessProbe", "readinessProbe") if kind in self.spec}

    def poll_exit(self, now: float) -> bool:
        """True when the process has just exited (its state is then terminated)."""
        if self.proc is None or self.exit_code is not None or self.proc.poll() is None:
            return False
        code = self.proc.returncode
        self.exit_code = EXIT_SIGNAL_BASE - code if code < 0 else code
        started_at = self.state.get("running", {}).get("startedAt", rfc3339())
        self.state = {"terminated": {"exitCode": self.exit_code, "reason": "Completed" if self.exit_code == 0
                                     else "Error", "startedAt": started_at, "finishedAt": rfc3339()}}
        if code < 0:
            self.state["terminated"]["signal"] = -code
        self.exited_mono, self.ready, self.started = now, False, False
        ran_s = now - self.started_mono
        self.backoff_s = RESTART_BACKOFF_S_MIN if (ran_s >= BACKOFF_RESET_S or not self.backoff_s) \
            else min(self.backoff_s * 2, RESTART_BACKOFF_S_MAX)
        return True

    def should_restart(self, policy: str) -> bool:
        if self.exit_code is None:
            return False
        return policy == "Always" or (policy == "OnFailure" and self.exit_code != 0)

    def restart_due(self, now: float) -> bool:
        return now >= self.exited_mono + self.backoff_s

    def restart(self, now: float) -> None:
        """Start it again from its last Launch; the terminated state becomes lastState."""
        if self.launch is None:
            raise RuntimeError(f"container {self.name} never started")
        if "terminated" in self.state:  # else it was kept when the back-off began (pods.py)
            self.last_state = self.state
        self.restart_count += 1
        self.start(self.launch, now)

    def signal(self, sig: int, group: bool = False) -> None:
        if not self.running():
            return
        assert self.proc is not None
        try:
            if group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL its process group, and reap it."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def run_probes(self, now: float, pod_ip: str) -> str | None:
        """Run the probes that are due; what to do: "restart" (liveness or start-up failed), else None."""
        if not self.running() or self.proc is None or self.launch is None:
            return None
        order = ["startupProbe"] if not self.started else ["livenessProbe", "readinessProbe"]
        for kind in order:
            state = self.probe_states.get(kind)
            if state is None or not state.due(now):
                continue
            ok = probes.run(state.probe, self.spec, pod_ip, self.proc.pid, self.launch.env)
            result = state.record(now, ok)
            if kind == "startupProbe" and result:
                self.started = True
                for later in ("livenessProbe", "readinessProbe"):
                    if later in self.probe_states:
                        self.probe_states[later] = probes.ProbeState(self.spec[later], now)
            elif kind in ("startupProbe", "livenessProbe") and result is False:
                return "restart"
            elif kind == "readinessProbe" and result is not None:
                self.ready = result
        if self.started and "readinessProbe" not in self.probe_states:
            self.ready = True
        return None

    def status(self, image_id: str) -> dict[str, Any]:
        pid = self.proc.pid if self.proc is not None else 0
        out: dict[str, Any] = {
            "name": self.name, "image": self.spec.get("image", ""), "imageID": image_id,
            "ready": self.ready, "restartCount": self.restart_count, "state": self.state,
            "lastState": self.last_state, "started": self.started and self.running(),
        }
        if pid:
            out["containerID"] = f"octavo://{pid}"
        return out


def host_program_paths() -> list[str]:
    """What a container's programs need from the host, whatever its volumes cover: this Python environment (the
    `octavo` script, the interpreter and its packages, the sources of an editable install) and the etcd
    binaries. A volume mounted over a directory holding one of them (an emptyDir at /tmp, with the checkout under
    /tmp) would hide it: the launcher binds these back after the volumes."""
    import octavo

    paths = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    paths.update(p for p in sys.path if p and os.path.isdir(p))
    # An editable install finds the `octavo` packages through an import hook, not sys.path: their directories.
    paths.update(os.path.dirname(p) for p in octavo.__path__)
    try:
        from octavo.cli.localcluster import etcd_binary

        paths.add(os.path.dirname(etcd_binary()))
    except FileNotFoundError:
        pass
    return sorted(os.path.abspath(p) for p in paths)
