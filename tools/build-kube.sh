#!/bin/sh
# Builds kube-apiserver, kube-controller-manager and kube-scheduler from k8s.io/kubernetes (the version pinned in
# tools/kube/go.mod) into DEST (default .tools/kube/<version>), with the version stamped the way Kubernetes'
# own build does (a plain `go build` reports v0.0.0-master, which charts' kubeVersion constraints refuse).
# Rebuilds nothing when DEST already holds the binaries of that version. Needs Go >= 1.25 and the Go module
# proxy; prints what it builds and how long it took.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
version=$(sed -n 's/^[[:space:]]*k8s.io\/kubernetes \(v[0-9][0-9.]*\).*$/\1/p' "$here/kube/go.mod" | head -1)
[ -n "$version" ] || { echo "build-kube: no k8s.io/kubernetes version in $here/kube/go.mod" >&2; exit 1; }
dest=${1:-$here/../.tools/kube/$version}
binaries="kube-apiserver kube-controller-manager kube-scheduler"
missing=""
for b in $binaries; do [ -x "$dest/$b" ] || missing="$missing $b"; done
if [ -z "$missing" ]; then
    echo "build-kube: $binaries $version already built in $dest"
    exit 0
fi
command -v go >/dev/null || { echo "build-kube: Go is needed (go >= 1.25) to build the Kubernetes control plane" >&2; exit 1; }
minor=$(echo "$version" | cut -d. -f2)
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 \
-X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean \
-X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z \
-X k8s.io/client-go/pkg/version.gitVersion=$version -X k8s.io/client-go/pkg/version.gitMajor=1 \
-X k8s.io/client-go/pkg/version.gitMinor=$minor"
mkdir -p "$dest"
start=$(date +%s)
for b in $missing; do
    t0=$(date +%s)
    echo "build-kube: building $b $version (k8s.io/kubernetes/cmd/$b) into $dest"
    (cd "$here/kube" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$dest/$b.part" "k8s.io/kubernetes/cmd/$b")
    mv "$dest/$b.part" "$dest/$b"
    echo "build-kube: $b built in $(( $(date +%s) - t0 ))s"
done
echo "build-kube: $missing built in $(( $(date +%s) - start ))s; $("$dest/kube-apiserver" --version)"
