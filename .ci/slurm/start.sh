#!/usr/bin/env bash
# Installs, configures and starts a single-node Slurm 22.05 cluster (Debian bookworm packages)
# on this machine, without systemd, for Tela's Slurm tests (gateway/tests/processes/slurm_*.rs):
# slurmctld + slurmd with fake GPUs, and slurmrestd with JWT authentication. Everything listens
# on loopback only. Idempotent: re-running it while the cluster is up only re-checks readiness
# (and restarts the daemons if the generated configuration changed). Must run as root.
#
# Prints, as its last lines, the environment the tests read (the same lines are kept in
# $TELA_SLURM_RUN/env, which the tests also look for by default):
#   export TELA_SLURM_ENV=<run dir>/env         this file
#   export TELA_SLURM_PARTITION=debug           the partition to submit to
# A second partition, `queued`, has the same node capped at 2 CPUs (for the queue-estimate test).
#   export TELA_SLURMRESTD_URL=http://127.0.0.1:6820
#   export TELA_SLURM_REST_USER=root            X-SLURM-USER-NAME
#   export TELA_SLURM_JWT_FILE=<run dir>/jwt    X-SLURM-USER-TOKEN, one line (renewed on every run)
# Use it as:  eval "$(.ci/slurm/start.sh | grep '^export ')"
#
# Knobs (environment):
#   TELA_SLURM_RUN        pid files, fake GPU devices, env and token files [/run/tela-slurm]
#   TELA_SLURM_CPUS       CPUs the node advertises (may exceed nproc)       [max(nproc, 16)]
#   TELA_SLURM_MEM        RealMemory in MB advertised                       [4000]
#   TELA_SLURM_GPUS       fake gres/gpu on the node                         [4]
#   TELA_SLURM_REST       1: also start slurmrestd                          [1]
#   TELA_SLURM_REST_PORT  slurmrestd's port on 127.0.0.1                    [6820]
#   TELA_SLURM_ACCOUNTING 1: also MariaDB + slurmdbd, so that `sacct` works   [0]
#                         (FirecREST reads job states with sacct; .ci/test sets it)
# Stop it with .ci/slurm/stop.sh (--purge also deletes its state and configuration).
set -euo pipefail

RUN=${TELA_SLURM_RUN:-/run/tela-slurm}
CPUS=${TELA_SLURM_CPUS:-$(( $(nproc) > 16 ? $(nproc) : 16 ))}
MEM=${TELA_SLURM_MEM:-4000}
GPUS=${TELA_SLURM_GPUS:-4}
REST=${TELA_SLURM_REST:-1}
REST_PORT=${TELA_SLURM_REST_PORT:-6820}
ACCT=${TELA_SLURM_ACCOUNTING:-0}
REST_USER=slurmrest            # slurmrestd refuses to run as root or as SlurmUser
TOKEN_USER=root                # whom the REST token speaks for (the tests run as root)
H=$(hostname -s)
CONF=/etc/slurm/slurm.conf
CTLD_STATE=/var/spool/slurmctld
SLURMD_SPOOL=/var/spool/slurmd
LOG=/var/log/slurm
JWT_KEY=$CTLD_STATE/jwt_hs256.key

log() { echo "[slurm-start $(date +%T)] $*" >&2; }
die() {
  log "ERROR: $*"
  for f in slurmctld slurmd slurmrestd slurmdbd; do [ -f "$LOG/$f.log" ] && tail -n 20 "$LOG/$f.log" >&2; done
  exit 1
}
[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts slurmctld/slurmd)"

