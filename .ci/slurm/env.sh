# Shared settings of the CI SLURM cluster (sourced by start.sh and stop.sh).
# State (daemon logs, PID files, spool, the private MariaDB) lives under one folder that
# start.sh wipes, so every start is a fresh cluster with job ids from 1.
STATE=${DPGEN_SLURM_STATE:-/tmp/dpgen-slurm}
# slurm.conf must be where the client tools and the jobs' nested srun look for it.
CONF_DIR=/etc/slurm
# start.sh only overwrites configs that carry this first line (never a real cluster's).
MARKER="# written by dpgen-pipeline .ci/slurm/start.sh"
CLUSTER=dpgen
PARTITION=ci
DB_PORT=${DPGEN_SLURM_DB_PORT:-13306}
DB_PASS=slurm-ci-only
# Daemons in stop order; each one's PID file is $STATE/<name>.pid.
DAEMONS=(slurmd slurmctld slurmdbd mariadbd munged)
