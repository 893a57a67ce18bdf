"""A Kubernetes to run the operator against where no real one can run: kmock's API emulator with the
bookkeeping an API server does (apiserver.py) and a pod runner that plays the kubelet and the StatefulSet
controller with real `octavo node` processes on loopback addresses (podrunner.py)."""
