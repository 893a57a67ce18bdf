"""The Kubernetes operator (kopf): a later issue builds it."""
