"""The node agent for the local Kubernetes control plane (issue 40): nodes, pods as local processes, local
PersistentVolumes, the kubelet's log endpoint. See agent.py and docs/kubernetes.md."""

from octavo.cli.kubeagent.agent import AgentConfig, AgentError, NodeAgent, agent_config

__all__ = ["AgentConfig", "AgentError", "NodeAgent", "agent_config"]
