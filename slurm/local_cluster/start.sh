#!/usr/bin/env bash
# Start a single-node Slurm cluster (with accounting) on localhost, from nothing, without systemd.
#
#   munged (as user munge)  ->  private MariaDB on 127.0.0.1  ->  slurmdbd  ->  slurmctld  ->  slurmd
#
# All configuration, state, logs and pid files live in $SLURM_LOCAL_DIR (default
# /tmp/harness-slurm). Idempotent: daemons that are already alive are left alone, so running it
# again while the cluster is up only re-checks it. Prints the environment exports needed to use
# the cluster and writes them to $SLURM_LOCAL_DIR/env.sh. Stop with stop.sh.
#
# Optional environment:
#   SLURM_LOCAL_DIR            state folder                         (/tmp/harness-slurm)
#   SLURM_LOCAL_CLUSTER        ClusterName                          (harness)
#   SLURM_LOCAL_PARTITION      default partition name               (debug)
#   SLURM_LOCAL_PORT_BASE      slurmctld port; slurmd +1, slurmdbd +2, MariaDB +3   (16817)
#   SLURM_LOCAL_START_TIMEOUT  seconds to wait for each daemon      (60)
set -euo pipefail

DIR="${SLURM_LOCAL_DIR:-/tmp/harness-slurm}"
CLUSTER="${SLURM_LOCAL_CLUSTER:-harness}"
PARTITION="${SLURM_LOCAL_PARTITION:-debug}"
PORT_BASE="${SLURM_LOCAL_PORT_BASE:-16817}"
TIMEOUT="${SLURM_LOCAL_START_TIMEOUT:-60}"
CTLD_PORT=$((PORT_BASE))
SLURMD_PORT=$((PORT_BASE + 1))
DBD_PORT=$((PORT_BASE + 2))
DB_PORT=$((PORT_BASE + 3))

ETC="$DIR/etc"
LOG="$DIR/log"
RUN="$DIR/run"
CONF="$ETC/slurm.conf"
DBD_CONF="$ETC/slurmdbd.conf"
MUNGE_DIR="$DIR/munge"
DB_DIR="$DIR/mysql"
DB_SOCK="$DB_DIR/mysqld.sock"
MUNGE_SOCKET=/run/munge/munge.socket.2

export SLURM_CONF="$CONF"
T0=$(date +%s.%N)

elapsed() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}'; }
say() { echo "start.sh [+$(elapsed)s]: $*"; }

