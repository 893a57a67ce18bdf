#!/bin/sh
# Creates the kind cluster, builds and loads the images, installs the chart (what the e2e fixture does, for
# trying it by hand). Needs kind, kubectl, helm and Docker. `sh e2e/kind/kind-down.sh` removes it all.
set -eu
cd "$(dirname "$0")/../.."
name=${KIND_CLUSTER:-octavo-e2e}
kind get clusters | grep -qx "$name" || kind create cluster --name "$name" --config e2e/kind/kind-config.yaml --wait 180s
docker build -t octavo:dev --target octavo .
docker build -t octavo-spark:dev --target spark .
kind load docker-image octavo:dev octavo-spark:dev --name "$name"
kubectl --context "kind-$name" create namespace octavo --dry-run=client -o yaml | kubectl --context "kind-$name" apply -f -
helm upgrade --install octavo charts/octavo --kube-context "kind-$name" -n octavo -f e2e/kind/values-kind.yaml \
  --wait --timeout 10m
kubectl --context "kind-$name" -n octavo wait bookiecluster/octavo --for=condition=Ready --timeout=10m
helm test octavo --kube-context "kind-$name" -n octavo
