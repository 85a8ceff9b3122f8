#!/usr/bin/env bash
# Start a real single-node SLURM on this machine (Debian slurm-wlm + munge, no systemd needed).
#
#   bash scripts/setup_slurm.sh            # install if missing, configure, start, wait until the node is idle
#   bash scripts/setup_slurm.sh --stop     # stop the daemons this script started
#
# Idempotent: if `sinfo` already answers, nothing is restarted. Must run as root (it writes /etc/slurm and
# starts daemons). No accounting daemon (slurmdbd) is configured, so `sacct` is unavailable: orch jobs report
# their own state to the store, reconciled with squeue/scontrol.
#
# Environment knobs:
#   ORCH_SLURM_CPUS            CPUs the node declares (default: nproc; may exceed the real count to let more
#                              small jobs run side by side)
#   ORCH_SLURM_MAX_ARRAY_SIZE  MaxArraySize (default 1001, SLURM's own default)
#   ORCH_SLURM_PARTITION       partition name (default: debug)
set -euo pipefail

HOST="$(hostname -s)"
CONF_DIR=/etc/slurm
CONF="$CONF_DIR/slurm.conf"
SPOOL=/var/spool/slurm
LOG_DIR=/var/log/slurm
CPUS="${ORCH_SLURM_CPUS:-$(nproc)}"
MAX_ARRAY="${ORCH_SLURM_MAX_ARRAY_SIZE:-1001}"
PARTITION="${ORCH_SLURM_PARTITION:-debug}"

log() { echo "setup_slurm: $*" >&2; }

stop_daemons() {
    local name pid
    for name in slurmd slurmctld; do
        pid="$(cat "/run/$name.pid" 2>/dev/null || true)"
        [[ -n "$pid" ]] && kill "$pid" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        rm -f "/run/$name.pid"
    done
    log "stopped slurmd and slurmctld (munged left running)"
}

if [[ "${1:-}" == "--stop" ]]; then
    stop_daemons
    exit 0
fi

if [[ "$(id -u)" != "0" ]]; then
    log "must run as root"; exit 1
fi

node_ready() {
    local state
    state="$(sinfo -h -n "$HOST" -o '%t' 2>/dev/null || true)"
    [[ "$state" == idle* || "$state" == mix* || "$state" == alloc* ]] && [[ "$state" != *"*" ]]
}

if command -v sinfo >/dev/null && node_ready; then
    log "SLURM already answers and node $HOST is up; nothing to do"; sinfo >&2; exit 0
fi

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    log "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q slurm-wlm munge
fi

# --- munge: one key, daemon running as the munge user ------------------------------------------------------
if [[ ! -s /etc/munge/munge.key ]]; then
    mungekey --create --force 2>/dev/null || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
fi
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi
munge -n | unmunge >/dev/null || { log "munged is not answering"; exit 1; }

# --- slurm.conf -----------------------------------------------------------------------------------------------
MEM_MB="$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)"
mkdir -p "$CONF_DIR" "$SPOOL/ctld" "$SPOOL/d" "$LOG_DIR"
cat > "$CONF" <<EOF
# Written by orch scripts/setup_slurm.sh: a single-node cluster for development and CI.
ClusterName=orch
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=${ORCH_SLURM_CRED_EXPIRE:-10}
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
MaxArraySize=$MAX_ARRAY
MinJobAge=600
KillWait=30
SchedulerParameters=defer_batch,sched_interval=2,batch_sched_delay=1
StateSaveLocation=$SPOOL/ctld
SlurmdSpoolDir=$SPOOL/d
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=60
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=$PARTITION Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
log "wrote $CONF (node $HOST, $CPUS CPUs, ${MEM_MB} MB, MaxArraySize=$MAX_ARRAY)"

# --- daemons --------------------------------------------------------------------------------------------------
pgrep -x slurmctld >/dev/null || /usr/sbin/slurmctld
pgrep -x slurmd >/dev/null || /usr/sbin/slurmd

for _ in $(seq 60); do
    if node_ready; then
        log "node $HOST is up"; sinfo >&2; exit 0
    fi
    state="$(sinfo -h -n "$HOST" -o '%t' 2>/dev/null || true)"
    if [[ "$state" == down* || "$state" == drain* ]]; then
        scontrol update NodeName="$HOST" State=RESUME 2>/dev/null || true
    fi
    sleep 1
done
log "SLURM did not become ready; see $LOG_DIR/slurmctld.log and $LOG_DIR/slurmd.log"
exit 1
