"""The Kubernetes operator (kopf): BookieCluster and CompactionPolicy reconciled around pure decisions
(docs/architecture.md, "The operator"; docs/kubernetes.md)."""
