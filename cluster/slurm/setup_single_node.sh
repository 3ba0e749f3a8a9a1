#!/usr/bin/env bash
# Set up (or check) a single-node SLURM cluster on THIS machine: controller and compute node in one.
#
#   sudo cluster/slurm/setup_single_node.sh          # as root; safe to run again (idempotent)
#   sinfo; srun hostname; sbatch --wrap hostname      # then SLURM is ready
#
# What it does, each step only when needed:
#   1. installs the Debian/Ubuntu packages slurm-wlm and munge (apt-get, non-interactive);
#   2. creates a munge key (/etc/munge/munge.key) if there is none;
#   3. writes /etc/slurm/slurm.conf for this host: its hostname, CPUs and RealMemory as slurmd
#      detects them, one partition `debug` (Default=YES), proctrack/linuxproc, task/none, no
#      cgroups, no accounting, root allowed to run jobs (CI runs as root); state and logs under
#      /var/spool/slurm* and /var/log/slurm;
#   4. starts munged, slurmctld and slurmd directly (no systemd needed; on a host that runs
#      systemd the packaged units are stopped first so they do not fight over the pid files);
#   5. waits (at most SLURM_SETUP_TIMEOUT seconds, default 60) until `sinfo` shows the node idle.
#
# Exits 0 when the node is idle and accepting jobs; otherwise non-zero with a message naming the
# step that failed and the log file to read. Environment knobs:
#   SLURM_SETUP_TIMEOUT   seconds to wait for the node (default 60)
#   SLURM_PARTITION       partition name (default debug)
#   SLURM_CLUSTER_NAME    cluster name (default mklscale)
#   SLURM_FORCE_RESTART=1 restart the daemons even if the config did not change
set -euo pipefail

TIMEOUT="${SLURM_SETUP_TIMEOUT:-60}"
PARTITION="${SLURM_PARTITION:-debug}"
CLUSTER_NAME="${SLURM_CLUSTER_NAME:-mklscale}"
CONF_DIR=/etc/slurm
CONF="$CONF_DIR/slurm.conf"
LOG_DIR=/var/log/slurm
CTLD_SPOOL=/var/spool/slurmctld
SLURMD_SPOOL=/var/spool/slurmd
MUNGE_KEY=/etc/munge/munge.key

