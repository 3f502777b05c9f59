#!/usr/bin/env bash
# Stops what .ci/slurm/start.sh started, by pid file only: cancels the jobs first (so that no
# slurmstepd outlives slurmd), then slurmrestd, slurmd, slurmctld, slurmdbd and mariadbd (with
# TELA_SLURM_ACCOUNTING=1) and munged (the latter only if start.sh started it).
#   --purge  also delete the controller's and slurmd's state, the logs and the generated config
set -uo pipefail
RUN=${TELA_SLURM_RUN:-/run/tela-slurm}
log() { echo "[slurm-stop $(date +%T)] $*" >&2; }

if [ -s "$RUN/slurmctld.pid" ] && command -v scancel >/dev/null && scontrol ping 2>/dev/null | grep -q UP; then
  jobs=$(squeue -h -o %i 2>/dev/null || true)
  if [ -n "$jobs" ]; then
    log "cancelling jobs: $(echo $jobs)"
    # shellcheck disable=SC2086
    scancel $jobs 2>/dev/null || true
    for _ in $(seq 100); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
  fi
fi

pids=()
for name in slurmrestd slurmd slurmctld slurmdbd mariadbd munged; do
  f="$RUN/$name.pid"; [ -s "$f" ] || continue
  p=$(cat "$f")
  if [ -d "/proc/$p" ] && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$name" ]; then
    log "stopping $name (pid $p)"; kill -TERM "$p" 2>/dev/null && pids+=("$p")
  fi
  rm -f "$f"
done
for p in "${pids[@]}"; do
  for _ in $(seq 100); do [ -d "/proc/$p" ] || break; sleep 0.1; done
  [ -d "/proc/$p" ] && { log "pid $p still alive: SIGKILL"; kill -KILL "$p" 2>/dev/null; }
done
rm -f "$RUN/env" "$RUN/jwt"

if [ "${1:-}" = "--purge" ]; then
  log "purging state"
  rm -rf /var/spool/slurmctld /var/spool/slurmd "$RUN" /var/log/slurm/slurm*.log \
         /etc/slurm/slurm.conf /etc/slurm/gres.conf /etc/slurm/slurmdbd.conf
fi
exit 0
