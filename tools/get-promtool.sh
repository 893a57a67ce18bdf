#!/bin/sh
# Installs promtool (Prometheus's rule checker and rule unit-test runner) into DEST (default .tools/bin) from
# Debian's `prometheus` package: `apt-get download` fetches the .deb without installing it (no root needed
# beyond what apt's lists need; as root it refreshes them once when the download fails), and dpkg-deb unpacks
# it. The chart's alert rules are checked and unit-tested with it (charts/tests/test_monitoring.py). About 2 s
# and 19 MB.
set -eu
dest=${1:-.tools/bin}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$dest"
command -v apt-get >/dev/null || { echo "get-promtool: apt-get is needed to fetch Debian's prometheus package" >&2; exit 1; }
download() { (cd "$tmp" && apt-get download prometheus >/dev/null 2>"$tmp/apt.err"); }
# A fresh machine's package lists may be empty or stale: refresh them once (as root) when the download fails.
download || { [ "$(id -u)" = 0 ] && apt-get update -q >/dev/null 2>>"$tmp/apt.err" && download; } || {
    cat "$tmp/apt.err" >&2
    echo "get-promtool: 'apt-get download prometheus' failed (as root, after apt-get update if it could)" >&2
    exit 1
}
dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
cp "$tmp/x/usr/bin/promtool" "$dest/promtool.part"
chmod 755 "$dest/promtool.part"
mv "$dest/promtool.part" "$dest/promtool"
"$dest/promtool" --version | head -1
