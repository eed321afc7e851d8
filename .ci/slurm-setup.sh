#!/usr/bin/env bash
# Start a real SLURM "cluster" with fake H200 GPUs on this host, for CI: one node in the default
# partition, and (for the jobs over several nodes) three more slurmd on the same host, each a node
# of its own (`slurmd -N NAME`, its own port), joined with the first in a second partition.
#
# * Installs Debian's slurmctld slurmd slurm-client munge (22.05) if missing.
# * Writes /etc/slurm/{slurm,gres,cgroup}.conf for one node (this host,
#   address 127.0.0.1) with $PROCEXEC_SLURM_GPUS fake GPUs of type
#   $PROCEXEC_SLURM_GPU_TYPE (character devices /dev/fakegpuN, major 195 like
#   /dev/nvidiaN, so SLURM sets CUDA_VISIBLE_DEVICES per job) in partition
#   $PROCEXEC_SLURM_PARTITION (the default partition).
# * Starts munged (as user munge), slurmctld and slurmd directly (no systemd)
#   and waits until `sinfo` reports the node idle.
#
# Idempotent: if the daemons already run with the same configuration it only
# re-checks the node; if the configuration changed it restarts them.
# Needs root. Daemons keep running in the background after the script exits
# (they are daemonised; they do not hold CI's stdout/stderr open).
#
# Environment knobs (all optional):
#   PROCEXEC_SLURM_PARTITION  partition name            (default: gpu)
#   PROCEXEC_SLURM_GPU_TYPE   gres type of the fake GPUs (default: h200)
#   PROCEXEC_SLURM_GPUS       number of fake GPUs        (default: 8)
#   PROCEXEC_SLURM_CPUS       CPUs advertised by the node (default: nproc, at
#                             least 4 so the test's jobs run in one wave;
#                             SlurmdParameters=config_overrides keeps the node
#                             from draining when that exceeds the real cores)
#   PROCEXEC_SLURM_STATE      state/log directory        (default: /var/lib/procexec-slurm)
#   PROCEXEC_SLURM_EXTRA_NODES  nodes besides this host's, in partition
#                             $PROCEXEC_SLURM_MULTINODE_PARTITION only (default: 3, partition multinode)
set -euo pipefail

t0=$(date +%s.%N)
elapsed() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}'; }
log() { echo "[slurm-setup +$(elapsed)s] $*"; }

PARTITION=${PROCEXEC_SLURM_PARTITION:-gpu}
GPU_TYPE=${PROCEXEC_SLURM_GPU_TYPE:-h200}
NGPUS=${PROCEXEC_SLURM_GPUS:-8}
CPUS=${PROCEXEC_SLURM_CPUS:-$(( $(nproc) > 4 ? $(nproc) : 4 ))}
STATE=${PROCEXEC_SLURM_STATE:-/var/lib/procexec-slurm}
EXTRA=${PROCEXEC_SLURM_EXTRA_NODES:-3}
MULTINODE=${PROCEXEC_SLURM_MULTINODE_PARTITION:-multinode}

if [ "$(id -u)" -ne 0 ]; then
    echo "slurm-setup.sh: must run as root" >&2
    exit 1
fi

# ---------------------------------------------------------------- packages
need=()
for bin in /usr/sbin/slurmctld /usr/sbin/slurmd /usr/bin/sbatch /usr/sbin/munged; do
    [ -x "$bin" ] || need+=("$bin")
