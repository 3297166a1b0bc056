#!/usr/bin/env bash
# Install a single-node SLURM 22.05 (Debian 12 packages) with accounting: munge, slurmctld,
# slurmd, client tools, slurmdbd and the MariaDB server/client it stores jobs in.
# Idempotent: does nothing when every daemon and tool is already on PATH. Needs root.
set -euo pipefail

need=(munged slurmctld slurmd slurmdbd sbatch sacct mariadbd mariadb-install-db mariadb)
missing=()
for exe in "${need[@]}"; do
    command -v "$exe" >/dev/null 2>&1 || [ -x "/usr/sbin/$exe" ] || missing+=("$exe")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "slurm-install: already installed (slurm $(dpkg-query -W -f='${Version}' slurmctld))"
    exit 0
fi
echo "slurm-install: missing ${missing[*]}; installing"
export DEBIAN_FRONTEND=noninteractive
# Package post-install scripts try to start services; without systemd/init they must not.
policy=/usr/sbin/policy-rc.d
own_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && own_policy=1
fi
trap '[ "$own_policy" = 1 ] && rm -f "$policy"' EXIT
apt-get update -qq
# --no-install-recommends: the recommends pull in a full MariaDB server stack, mail, docs.
apt-get install -y -qq --no-install-recommends \
    munge slurmctld slurmd slurm-client \
    slurmdbd slurm-wlm-mysql-plugin mariadb-server-core mariadb-client-core >/dev/null
echo "slurm-install: done (slurm $(dpkg-query -W -f='${Version}' slurmctld))"
