#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, from Debian's slurm-wlm and munge, for trying
# `tinit sweep --executor slurm` (and for the tests). Needs root (slurmd runs jobs as their
# user) and the packages: apt-get install -y slurm-wlm munge.
#
#   scripts/slurm-local-cluster.sh start [DIR]   # prints: export SLURM_CONF=DIR/slurm.conf
#   scripts/slurm-local-cluster.sh stop  [DIR]
#   scripts/slurm-local-cluster.sh status [DIR]
#
# Everything (munge key and socket, slurm.conf, state, spool, logs, pid files) lives under
# DIR (default $TINIT_SLURM_DIR or /tmp/tinit-slurm); nothing in /etc is touched. The ports
# are $TINIT_SLURM_PORT and the next one (default 16817-16818), away from a real SLURM's.
# Client commands (sbatch, squeue, ...) find this cluster through SLURM_CONF.
set -euo pipefail

cmd=${1:-}
DIR=$(realpath -m "${2:-${TINIT_SLURM_DIR:-/tmp/tinit-slurm}}")
PORT=${TINIT_SLURM_PORT:-16817}
CONF=$DIR/slurm.conf

die() { echo "slurm-local-cluster: $*" >&2; exit 1; }

stop_pids() {  # stop_pids PIDFILE...: the daemons whose pids are in the files, together (each takes ~2 s)
    local pids=() f pid
    for f in "$@"; do
        [[ -f $f ]] || continue
        pid=$(cat "$f")
        if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            pids+=("$pid")
        fi
        rm -f "$f"
    done
    for _ in $(seq 100); do
        local alive=0
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [[ $alive == 0 ]] && return 0
        sleep 0.05
    done
    for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
}

start() {
    [[ $(id -u) == 0 ]] || die "must run as root (slurmd starts jobs as their user)"
    for b in munged slurmctld slurmd sbatch sinfo scontrol; do
        command -v "$b" >/dev/null || die "$b not found: apt-get install -y slurm-wlm munge"
    done
    [[ -f $DIR/slurmctld.pid ]] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null \
        && die "already running in $DIR (stop it first)"
    mkdir -p "$DIR"/{munge,state,spool,log}
    chmod 700 "$DIR/munge"
    # munge: a fresh key, its own socket
    [[ -f $DIR/munge/munge.key ]] || {
        dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
        chmod 400 "$DIR/munge/munge.key"
    }
    munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
        --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/log/munged.log" \
        --seed-file="$DIR/munge/munged.seed"
    local cpus mem
    cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc obeys OMP_NUM_THREADS
    mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
    cat > "$CONF" <<CONF
# written by scripts/slurm-local-cluster.sh: a one-node cluster for tests and laptops
ClusterName=tinit-local
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
# start a submitted job at the controller's next pass (~1 s apart), not after batch_sched_delay's
# default 3 s: the delay batches submissions on a busy cluster; here it only made every sweep wait
SchedulerParameters=batch_sched_delay=0
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=600
KillWait=2
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
    export SLURM_CONF=$CONF
    slurmctld -f "$CONF"
    slurmd -f "$CONF" -N localhost
    # wait (up to 30 s) for the node to be idle
    for _ in $(seq 300); do
        state=$(sinfo -h -N -o %T 2>/dev/null || true)
        [[ $state == idle* || $state == mixed* || $state == allocated* ]] && {
            echo "export SLURM_CONF=$CONF"
            return 0
        }
        [[ $state == down* || $state == drain* ]] && scontrol update nodename=localhost state=resume 2>/dev/null
        sleep 0.1
    done
    die "the node did not come up; see $DIR/log/"
}

stop() {
    stop_pids "$DIR/slurmd.pid" "$DIR/slurmctld.pid" "$DIR/munge/munged.pid"
}

case $cmd in
    start) start ;;
    stop) stop ;;
    status) SLURM_CONF=$CONF sinfo ;;
    *) die "usage: $0 start|stop|status [DIR]" ;;
esac
