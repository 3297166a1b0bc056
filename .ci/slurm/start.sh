#!/usr/bin/env bash
# Start a single-node SLURM 22.05 cluster with accounting on this machine (root, no systemd):
# munged, a private MariaDB on 127.0.0.1, slurmdbd, slurmctld and slurmd, each started by
# hand and recorded by PID under $STATE for stop.sh. One partition "ci" with the node's real
# topology (from `slurmd -C`) and one fake GPU, so jobs that ask for --gpus=1 are scheduled
# and accounted as GPU jobs. Waits until the node is idle. On failure prints the daemon logs
# and stops whatever it started.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/env.sh"
t0=$(date +%s)

[ "$(id -u)" = 0 ] || { echo "slurm-start: needs root" >&2; exit 1; }
for f in slurm.conf slurmdbd.conf gres.conf; do
    if [ -e "$CONF_DIR/$f" ] && [ "$(head -n1 "$CONF_DIR/$f")" != "$MARKER" ]; then
        echo "slurm-start: $CONF_DIR/$f exists and was not written by this script; refusing" >&2
        exit 1
    fi
done
if [ -d "$STATE" ] && [ -n "$(ls -A "$STATE")" ] && [ ! -e "$STATE/.dpgen-slurm" ]; then
    echo "slurm-start: $STATE is not empty and not ours; refusing to wipe it" >&2
    exit 1
fi
"$HERE/stop.sh" >/dev/null  # a cluster left over from an earlier run
rm -rf "$STATE"
mkdir -p "$STATE"/{slurmctld,slurmd,mysql,munge} "$CONF_DIR"
touch "$STATE/.dpgen-slurm"

fail() {
    echo "slurm-start: $*" >&2
    for log in "$STATE"/*.log; do
        [ -e "$log" ] && { echo "---- $log" >&2; tail -n 25 "$log" >&2; }
    done
    [ -n "$(command -v sinfo)" ] && timeout 5 sinfo -R >&2 || true
    "$HERE/stop.sh" >&2
    exit 1
}
trap 'fail "failed at line $LINENO"' ERR

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: poll until COMMAND succeeds
    local limit=$1 what=$2; shift 2
    for _ in $(seq $((limit * 4))); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.25
    done
    fail "timed out after ${limit}s waiting for $what"
}

# ---- configuration ----------------------------------------------------------------------
HOST=$(hostname -s)
# "NodeName=vm CPUs=2 Boards=1 ... RealMemory=24105": the node exactly as slurmd sees it,
# so slurmd registers without draining it for a topology mismatch.
TOPOLOGY=$(slurmd -C | head -n1 | sed 's/^NodeName=[^ ]* //')
CPUS=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$TOPOLOGY")
cat >"$CONF_DIR/slurm.conf" <<CONF
$MARKER
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
# root runs everything: there is no slurm user on a CI machine
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$STATE/slurmctld
SlurmdSpoolDir=$STATE/slurmd
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
# no systemd and no delegated cgroups in a container: track processes by parent PID
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# without a per-CPU default a job with no --mem takes all the node's memory and jobs run
# one at a time
DefMemPerCPU=500
MailProg=/bin/true
ReturnToService=2
# finished jobs stay visible to squeue/scontrol for 5 min (the status fallback needs >= 3x
# the executor's status-check interval)
MinJobAge=300
KillWait=5
InactiveLimit=0
SlurmdTimeout=300
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStorageTRES=gres/gpu
# the executor names each job by rule in --comment; keep it for sacct
AccountingStoreFlags=job_comment
JobCompType=jobcomp/none
GresTypes=gpu
NodeName=$HOST NodeAddr=127.0.0.1 $TOPOLOGY Gres=gpu:1 State=UNKNOWN
PartitionName=$PARTITION Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONF
# A fake GPU must be file-backed: a count-only gres line is dropped and the node drains.
cat >"$CONF_DIR/gres.conf" <<CONF
$MARKER
AutoDetect=off
NodeName=$HOST Name=gpu File=/dev/null
CONF
cat >"$CONF_DIR/slurmdbd.conf" <<CONF
$MARKER
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
PidFile=$STATE/slurmdbd.pid
LogFile=$STATE/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
CONF
chmod 600 "$CONF_DIR/slurmdbd.conf"  # slurmdbd refuses a readable password file

# ---- munge --------------------------------------------------------------------------------
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge "$STATE/munge"
[ -s /etc/munge/munge.key ] || runuser -u munge -- mungekey --create >/dev/null
runuser -u munge -- /usr/sbin/munged --pid-file="$STATE/munge/munged.pid" \
    --log-file="$STATE/munge/munged.log" </dev/null >/dev/null 2>&1
wait_for 10 munged sh -c 'munge -n | unmunge'
ln -sf "$STATE/munge/munged.pid" "$STATE/munged.pid"
ln -sf "$STATE/munge/munged.log" "$STATE/munged.log"

# ---- MariaDB (private instance: own datadir, socket and port) ---------------------------
SOCK="$STATE/mysql.sock"
mariadb-install-db --no-defaults --datadir="$STATE/mysql" --user=root \
    --auth-root-authentication-method=normal --skip-test-db >"$STATE/mariadb-install.log" 2>&1
setsid mariadbd --no-defaults --datadir="$STATE/mysql" --socket="$SOCK" \
    --pid-file="$STATE/mariadbd.pid" --port="$DB_PORT" --bind-address=127.0.0.1 --user=root \
    --skip-name-resolve --innodb-buffer-pool-size=32M --performance-schema=OFF \
    --log-error="$STATE/mariadbd.log" </dev/null >/dev/null 2>&1 &
wait_for 30 MariaDB mariadb --no-defaults --socket="$SOCK" -uroot -e 'SELECT 1'
mariadb --no-defaults --socket="$SOCK" -uroot <<SQL
CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
SQL

# ---- SLURM daemons (each daemonises itself and writes its PID file) ------------------------
slurmdbd </dev/null >/dev/null 2>&1
wait_for 30 slurmdbd sacctmgr -n list cluster
sacctmgr -i add cluster "$CLUSTER" >/dev/null
slurmctld </dev/null >/dev/null 2>&1
wait_for 30 slurmctld scontrol ping
slurmd </dev/null >/dev/null 2>&1
node_idle() { [ "$(sinfo -h -N -n "$HOST" -o %T)" = idle ]; }
wait_for 60 "node $HOST to become idle (state: $(sinfo -h -N -o %T 2>&1))" node_idle
trap - ERR
echo "slurm-start: cluster $CLUSTER up in $(( $(date +%s) - t0 )) s:" \
    "node $HOST ($CPUS CPUs, gres gpu:1), partition $PARTITION, state under $STATE"