# pid_alive PIDFILE COMM: the pid in PIDFILE is alive and is COMM
pid_alive() { local p; [ -s "$1" ] && p=$(cat "$1") && [ -d "/proc/$p" ] && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$2" ]; }

# ---------------------------------------------------------------- 1. packages
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
   || ! command -v munged >/dev/null || { [ "$REST" = 1 ] && ! command -v slurmrestd >/dev/null; } \
   || ! dpkg-query -W -f='${Status}' slurm-wlm-jwt-plugin 2>/dev/null | grep -q 'ok installed' \
   || ! command -v curl >/dev/null \
   || { [ "$ACCT" = 1 ] && { ! command -v slurmdbd >/dev/null || ! command -v mariadbd >/dev/null; }; }; then
  log "installing packages"
  # Keep the packages' maintainer scripts from starting daemons (no systemd, no slurm.conf yet).
  tmp_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; tmp_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  rc=0
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      slurmctld slurmd slurm-client munge slurmrestd slurm-wlm-jwt-plugin curl \
      $([ "$ACCT" = 1 ] && echo slurmdbd mariadb-server) >/dev/null; } || rc=$?
  [ "$tmp_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
  [ "$rc" = 0 ] || die "apt-get failed ($rc)"
fi

# ---------------------------------------------------------------- 2. dirs, users, fake GPUs
mkdir -p "$RUN" "$RUN/fake-gpu" "$CTLD_STATE" "$SLURMD_SPOOL" "$LOG" /etc/slurm
id "$REST_USER" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$REST_USER"
# gres/gpu drops entries without File= and wants character devices: symlinks to /dev/null.
for ((i = 0; i < GPUS; i++)); do ln -sfn /dev/null "$RUN/fake-gpu/nvidia$i"; done
[ -s "$JWT_KEY" ] || { head -c 32 /dev/urandom > "$JWT_KEY"; chmod 600 "$JWT_KEY"; }

# ---------------------------------------------------------------- 3. configuration
gres_line=""; [ "$GPUS" -gt 0 ] && gres_line="Gres=gpu:$GPUS"
acct_lines="AccountingStorageType=accounting_storage/none"
[ "$ACCT" = 1 ] && acct_lines="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819"
cat > "$CONF.new" <<CONF
# generated by Tela's .ci/slurm/start.sh
ClusterName=telaci
SlurmctldHost=$H(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$JWT_KEY
StateSaveLocation=$CTLD_STATE
SlurmdSpoolDir=$SLURMD_SPOOL
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
$acct_lines
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SlurmdParameters=config_overrides
# Listen on the addresses named here (127.0.0.1), not on every interface.
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
ReturnToService=2
KillWait=5
MinJobAge=600
GresTypes=gpu
NodeName=$H NodeAddr=127.0.0.1 NodeHostname=$H CPUs=$CPUS RealMemory=$MEM $gres_line State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
# The same node behind a 2-CPU cap: one 2-CPU job there makes every other job in it wait, so
# its start estimate is later than debug's (spinning_goes_where_the_queue_starts_soonest).
PartitionName=queued Nodes=ALL MaxCPUsPerNode=2 MaxTime=INFINITE State=UP
CONF
echo "AutoDetect=off" > /etc/slurm/gres.conf.new
[ "$GPUS" -gt 0 ] && echo "NodeName=$H Name=gpu File=$RUN/fake-gpu/nvidia[0-$((GPUS - 1))]" >> /etc/slurm/gres.conf.new
conf_changed=0
cmp -s "$CONF.new" "$CONF" || conf_changed=1
cmp -s /etc/slurm/gres.conf.new /etc/slurm/gres.conf || conf_changed=1
mv "$CONF.new" "$CONF"; mv /etc/slurm/gres.conf.new /etc/slurm/gres.conf

# ---------------------------------------------------------------- 4. munge
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  log "starting munged"
  [ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null \
    || head -c 1024 /dev/urandom > /etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
  install -d -o munge -g munge -m 755 /run/munge /var/log/munge /var/lib/munge
  runuser -u munge -- /usr/sbin/munged </dev/null || die "munged failed: $(tail -n 5 /var/log/munge/munged.log)"
  for _ in $(seq 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n </dev/null | unmunge >/dev/null || die "munge does not work"
  cp /run/munge/munged.pid "$RUN/munged.pid"
fi

# ---------------------------------------------------------------- 4b. accounting: MariaDB + slurmdbd
if [ "$ACCT" = 1 ]; then
  DB_PASS_FILE=/etc/slurm/.tela-db-pass
  [ -s "$DB_PASS_FILE" ] || { head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' > "$DB_PASS_FILE"; chmod 600 "$DB_PASS_FILE"; }
  db_pass=$(cat "$DB_PASS_FILE")
  if ! mariadb-admin ping >/dev/null 2>&1; then
    log "starting mariadbd"
    install -d -o mysql -g mysql /run/mysqld
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null 2>&1 \
      || die "mariadb-install-db failed"
    ( exec setsid mariadbd --user=mysql --datadir=/var/lib/mysql --bind-address=127.0.0.1 \
        --socket=/run/mysqld/mysqld.sock --pid-file=/run/mysqld/mysqld.pid </dev/null >"$LOG/mariadbd.log" 2>&1 ) &
    for _ in $(seq 100); do mariadb-admin ping >/dev/null 2>&1 && break; sleep 0.1; done
    mariadb-admin ping >/dev/null 2>&1 || die "mariadbd does not answer: $(tail -n 5 "$LOG/mariadbd.log")"
    cp /run/mysqld/mysqld.pid "$RUN/mariadbd.pid"   # stop.sh stops it by this file
  fi
  mariadb -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$db_pass';
              ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$db_pass';
              GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';" || die "cannot create the database user"
  umask 077
  cat > /etc/slurm/slurmdbd.conf.new <<DBD
# generated by Tela's .ci/slurm/start.sh
AuthType=auth/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$JWT_KEY
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
LogFile=$LOG/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$db_pass
StorageLoc=slurm_acct_db
DBD
  umask 022
  dbd_changed=0
  cmp -s /etc/slurm/slurmdbd.conf.new /etc/slurm/slurmdbd.conf || dbd_changed=1
  mv /etc/slurm/slurmdbd.conf.new /etc/slurm/slurmdbd.conf
  if [ "$dbd_changed" = 1 ] && pid_alive "$RUN/slurmdbd.pid" slurmdbd; then
    kill "$(cat "$RUN/slurmdbd.pid")"; for _ in $(seq 100); do pid_alive "$RUN/slurmdbd.pid" slurmdbd || break; sleep 0.1; done
  fi
  if ! pid_alive "$RUN/slurmdbd.pid" slurmdbd; then
    log "starting slurmdbd"; slurmdbd </dev/null || die "slurmdbd failed to start"
  fi
  for _ in $(seq 100); do sacctmgr -n list cluster format=cluster >/dev/null 2>&1 && break; sleep 0.1; done
  if ! sacctmgr -n -P list cluster format=cluster 2>/dev/null | grep -qx telaci; then
    sacctmgr -i add cluster telaci >/dev/null 2>&1 || true
  fi
  sacctmgr -n -P list cluster format=cluster 2>/dev/null | grep -qx telaci || die "slurmdbd does not list the cluster"
fi

# ---------------------------------------------------------------- 5. slurmctld + slurmd
if [ "$conf_changed" = 1 ] && pid_alive "$RUN/slurmctld.pid" slurmctld; then
  log "configuration changed: restarting the daemons"
  for d in slurmrestd slurmd slurmctld; do pid_alive "$RUN/$d.pid" "$d" && kill "$(cat "$RUN/$d.pid")" 2>/dev/null; done
  for _ in $(seq 100); do
    pid_alive "$RUN/slurmctld.pid" slurmctld || pid_alive "$RUN/slurmd.pid" slurmd || break; sleep 0.1
  done
fi
if ! pid_alive "$RUN/slurmctld.pid" slurmctld; then
  log "starting slurmctld"; slurmctld </dev/null || die "slurmctld failed to start"
fi
for i in $(seq 100); do
  scontrol ping 2>/dev/null | grep -q UP && break
  [ "$i" -gt 10 ] && ! pid_alive "$RUN/slurmctld.pid" slurmctld && break   # it died: see the log
  sleep 0.1
done
scontrol ping | grep -q UP || die "slurmctld does not answer"
if ! pid_alive "$RUN/slurmd.pid" slurmd; then
  log "starting slurmd"; slurmd </dev/null || die "slurmd failed to start"
fi

# Wait for the node to take jobs; clear a DRAIN/DOWN left over in recovered state.
ready=0
for i in $(seq 300); do
  # One line per partition the node is in: the node's state is the same on each.
  st=$(sinfo -h -N -n "$H" -o %t 2>/dev/null | head -n 1 || true)
  case "$st" in
    idle|mix|alloc|comp) ready=1; break ;;
    *drain*|*drng*|down*|inval*) [ $((i % 10)) = 0 ] && { scontrol update nodename="$H" state=resume 2>/dev/null || true; } ;;
  esac
  sleep 0.1
done
[ "$ready" = 1 ] || die "node $H not ready (state: ${st:-?}, reason: $(sinfo -h -N -n "$H" -o %E | head -n 1))"
# slurmctld's first main scheduling pass comes ~3 s after it starts; wait for it so that the
# first job starts within a second (batch_sched_delay=0, one-second scheduler ticks after that).
for _ in $(seq 100); do
  c=$(sdiag 2>/dev/null | awk '/^Main schedule/{m=1} m && /Total cycles:/{print $3; exit}')
  [ "${c:-0}" -ge 1 ] && break; sleep 0.1
done

# ---------------------------------------------------------------- 6. slurmrestd (JWT)
umask 077
{
  echo "export TELA_SLURM_ENV=$RUN/env"
  echo "export TELA_SLURM_PARTITION=debug"
} > "$RUN/env.new"
if [ "$REST" = 1 ]; then
  if ! pid_alive "$RUN/slurmrestd.pid" slurmrestd; then
    log "starting slurmrestd on 127.0.0.1:$REST_PORT"
    # -s: without it 22.05 also loads openapi/dbv0.0.3x, which is fatal without slurmdbd.
    # The working directory is the default one of REST jobs that do not name theirs.
    ( cd /tmp && SLURM_JWT=daemon exec setsid slurmrestd -u "$REST_USER" -s openapi/v0.0.38 \
        -a rest_auth/jwt "127.0.0.1:$REST_PORT" </dev/null >"$LOG/slurmrestd.log" 2>&1 ) &
    echo $! > "$RUN/slurmrestd.pid"
  fi
  token=$(scontrol token username="$TOKEN_USER" lifespan=86400 | sed -n 's/^SLURM_JWT=//p')
  [ -n "$token" ] || die "scontrol token failed"
  printf '%s\n' "$token" > "$RUN/jwt.new" && mv "$RUN/jwt.new" "$RUN/jwt"
  code=000
  for _ in $(seq 100); do
    code=$(curl -s -o /dev/null -w '%{http_code}' -H "X-SLURM-USER-NAME: $TOKEN_USER" \
           -H "X-SLURM-USER-TOKEN: $token" "http://127.0.0.1:$REST_PORT/slurm/v0.0.38/ping" || true)
    [ "$code" = 200 ] && break; sleep 0.1
  done
  [ "$code" = 200 ] || die "slurmrestd does not answer (HTTP $code)"
  pid_alive "$RUN/slurmrestd.pid" slurmrestd || die "slurmrestd's pid file does not match the process"
  {
    echo "export TELA_SLURMRESTD_URL=http://127.0.0.1:$REST_PORT"
    echo "export TELA_SLURM_REST_USER=$TOKEN_USER"
    echo "export TELA_SLURM_JWT_FILE=$RUN/jwt"
  } >> "$RUN/env.new"
fi
mv "$RUN/env.new" "$RUN/env"
log "ready: node $H, $CPUS CPUs, $GPUS fake GPUs$([ "$REST" = 1 ] && echo ", REST on http://127.0.0.1:$REST_PORT")"
cat "$RUN/env"
