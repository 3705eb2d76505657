#!/usr/bin/env bash
# Stop the single-node Slurm cluster started by start.sh: cancels its jobs, then stops slurmd,
# slurmctld, slurmdbd, MariaDB and munged by the pids recorded in $SLURM_LOCAL_DIR (default
# /tmp/harness-slurm). Nothing is killed by name. A munged that start.sh did not start (one that
# was already answering) is left alone. Harmless when nothing runs.
#
#   SLURM_LOCAL_PURGE=1   also delete $SLURM_LOCAL_DIR (state, logs, accounting database)
set -euo pipefail

DIR="${SLURM_LOCAL_DIR:-/tmp/harness-slurm}"
CONF="$DIR/etc/slurm.conf"
RUN="$DIR/run"
export SLURM_CONF="$CONF"

say() { echo "stop.sh: $*"; }

# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

# stop_pid NAME PIDFILE COMM [SECONDS]: SIGTERM, wait, then SIGKILL.
stop_pid() {
    local name="$1" pidfile="$2" comm="$3" grace="${4:-15}" pid i
    if [ ! -s "$pidfile" ]; then
        return 0
    fi
    pid=$(tr -d '[:space:]' <"$pidfile")
    if ! pid_alive "$pid" "$comm"; then
        rm -f "$pidfile"
        return 0
    fi
    say "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < grace * 10; i++)); do
        pid_alive "$pid" "$comm" || break
        sleep 0.1
    done
    if pid_alive "$pid" "$comm"; then
        say "$name (pid $pid) ignored SIGTERM for ${grace}s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            pid_alive "$pid" "$comm" || break
            sleep 0.1
        done
    fi
    rm -f "$pidfile"
}

# 1. Cancel this cluster's jobs while slurmctld still answers, so no job survives the daemons.
if [ -s "$CONF" ] && [ -s "$RUN/slurmctld.pid" ] \
    && pidfile_alive "$RUN/slurmctld.pid" slurmctld; then
    mapfile -t jobs < <(timeout 10 squeue -h -o %A 2>/dev/null | sort -u || true)
    if [ "${#jobs[@]}" -gt 0 ]; then
        say "cancelling ${#jobs[@]} job(s): ${jobs[*]}"
        timeout 10 scancel "${jobs[@]}" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do
            [ -z "$(timeout 5 squeue -h -t R,CG -o %A 2>/dev/null || true)" ] && break
            sleep 0.2
        done
    fi
fi

# 2. Daemons, in reverse start order.
stop_pid slurmd "$RUN/slurmd.pid" slurmd
stop_pid slurmctld "$RUN/slurmctld.pid" slurmctld
stop_pid slurmdbd "$RUN/slurmdbd.pid" slurmdbd
if [ -s "$DIR/mysql/mysqld.pid" ]; then
    db_pid=$(tr -d '[:space:]' <"$DIR/mysql/mysqld.pid")
    db_comm=$(cat "/proc/$db_pid/comm" 2>/dev/null || echo mysqld)
    case "$db_comm" in mysqld | mariadbd) ;; *) db_comm=mysqld ;; esac
    stop_pid MariaDB "$DIR/mysql/mysqld.pid" "$db_comm" 60
fi
stop_pid munged "$DIR/munge/munged.pid" munged

# 3. Job step daemons of this cluster that outlived slurmd (they inherit slurmd's SLURM_CONF).
for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [ "$(cat "$p/comm" 2>/dev/null)" = slurmstepd ] || continue
    if tr '\0' '\n' <"$p/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$CONF"; then
        say "killing leftover slurmstepd (pid $pid)"
        kill -KILL "$pid" 2>/dev/null || true
    fi
done

if [ "${SLURM_LOCAL_PURGE:-0}" = 1 ]; then
    say "removing $DIR"
    rm -rf "$DIR"
fi
say "stopped"
