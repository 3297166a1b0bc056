#!/usr/bin/env bash
# Stop the CI SLURM cluster that start.sh brought up: cancel its jobs, then stop every daemon
# by the PID it recorded (TERM, then KILL after 15 s). Safe to run whatever happened, twice,
# or when nothing was started.
set -uo pipefail
. "$(dirname "$0")/env.sh"

pid_of() {  # the recorded PID of a daemon, if it is still alive
    local f="$STATE/$1.pid" pid
    [ -s "$f" ] || return 1
    pid=$(tr -dc 0-9 <"$f")
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

if pid_of slurmctld >/dev/null; then
    # cancelled jobs end their slurmstepd processes themselves, while slurmd still runs
    jobs=$(timeout 5 squeue -h -o %i 2>/dev/null)
    [ -n "$jobs" ] && timeout 10 scancel $jobs >/dev/null 2>&1
    for _ in $(seq 20); do
        [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
        sleep 0.5
    done
fi
for d in "${DAEMONS[@]}"; do
    pid=$(pid_of "$d") || continue
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then
        echo "slurm-stop: $d ($pid) ignored SIGTERM; killing" >&2
        kill -KILL "$pid" 2>/dev/null
    fi
    echo "slurm-stop: stopped $d ($pid)"
    rm -f "$STATE/$d.pid"
done
exit 0