die() {
    echo "start.sh: ERROR: $*" >&2
    for f in "$LOG"/*.log "$MUNGE_DIR"/munged.log "$DB_DIR"/mysqld.err; do
        [ -s "$f" ] || continue
        echo "----- tail of $f -----" >&2
        tail -n 25 "$f" >&2
    done
    exit 1
}

# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

wait_for() {  # description, command...
    local what="$1" deadline=$(($(date +%s) + TIMEOUT))
    shift
    until "$@" >/dev/null 2>&1; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            die "timed out after ${TIMEOUT}s waiting for $what"
        fi
        sleep 0.2
    done
}

# Something already accepts connections on 127.0.0.1:PORT (another cluster, a system daemon)?
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
check_port() {  # port, daemon
    if port_in_use "$1"; then
        die "127.0.0.1:$1 (for $2) is already in use; another cluster running? Stop it, or set \
SLURM_LOCAL_PORT_BASE (now $PORT_BASE)"
    fi
}

[ "$(id -u)" -eq 0 ] || die "must run as root (daemons run as root, munged as user munge)"
for bin in munged munge unmunge mysql_install_db mysqld mysql slurmdbd slurmctld slurmd sinfo \
    sacct sacctmgr scontrol; do
    command -v "$bin" >/dev/null || die "$bin not found; run slurm/local_cluster/install.sh first"
done

mkdir -p "$DIR" "$ETC" "$LOG" "$RUN" "$DIR/state/ctld" "$DIR/state/slurmd"
chmod 755 "$DIR" "$ETC" "$LOG" "$RUN"

ctld_alive() { pidfile_alive "$RUN/slurmctld.pid" slurmctld; }
slurmd_alive() { pidfile_alive "$RUN/slurmd.pid" slurmd; }
dbd_alive() { pidfile_alive "$RUN/slurmdbd.pid" slurmdbd; }
db_alive() { pidfile_alive "$DB_DIR/mysqld.pid" mariadbd || pidfile_alive "$DB_DIR/mysqld.pid" mysqld; }

# ---------------------------------------------------------------------------------------------
# munge
munge_works() { munge -n -S "$MUNGE_SOCKET" | unmunge -S "$MUNGE_SOCKET"; }
if munge_works >/dev/null 2>&1; then
    say "munged already answering on $MUNGE_SOCKET"
else
    if [ ! -s /etc/munge/munge.key ]; then
        say "creating /etc/munge/munge.key"
        mkdir -p /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    fi
    chown munge:munge /etc/munge /etc/munge/munge.key
    chmod 700 /etc/munge
    chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge "$MUNGE_DIR"
    chown munge:munge /run/munge "$MUNGE_DIR"
    chmod 755 /run/munge
    chmod 700 "$MUNGE_DIR"
    say "starting munged"
    # --force: take over a stale socket left behind by a killed munged.
    runuser -u munge -- munged --force --socket="$MUNGE_SOCKET" \
        --pid-file="$MUNGE_DIR/munged.pid" --log-file="$MUNGE_DIR/munged.log" \
        --seed-file="$MUNGE_DIR/munged.seed" || die "munged failed to start"
    wait_for "munged" munge_works
fi

# ---------------------------------------------------------------------------------------------
# private MariaDB on 127.0.0.1:$DB_PORT
DB_PASS_FILE="$ETC/db_password"
if [ ! -s "$DB_PASS_FILE" ]; then
    (umask 077 && head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$DB_PASS_FILE")
fi
DB_PASS=$(cat "$DB_PASS_FILE")
sql() { mysql --no-defaults --socket="$DB_SOCK" -u root "$@"; }

if db_alive; then
    say "MariaDB already running (pid $(cat "$DB_DIR/mysqld.pid"))"
else
    mkdir -p "$DB_DIR"
    chown mysql:mysql "$DB_DIR"
    chmod 750 "$DB_DIR"
    if [ ! -d "$DB_DIR/data/mysql" ]; then
        say "initialising MariaDB data folder $DB_DIR/data"
        rm -rf "$DB_DIR/data"
        mysql_install_db --no-defaults --user=mysql --datadir="$DB_DIR/data" \
            --auth-root-authentication-method=socket --skip-test-db \
            >"$DB_DIR/install_db.log" 2>&1 || die "mysql_install_db failed (see $DB_DIR/install_db.log)"
    fi
    check_port "$DB_PORT" MariaDB
    rm -f "$DB_SOCK" "$DB_DIR/mysqld.pid"
    say "starting MariaDB on 127.0.0.1:$DB_PORT"
    # Run the server directly (no mysqld_safe) in its own session, detached from this shell.
    setsid mysqld --no-defaults --user=mysql --datadir="$DB_DIR/data" \
        --socket="$DB_SOCK" --port="$DB_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
        --pid-file="$DB_DIR/mysqld.pid" --log-error="$DB_DIR/mysqld.err" \
        --innodb-buffer-pool-size=256M --innodb-log-file-size=64M \
        --innodb-lock-wait-timeout=900 --max-connections=100 \
        </dev/null >>"$DB_DIR/mysqld.out" 2>&1 &
    wait_for "MariaDB" sql -e "SELECT 1"
fi
sql <<SQL || die "could not create the accounting database/user"
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
SQL

# ---------------------------------------------------------------------------------------------
# configuration (rewritten only while no Slurm daemon runs, so a running cluster is never
# handed a configuration it was not started with)
write_config() {
    local cpus sockets cores threads avail_mb real_mb hw
    hw=$(slurmd -C 2>/dev/null | head -n 1)
    field() { sed -n "s/.*[[:space:]]$1=\([0-9]*\).*/\1/p" <<<"$hw"; }
    cpus=$(field CPUs)
    sockets=$(field SocketsPerBoard)
    cores=$(field CoresPerSocket)
    threads=$(field ThreadsPerCore)
    [ -n "$cpus" ] || cpus=$(nproc)
    local topo="CPUs=$cpus"
    if [ -n "$sockets" ] && [ -n "$cores" ] && [ -n "$threads" ]; then
        topo="CPUs=$cpus Sockets=$sockets CoresPerSocket=$cores ThreadsPerCore=$threads"
    fi
    avail_mb=$(awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo)
    real_mb=$((avail_mb * 9 / 10))
    [ "$real_mb" -ge 256 ] || real_mb=256

    cat >"$CONF.tmp" <<EOF
# Generated by slurm/local_cluster/start.sh; single-node test cluster on localhost.
ClusterName=$CLUSTER
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
StateSaveLocation=$DIR/state/ctld
SlurmdSpoolDir=$DIR/state/slurmd
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
MpiDefault=none
SwitchType=switch/none
# no systemd, no cgroups
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
# accounting: submitit learns job states only from sacct
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
JobCompType=jobcomp/none
# fast scheduling and fast requeue
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobRequeue=1
MinJobAge=30
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
ReturnToService=2
NodeName=localhost NodeAddr=127.0.0.1 NodeHostname=localhost $topo RealMemory=$real_mb State=UNKNOWN
PartitionName=$PARTITION Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
    mv "$CONF.tmp" "$CONF"
    chmod 644 "$CONF"

    (umask 077 && cat >"$DBD_CONF.tmp" <<EOF
# Generated by slurm/local_cluster/start.sh
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
CommunicationParameters=NoInAddrAny
SlurmUser=root
DebugLevel=info
LogFile=$LOG/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
    )
    mv "$DBD_CONF.tmp" "$DBD_CONF"
    chmod 600 "$DBD_CONF"
}

