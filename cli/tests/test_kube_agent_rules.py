"""The node agent's pure rules (octavo.cli.kubeagent): `$(VAR)` expansion, the environment, images as local
programs, the pod phase and conditions, probe thresholds, log tails. The agent itself runs for real in
e2e/local/scenarios/test_kube_agent.py."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from octavo.cli.kubeagent import images
from octavo.cli.kubeagent.logserver import tail
from octavo.cli.kubeagent.podspec import MissingReference, environment, expand, field_value, quantity
from octavo.cli.kubeagent.probes import ProbeState
from octavo.cli.kubeagent.status import conditions, phase

POD: dict[str, Any] = {
    "metadata": {"name": "web-0", "namespace": "prod", "uid": "u-1", "labels": {"app": "web", "tier": "a"}},
    "spec": {"nodeName": "node-1", "serviceAccountName": "sa", "containers": [{"name": "app"}]},
    "status": {"podIP": "10.244.0.5", "podIPs": [{"ip": "10.244.0.5"}], "hostIP": "10.244.0.1"},
}


@pytest.mark.parametrize(("text", "env", "expected"), [
    ("$(A)-$(B)", {"A": "1"}, "1-$(B)"),
    ("$$(A)", {"A": "1"}, "$(A)"),
    ("$$", {}, "$"),
    ("a$(A", {"A": "1"}, "a$(A"),
    ("$(A)$(A)", {"A": "x"}, "xx"),
])
def test_expansion_follows_kubernetes(text: str, env: dict[str, str], expected: str) -> None:
    assert expand(text, env) == expected


def test_field_values() -> None:
    assert field_value(POD, "metadata.name") == "web-0"
    assert field_value(POD, "status.podIP") == "10.244.0.5"
    assert field_value(POD, "spec.nodeName") == "node-1"
    assert field_value(POD, "metadata.labels['app']") == "web"
    assert field_value(POD, "metadata.labels") == 'app="web"\ntier="a"\n'
    with pytest.raises(ValueError, match="unsupported fieldRef"):
        field_value(POD, "spec.nope")


def test_environment_in_order_with_references() -> None:
    objects = {("configmaps", "cm"): {"k": "v", "X": "from-cm"},
               ("secrets", "s"): {"pw": base64.b64decode(base64.b64encode(b"pw!")).decode()}}
    container = {"name": "app", "resources": {"limits": {"memory": "1Gi"}},
                 "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "P_"}],
                 "env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
                         {"name": "B", "value": "$(A)/$(POD)/$(P_X)"},
                         {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                         {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "s", "key": "pw"}}},
                         {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory",
                                                                            "divisor": "1Mi"}}},
                         {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "x",
                                                                        "optional": True}}}]}
    env = environment(POD, container, lambda kind, name: objects.get((kind, name)), {"PATH": "/bin"}, {})
    assert env == {"PATH": "/bin", "P_k": "v", "P_X": "from-cm", "A": "v", "B": "v/$(POD)/from-cm",
                   "POD": "web-0", "PW": "pw!", "MEM": "1024"}
    missing = {"name": "app", "env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "no", "key": "k"}}}]}
    with pytest.raises(MissingReference, match="configmap 'no'"):
        environment(POD, missing, lambda kind, name: None, {}, {})


def test_quantities() -> None:
    assert quantity("500m") * 1000 == 500
    assert quantity("1Gi") == 2**30
    assert quantity("2") == 2
    with pytest.raises(ValueError):
        quantity("lots")


@pytest.mark.parametrize(("container", "argv"), [
    ({"name": "b", "image": "ghcr.io/octavo-io/octavo:0.4", "args": ["node", "--config", "/etc/octavo/b.toml"]},
     ["octavo", "node", "--config", "/etc/octavo/b.toml"]),
    ({"name": "b", "image": "octavo:dev"}, ["octavo", "node", "--data-dir", "/data", "--host", "0.0.0.0"]),
    ({"name": "o", "image": "octavo@sha256:abc", "command": ["octavo"], "args": ["operator", "run"]},
     ["octavo", "operator", "run"]),
    ({"name": "e", "image": "quay.io/coreos/etcd:v3.5.21", "command": ["etcd", "--name=x"]}, ["etcd", "--name=x"]),
    ({"name": "p", "image": "python:3.11"}, ["python3"]),
])
def test_images_map_to_local_programs(container: dict[str, Any], argv: list[str]) -> None:
    assert images.argv(container) == argv


def test_an_unknown_image_needs_a_command() -> None:
    with pytest.raises(ValueError, match="no entrypoint"):
        images.argv({"name": "x", "image": "busybox"})
    assert images.argv({"name": "x", "image": "busybox", "command": ["sleep", "1"]}) == ["sleep", "1"]


class C:
    def __init__(self, exit_code: int | None, running: bool, ready: bool = False, policy_restart: bool = False):
        self.name, self.exit_code, self._running, self.ready = "c", exit_code, running, ready
        self._restart = policy_restart

    def running(self) -> bool:
        return self._running

    def should_restart(self, policy: str) -> bool:
        return policy == "Always" or (policy == "OnFailure" and self.exit_code not in (None, 0))

    def status(self, image_id: str) -> dict[str, Any]:
        return {"name": self.name}


def test_phase() -> None:
    assert phase([], [C(None, False)], "Always") == "Pending"
    assert phase([C(None, True)], [C(None, False)], "Always") == "Pending"
    assert phase([C(1, False)], [C(None, False)], "Never") == "Failed"
    assert phase([], [C(None, True)], "Always") == "Running"
    assert phase([], [C(0, False)], "Never") == "Succeeded"
    assert phase([], [C(2, False)], "Never") == "Failed"
    assert phase([], [C(2, False)], "OnFailure") == "Running"  # to be restarted
    assert phase([], [C(0, False)], "OnFailure") == "Succeeded"
    assert phase([], [C(0, False)], "Always") == "Running"


def test_conditions_keep_their_transition_time_while_unchanged() -> None:
    first = conditions(POD, [], True, False, "t1")
    assert {c["type"]: c["status"] for c in first} == {"PodScheduled": "True", "Initialized": "True",
                                                       "ContainersReady": "False", "Ready": "False"}
    again = conditions(POD, first, True, False, "t2")
    assert again == first
    ready = conditions(POD, first, True, True, "t3")
    assert {c["type"]: c["lastTransitionTime"] for c in ready} == {"PodScheduled": "t1", "Initialized": "t1",
                                                                   "ContainersReady": "t3", "Ready": "t3"}


def test_probe_thresholds() -> None:
    state = ProbeState({"initialDelaySeconds": 5, "periodSeconds": 2, "failureThreshold": 2,
                        "successThreshold": 2}, started_at=100.0)
    assert not state.due(104.9) and state.due(105.0)
    assert state.record(105.0, True) is None
    assert state.record(107.0, True) is True and state.next_at == 109.0
    assert state.record(109.0, False) is True  # one failure is below the threshold
    assert state.record(111.0, False) is False


def test_tail() -> None:
    assert tail(b"a\nb\nc\n", 2) == b"b\nc\n"
    assert tail(b"a\nb\nc", 1) == b"c"
    assert tail(b"a\n", 0) == b""