done
if [ ${#need[@]} -gt 0 ]; then
    log "installing slurmctld slurmd slurm-client munge (missing: ${need[*]})"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
    log "packages installed"
else
    log "packages already installed"
fi

# ---------------------------------------------------------------- config
NODE=$(hostname -s)
# RealMemory: what the machine has, minus 1 GiB for the OS, in MiB.
MEM_MB=$(awk '/^MemTotal:/ {printf "%d", $2/1024}' /proc/meminfo)
MEM_MB=$(( MEM_MB > 2048 ? MEM_MB - 1024 : MEM_MB ))

# This host's node, then the extra ones: NAME:PORT each (the first keeps slurmd's default port).
NODES=("${NODE}:6818")
for ((i = 1; i <= EXTRA; i++)); do NODES+=("${NODE}-x${i}:$((6830 + i))"); done
EXTRA_LINES=""
ALL_NODES="${NODE}"
for ((i = 1; i <= EXTRA; i++)); do
    EXTRA_LINES+="NodeName=${NODE}-x${i} NodeHostname=${NODE} NodeAddr=127.0.0.1 Port=$((6830 + i)) CPUs=${CPUS} RealMemory=${MEM_MB} Gres=gpu:${GPU_TYPE}:${NGPUS} State=UNKNOWN"$'\n'
    ALL_NODES+=",${NODE}-x${i}"
done

mkdir -p /etc/slurm "$STATE/ctld" "$STATE/log" /run/munge /var/log/munge /var/lib/munge /etc/munge
for entry in "${NODES[@]}"; do mkdir -p "$STATE/d/${entry%%:*}"; done

for ((i = 0; i < NGPUS; i++)); do
    [ -c "/dev/fakegpu$i" ] || mknod "/dev/fakegpu$i" c 195 "$i"
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/slurm.conf" <<EOF
# Written by .ci/slurm-setup.sh: single-node CI cluster with fake GPUs.
ClusterName=procexec-ci
SlurmctldHost=${NODE}(127.0.0.1)
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=${STATE}/ctld
SlurmdSpoolDir=${STATE}/d/%n
SlurmctldPidFile=${STATE}/slurmctld.pid
SlurmdPidFile=${STATE}/slurmd.%n.pid
SlurmctldLogFile=${STATE}/log/slurmctld.log
SlurmdLogFile=${STATE}/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
# Trust the CPU count below even if the host has fewer cores (no drain).
SlurmdParameters=config_overrides
ReturnToService=2
# Keep finished jobs visible to squeue for 10 min: the Snakemake slurm plugin
# uses squeue for status only if MinJobAge >= 3 x its first status interval,
# else it falls back to sacct, which hangs without slurmdbd.
MinJobAge=600
SchedulerParameters=sched_interval=2
MessageTimeout=30
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
Waittime=0
NodeName=${NODE} NodeAddr=127.0.0.1 CPUs=${CPUS} RealMemory=${MEM_MB} Gres=gpu:${GPU_TYPE}:${NGPUS} State=UNKNOWN
${EXTRA_LINES}PartitionName=${PARTITION} Nodes=${NODE} Default=YES MaxTime=INFINITE State=UP
PartitionName=${MULTINODE} Nodes=${ALL_NODES} Default=NO MaxTime=INFINITE State=UP
EOF
cat >"$tmp/gres.conf" <<EOF
# Written by .ci/slurm-setup.sh: fake GPUs (char devices, major 195 like /dev/nvidiaN).
NodeName=${ALL_NODES} Name=gpu Type=${GPU_TYPE} File=/dev/fakegpu[0-$((NGPUS - 1))]
EOF
cat >"$tmp/cgroup.conf" <<EOF
# Written by .ci/slurm-setup.sh: no cgroup enforcement inside CI containers
# (task/none + proctrack/linuxproc; 22.05 has no CgroupPlugin=disabled).
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
EOF

changed=0
for f in slurm.conf gres.conf cgroup.conf; do
    if ! cmp -s "$tmp/$f" "/etc/slurm/$f"; then
        cp "$tmp/$f" "/etc/slurm/$f"
        changed=1
    fi
done

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
stop_daemon() {  # pidfile
    if running "$1"; then
        local pid; pid=$(cat "$1")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$1"
}
if [ "$changed" = 1 ]; then
    log "configuration written to /etc/slurm (node ${NODE} + ${EXTRA} more, ${CPUS} CPUs, ${MEM_MB} MiB, gpu:${GPU_TYPE}:${NGPUS}, partitions ${PARTITION}, ${MULTINODE})"
    stop_daemon "$STATE/slurmd.pid"  # written by an earlier version of this script
    for entry in "${NODES[@]}"; do stop_daemon "$STATE/slurmd.${entry%%:*}.pid"; done
    stop_daemon "$STATE/slurmctld.pid"
else
    log "configuration unchanged"
fi

# ---------------------------------------------------------------- munge
if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge
chmod 0700 /etc/munge
chmod 0400 /etc/munge/munge.key
chmod 0755 /run/munge
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "starting munged"
    rm -f /run/munge/munged.pid
    runuser -u munge -- /usr/sbin/munged --force </dev/null >>"$STATE/log/munged.stdout" 2>&1
    for _ in $(seq 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi
munge -n </dev/null | unmunge >/dev/null
log "munge ok"

# ---------------------------------------------------------------- daemons
if ! running "$STATE/slurmctld.pid"; then
    log "starting slurmctld"
    # -c: clear saved state (stale jobs/nodes of an earlier CI run)
    /usr/sbin/slurmctld -c </dev/null >>"$STATE/log/slurmctld.stdout" 2>&1
fi
for _ in $(seq 100); do scontrol ping >/dev/null 2>&1 && break; sleep 0.2; done
scontrol ping | grep -q UP || { echo "slurmctld did not come up" >&2; tail -30 "$STATE/log/slurmctld.log" >&2; exit 1; }
for entry in "${NODES[@]}"; do
    name=${entry%%:*}
    if ! running "$STATE/slurmd.${name}.pid"; then
        log "starting slurmd for node ${name}"
        /usr/sbin/slurmd -N "$name" </dev/null >>"$STATE/log/slurmd.stdout" 2>&1
    fi
done

# ---------------------------------------------------------------- wait idle
state=""
for i in $(seq 150); do
    state=$(sinfo -h -N -n "$NODE" -o '%T' 2>/dev/null | head -1)
    case "$state" in
        idle|mixed|allocated) break ;;
        down*|drain*|fail*)
            # e.g. left down by an earlier run: bring it back once it registered
            if [ $((i % 10)) = 0 ]; then scontrol update nodename="$NODE" state=resume 2>/dev/null || true; fi ;;
    esac
    sleep 0.2
done
case "$state" in
    idle|mixed|allocated) ;;
    *)
        echo "slurm-setup.sh: node ${NODE} not ready (state '${state}')" >&2
        sinfo -N -l >&2 || true
        tail -30 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" >&2 || true
        exit 1 ;;
esac
sinfo -N -o '%N %P %T %c %m %G'
log "SLURM ready: node ${NODE} ${state}, partition ${PARTITION}, gres gpu:${GPU_TYPE}:${NGPUS} (total $(elapsed)s)"
