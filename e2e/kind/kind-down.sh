#!/bin/sh
# Deletes the kind cluster kind-up.sh made.
set -eu
kind delete cluster --name "${KIND_CLUSTER:-octavo-e2e}"