log() { echo "[slurm-setup] $*"; }
die() { echo "[slurm-setup] ERROR: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages and starts system daemons); try: sudo $0"

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null 2>&1 || missing+=(slurmctld)
    command -v slurmd >/dev/null 2>&1 || missing+=(slurmd)
    command -v sinfo >/dev/null 2>&1 || missing+=(slurm-client)
    command -v munged >/dev/null 2>&1 || missing+=(munge)
    [ ${#missing[@]} -eq 0 ] && { log "packages already installed"; return; }
    command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get to install them; install SLURM and munge by hand"
    log "installing slurm-wlm munge (missing: ${missing[*]})"
    # Keep package scripts from starting daemons with the packaged (empty) config.
    local policy=/usr/sbin/policy-rc.d created_policy=0
    if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; created_policy=1; fi
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends slurm-wlm munge >/tmp/slurm-setup-apt.log 2>&1; then
        log "apt-get install failed; retrying after apt-get update"
        apt-get update -q >>/tmp/slurm-setup-apt.log 2>&1 || true
        apt-get install -y -q --no-install-recommends slurm-wlm munge >>/tmp/slurm-setup-apt.log 2>&1 \
            || { [ $created_policy -eq 1 ] && rm -f "$policy"; die "apt-get install slurm-wlm munge failed; see /tmp/slurm-setup-apt.log"; }
    fi
    [ $created_policy -eq 1 ] && rm -f "$policy"
    log "installed: $(slurmd -V 2>/dev/null || echo "slurm (version unknown)")"
}

uses_systemd() { [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; }

munge_key() {
    if [ -s "$MUNGE_KEY" ]; then log "munge key present"; else
        log "creating munge key $MUNGE_KEY"
        mkdir -p /etc/munge
        if command -v mungekey >/dev/null 2>&1; then mungekey --create --keyfile="$MUNGE_KEY" --force
        else dd if=/dev/urandom of="$MUNGE_KEY" bs=1 count=1024 status=none; fi
    fi
    chown munge:munge "$MUNGE_KEY" && chmod 0400 "$MUNGE_KEY"
}

start_munge() {
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then log "munged running"; return; fi
    log "starting munged"
    mkdir -p /run/munge /var/lib/munge /var/log/munge
    chown munge:munge /run/munge /var/lib/munge /var/log/munge /etc/munge
    chmod 0755 /run/munge; chmod 0700 /etc/munge /var/lib/munge /var/log/munge
    if uses_systemd; then systemctl restart munge || true; fi
    if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        rm -f /run/munge/munge.socket.2 /run/munge/munged.pid
        if command -v runuser >/dev/null 2>&1; then runuser -u munge -- munged
        else su -s /bin/sh munge -c munged; fi
    fi
    for _ in $(seq 1 20); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && { log "munged ok"; return; }; sleep 0.5; done
    die "munged does not answer (munge -n | unmunge fails); see /var/log/munge/munged.log"
}

# Prints the config for this host. CPUs and RealMemory come from `slurmd -C` (what slurmd will
# detect and register: a larger RealMemory would mark the node INVALID), the host name from
# `hostname -s` (slurmd finds its NodeName by it). NodeAddr is loopback: a single-node cluster
# needs no resolvable host name.
render_conf() {
    local host cpus mem detected
    host="$(hostname -s)"
    detected="$(slurmd -C 2>/dev/null | head -1 || true)"
    cpus="$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$detected")"
    mem="$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$detected")"
    [ -n "$cpus" ] || cpus="$(nproc)"
    [ -n "$mem" ] || mem="$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 ))"
    cat <<EOF
# Generated by cluster/slurm/setup_single_node.sh for host $host: a one-node test cluster.
# Edit the script, not this file (it is rewritten when the host changes).
ClusterName=$CLUSTER_NAME
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
DisableRootJobs=NO
ReturnToService=2
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$CTLD_SPOOL
SlurmdSpoolDir=$SLURMD_SPOOL
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
KillWait=10
MinJobAge=300
SchedulerType=sched/backfill
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

write_conf() {
    mkdir -p "$CONF_DIR" "$LOG_DIR" "$CTLD_SPOOL" "$SLURMD_SPOOL"
    local new
    new="$(render_conf)"
    if [ -f "$CONF" ] && [ "$(cat "$CONF")" = "$new" ]; then log "$CONF up to date"; return 1; fi
    [ -f "$CONF" ] && cp "$CONF" "$CONF.bak.$(date +%s)"
    printf '%s\n' "$new" > "$CONF"
    # task/none and proctrack/linuxproc need no cgroup.conf; an empty one silences warnings.
    [ -f "$CONF_DIR/cgroup.conf" ] || echo "# not used: see slurm.conf (proctrack/linuxproc, task/none)" > "$CONF_DIR/cgroup.conf"
    log "wrote $CONF"
    return 0
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_daemon() {  # $1 name, $2 pid file
    if uses_systemd; then systemctl stop "$1" 2>/dev/null || true; fi
    if pid_alive "$2"; then
        local pid; pid="$(cat "$2")"
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    fi
}

start_slurm() {  # $1: 1 when the config changed
    local changed="$1"
    if [ "$changed" = 1 ] || [ "${SLURM_FORCE_RESTART:-0}" = 1 ]; then
        stop_daemon slurmd /run/slurmd.pid
        stop_daemon slurmctld /run/slurmctld.pid
    fi
    if pid_alive /run/slurmctld.pid; then log "slurmctld running"; else
        log "starting slurmctld"
        slurmctld || die "slurmctld did not start; see $LOG_DIR/slurmctld.log"
    fi
    for _ in $(seq 1 20); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.5; done
    scontrol ping 2>/dev/null | grep -q UP || die "slurmctld does not answer (scontrol ping); see $LOG_DIR/slurmctld.log"
    if pid_alive /run/slurmd.pid; then log "slurmd running"; else
        log "starting slurmd"
        slurmd || die "slurmd did not start; see $LOG_DIR/slurmd.log"
    fi
}

node_state() { sinfo -h -N -o '%t' 2>/dev/null | head -1 | tr -d '*~#!%$@^-'; }

wait_idle() {
    local host state deadline=$((SECONDS + TIMEOUT))
    host="$(hostname -s)"
    while [ $SECONDS -lt $deadline ]; do
        state="$(node_state)"
        case "$state" in
            idle|mix|alloc|allocated|mixed|comp) log "node $host is $state"; return 0 ;;
            drain|drng|down|inval|fail|unk|"")
                # A node left down or drained (e.g. by an earlier crash) must be resumed explicitly.
                if [ "$state" = down ] || [ "$state" = drain ]; then
                    scontrol update nodename="$host" state=resume 2>/dev/null || true
                fi ;;
        esac
        sleep 1
    done
    sinfo -N -l >&2 || true
    die "node $host not idle after ${TIMEOUT}s (state '${state:-none}'); see $LOG_DIR/slurmd.log and $LOG_DIR/slurmctld.log"
}

install_packages
munge_key
start_munge
changed=0
write_conf && changed=1
start_slurm "$changed"
wait_idle
log "ready: partition $PARTITION on $(hostname -s); try: srun hostname"
