#!/usr/bin/env bash
# Start a real single-node SLURM cluster on this machine from Debian's packages: munged,
# slurmctld and slurmd on localhost, started by hand (no systemd here). Idempotent: a
# cluster this script already started is reused.
#
#   bash scripts/start_slurm.sh            # installs the packages when missing, starts it
#   bash scripts/start_slurm.sh --stop     # stops the daemons it started
#
# The configuration goes where SLURM's tools look without being told, /etc/slurm (the
# executor plugin clears SLURM_* variables, SLURM_CONF too, before its job steps); the
# daemons' state and logs go to .gridbench/slurm. A slurm.conf this script did not write
# is never replaced.
#
# The node is this machine's CPUs. It declares GRIDBENCH_SLURM_GPUS (default 2) GPUs
# backed by placeholder device files, so that `--gpus=1` (or `--gres=gpu:1`) is scheduled,
# counted and exported to the job's steps (SLURM_STEP_GPUS, CUDA_VISIBLE_DEVICES) as on a
# GPU node; nothing uses them as GPUs (the CPU test engine has gpus: false).
set -euo pipefail
cd "$(dirname "$0")/.."
STATE="${GRIDBENCH_SLURM_DIR:-$PWD/.gridbench/slurm}"
GPUS="${GRIDBENCH_SLURM_GPUS:-2}"
CONF=/etc/slurm/slurm.conf
MARK="# Written by gridbench's scripts/start_slurm.sh"
NODE="$(hostname -s)"

stop() {
    # The daemons of a cluster this script started, from this checkout or from another one
    # whose state folder (and pid files) may be gone: they read the config it wrote, so
    # while that config is ours they are ours, found by name. Left running, they kept the
    # ports, the new daemons could not start, and jobs failed writing to the lost folder.
    if [ -e "$CONF" ] && grep -qF "$MARK" "$CONF"; then
        for daemon in slurmd slurmctld; do
            pkill -x "$daemon" || true
            for _ in $(seq 1 50); do pgrep -x "$daemon" >/dev/null || break; sleep 0.1; done
        done
    fi
    pid="$(cat /run/munge/munged.pid 2>/dev/null || true)"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
}
# grep -c reads all of sinfo's output: with pipefail, grep -q's early exit can fail the pipe
node_up() { sinfo -h -o %T 2>/dev/null | grep -Ec '^(idle|mixed|allocated)' >/dev/null; }
if [ "${1:-}" = "--stop" ]; then stop; exit 0; fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
    || ! command -v sbatch >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi

if [ -e "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
    echo "$CONF exists and was not written by this script: not touching a real cluster's config" >&2
    exit 1
fi
if [ -e "$CONF" ] && grep -qF "StateSaveLocation=$STATE/" "$CONF" \
    && node_up; then
    echo "SLURM already running ($CONF)"
    exit 0
fi
stop  # a half-started or stale cluster of ours

mkdir -p "$STATE/spool" "$STATE/state" "$STATE/dev" /etc/slurm /run/munge /var/log/munge /var/lib/munge
# munge: one key shared by controller and node (the same host here)
[ -s /etc/munge/munge.key ] || mungekey --create --keyfile /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    munged --force 2>>"$STATE/munged.err"  # as root: the throwaway cluster's daemons all run as root
    for _ in $(seq 1 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi

# placeholder GPU devices (character devices like /dev/null): slurmd hands them out by index
gres_files=""
for i in $(seq 0 $((GPUS - 1))); do
    [ -c "$STATE/dev/gpu$i" ] || { rm -f "$STATE/dev/gpu$i"; mknod "$STATE/dev/gpu$i" c 1 3; }
done
[ "$GPUS" -gt 0 ] && gres_files="$STATE/dev/gpu[0-$((GPUS - 1))]"

CPUS="$(nproc)"
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
cat > "$CONF" <<EOF
$MARK: a single-node test cluster on $NODE.
ClusterName=gridbench
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
# no cgroups in this container: track job processes by parentage, bind nothing
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# keep finished jobs visible to squeue for the executor plugin's status checks
MinJobAge=600
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=60
MpiDefault=none
GresTypes=gpu
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB $( [ "$GPUS" -gt 0 ] && echo "Gres=gpu:$GPUS" ) State=UNKNOWN
PartitionName=main Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
if [ "$GPUS" -gt 0 ]; then
    echo "NodeName=$NODE Name=gpu File=$gres_files" > /etc/slurm/gres.conf
else
    : > /etc/slurm/gres.conf
fi

slurmctld
slurmd
for _ in $(seq 1 120); do
    node_up && break
    sleep 0.5
done
if ! node_up; then
    echo "SLURM did not come up; logs:" >&2
    tail -n 30 "$STATE/slurmctld.log" "$STATE/slurmd.log" >&2 || true
    exit 1
fi
sinfo
echo "SLURM is running ($CONF)"