if ctld_alive || slurmd_alive || dbd_alive; then
    [ -s "$CONF" ] && [ -s "$DBD_CONF" ] || die "Slurm daemons run but $CONF is missing"
    say "Slurm daemons already running; keeping $CONF"
else
    write_config
    say "wrote $CONF and $DBD_CONF"
fi

# ---------------------------------------------------------------------------------------------
# slurmdbd, then register the cluster, then slurmctld and slurmd
if dbd_alive; then
    say "slurmdbd already running"
else
    say "starting slurmdbd on 127.0.0.1:$DBD_PORT"
    check_port "$DBD_PORT" slurmdbd
    rm -f "$RUN/slurmdbd.pid"
    slurmdbd </dev/null >>"$LOG/slurmdbd.out" 2>&1 || die "slurmdbd failed to start"
fi
wait_for "slurmdbd (sacctmgr list cluster)" sacctmgr -n list cluster
if [ -z "$(sacctmgr -n -P list cluster "$CLUSTER" format=Cluster 2>/dev/null)" ]; then
    say "registering cluster $CLUSTER in the accounting database"
    sacctmgr -i add cluster "$CLUSTER" >/dev/null || die "sacctmgr add cluster $CLUSTER failed"
fi

if ctld_alive; then
    say "slurmctld already running"
else
    say "starting slurmctld on 127.0.0.1:$CTLD_PORT"
    check_port "$CTLD_PORT" slurmctld
    rm -f "$RUN/slurmctld.pid"
    slurmctld -f "$CONF" </dev/null >>"$LOG/slurmctld.out" 2>&1 || die "slurmctld failed to start"
fi
wait_for "slurmctld (scontrol ping)" bash -c 'scontrol ping | grep -q UP'

if slurmd_alive; then
    say "slurmd already running"
else
    say "starting slurmd -N localhost"
    check_port "$SLURMD_PORT" slurmd
    rm -f "$RUN/slurmd.pid"
    slurmd -f "$CONF" -N localhost </dev/null >>"$LOG/slurmd.out" 2>&1 || die "slurmd failed to start"
fi

node_up() {
    local state
    state=$(sinfo -h -N -n localhost -o %t 2>/dev/null | head -n 1)
    case "$state" in
        idle | mix | alloc | comp) return 0 ;;
        *) return 1 ;;
    esac
}
wait_for "node localhost to be idle in sinfo" node_up
wait_for "sacct to answer" sacct -n -X -S now

cat >"$DIR/env.sh.tmp" <<EOF
export SLURM_LOCAL_DIR=$DIR
export SLURM_CONF=$CONF
EOF
mv "$DIR/env.sh.tmp" "$DIR/env.sh"

say "cluster $CLUSTER up in $(elapsed)s: $(sinfo -h -N -o '%N %t %c CPUs %m MB' | head -n 1)"
say "use it with:"
cat "$DIR/env.sh"
