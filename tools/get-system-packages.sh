#!/bin/sh
# Installs the Debian packages whose commands the test suite runs, for each COMMAND=PACKAGE argument whose
# COMMAND is not on PATH: `nft` and `ip` (nftables, iproute2) for the network-fault tests in namespaces
# (e2e/netfaults/), `java` for local Spark, `npm` for tools/get-helm.sh. Idempotent and quiet: nothing happens
# when every command is there. Installing needs root and apt-get; without them it says what is missing and
# exits 0, and the tests that need the command skip with the reason (under CI=true they fail: conftest.py).
# `apt-get update` runs only when the install fails (a fresh machine's package lists may be empty or stale).
set -eu
missing=""
for pair in "$@"; do
    command -v "${pair%%=*}" >/dev/null 2>&1 || missing="$missing ${pair#*=}"
done
[ -n "$missing" ] || exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "get-system-packages: missing$missing; not installed (needs root and apt-get): the tests that need them skip" >&2
    exit 0
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086 # $missing is a list of package names
install() { apt-get install -y -q --no-install-recommends $missing >"$log" 2>&1; }
if ! install; then
    apt-get update -q >"$log" 2>&1 || { cat "$log" >&2; echo "get-system-packages: apt-get update failed" >&2; exit 1; }
    install || { cat "$log" >&2; echo "get-system-packages: apt-get install$missing failed" >&2; exit 1; }
fi
echo "get-system-packages: installed$missing"
