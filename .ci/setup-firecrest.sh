#!/usr/bin/env bash
# Starts a real FirecREST v2 server (../shared/vendor/firecrest-v2, see its ORIGIN.md) in front of
# the local Slurm, for the FirecREST backend's process test
# (gateway/tests/processes/spinning_through_firecrest.rs). Must run as root. What it does, each
# step skipped when already done (a warm re-run takes about a second):
#   1. the local Slurm with accounting (TELA_SLURM_ACCOUNTING=1 .ci/slurm/start.sh: MariaDB and
#      slurmdbd, since FirecREST reads job states with sacct);
#   2. a Python venv at .ci/cache/firecrest-venv with FirecREST's requirements.txt;
#   3. an sshd of its own on 127.0.0.1:$TELA_FIRECREST_SSH_PORT (OpenSSH from .ci/setup-sshd.sh's
#      packages), root login by key only: FirecREST runs sbatch/squeue/sacct/scancel through it
#      as the token's user (root, as the other Slurm tests);
#   4. the test's own identity provider (.ci/firecrest/idp.py): an RSA key, its JWKS (FirecREST's
#      publicCerts, a file:// URL) and a client-credentials token endpoint with two clients,
#      tela-ci (the backend under test) and firecrest-health-check (FirecREST's own probes);
#   5. FirecREST (uvicorn) on 127.0.0.1:$TELA_FIRECREST_PORT, system name "telaci".
# Everything listens on loopback only; state is in $TELA_FIRECREST_RUN. Prints, as its last lines:
#   export TELA_FIRECREST_URL=http://127.0.0.1:8078
#   export TELA_FIRECREST_SYSTEM=telaci
#   export TELA_FIRECREST_TOKEN_URL=http://127.0.0.1:8079/token
#   export TELA_FIRECREST_CLIENT_ID=tela-ci
#   export TELA_FIRECREST_SECRET_FILE=<run dir>/client-secret
# Stop it with .ci/setup-firecrest.sh --stop (by pid file).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENDOR=${TELA_FIRECREST_VENDOR:-$ROOT/../shared/vendor/firecrest-v2}
VENV=$ROOT/.ci/cache/firecrest-venv
RUN=${TELA_FIRECREST_RUN:-/run/tela-firecrest}
PORT=${TELA_FIRECREST_PORT:-8078}
IDP_PORT=${TELA_FIRECREST_IDP_PORT:-8079}
SSH_PORT=${TELA_FIRECREST_SSH_PORT:-2279}
SYSTEM=telaci
KID=tela-ci

log() { echo "setup-firecrest: $*" >&2; }
die() { log "ERROR: $*"; for f in firecrest idp sshd; do [ -f "$RUN/$f.log" ] && tail -n 20 "$RUN/$f.log" >&2; done; exit 1; }
alive() { local p; [ -s "$RUN/$1.pid" ] && p=$(cat "$RUN/$1.pid") && [ -d "/proc/$p" ]; }
stop() { alive "$1" && kill "$(cat "$RUN/$1.pid")" 2>/dev/null; rm -f "$RUN/$1.pid"; }

if [ "${1:-}" = --stop ]; then
  for d in firecrest idp sshd; do stop "$d"; done
  exit 0
fi
[ "$(id -u)" = 0 ] || die "must run as root (Slurm, sshd)"
[ -f "$VENDOR/requirements.txt" ] || die "FirecREST is not at $VENDOR"

# 1. Slurm with accounting.
TELA_SLURM_ACCOUNTING=1 .ci/slurm/start.sh >/dev/null || die "the local Slurm did not start"
command -v sacct >/dev/null && sacct -n -X -S now-1minutes >/dev/null || die "sacct does not work"

# 2. The venv.
if ! "$VENV/bin/python" -c "import fastapi, uvicorn, asyncssh, jose, jwt, requests_file" 2>/dev/null; then
  log "creating $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  "$VENV/bin/pip" install --quiet -r "$VENDOR/requirements.txt"
fi

# 3. sshd.
.ci/setup-sshd.sh >/dev/null || die "OpenSSH could not be installed"
mkdir -p "$RUN" && chmod 700 "$RUN"
[ -s "$RUN/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$RUN/ssh_host_ed25519_key"
[ -s "$RUN/ssh_user_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$RUN/ssh_user_key"
cp "$RUN/ssh_user_key.pub" "$RUN/authorized_keys" && chmod 600 "$RUN/authorized_keys"
cat > "$RUN/sshd_config" <<CONF
ListenAddress 127.0.0.1
Port $SSH_PORT
HostKey $RUN/ssh_host_ed25519_key
PidFile $RUN/sshd.pid
AuthorizedKeysFile $RUN/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxStartups 100:30:200
MaxSessions 100
CONF
mkdir -p /run/sshd
if ! alive sshd; then
  log "starting sshd on 127.0.0.1:$SSH_PORT"
  "$(command -v sshd || echo /usr/sbin/sshd)" -f "$RUN/sshd_config" -E "$RUN/sshd.log" || die "sshd did not start"
fi
for _ in $(seq 50); do
  ssh -q -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -i "$RUN/ssh_user_key" \
    -p "$SSH_PORT" root@127.0.0.1 squeue -h >/dev/null 2>&1 && break
  sleep 0.1
done
ssh -q -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -i "$RUN/ssh_user_key" \
  -p "$SSH_PORT" root@127.0.0.1 squeue -h >/dev/null || die "cannot run squeue over ssh"

# 4. The identity provider.
if [ ! -s "$RUN/idp-key.pem" ]; then
  "$VENV/bin/python" - "$RUN" "$KID" <<'PY'
import json, secrets, sys
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
run, kid = sys.argv[1], sys.argv[2]
key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
open(f"{run}/idp-key.pem", "wb").write(key.private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
jwk = json.loads(RSAAlgorithm.to_jwk(key.public_key()))
jwk.update({"kid": kid, "alg": "RS256", "use": "sig"})
json.dump({"keys": [jwk]}, open(f"{run}/jwks.json", "w"))
clients = {"tela-ci": {"secret": secrets.token_urlsafe(24), "user": "root", "expires_in": 300},
           "firecrest-health-check": {"secret": secrets.token_urlsafe(24), "user": "root", "expires_in": 300}}
json.dump(clients, open(f"{run}/clients.json", "w"))
open(f"{run}/client-secret", "w").write(clients["tela-ci"]["secret"] + "\n")
open(f"{run}/health-secret", "w").write(clients["firecrest-health-check"]["secret"] + "\n")
PY
  chmod 600 "$RUN"/idp-key.pem "$RUN"/clients.json "$RUN"/client-secret "$RUN"/health-secret
  stop idp; stop firecrest
fi
if ! alive idp; then
  log "starting the token issuer on 127.0.0.1:$IDP_PORT"
  ( exec setsid "$VENV/bin/python" .ci/firecrest/idp.py --key "$RUN/idp-key.pem" --kid "$KID" \
      --clients "$RUN/clients.json" --listen "127.0.0.1:$IDP_PORT" </dev/null >"$RUN/idp.log" 2>&1 ) &
  echo $! > "$RUN/idp.pid"
fi
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$IDP_PORT/health" >/dev/null && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$IDP_PORT/health" >/dev/null || die "the token issuer does not answer"

# 5. FirecREST.
cat > "$RUN/firecrest.yaml.new" <<YAML
# generated by Tela's .ci/setup-firecrest.sh
apis_root_path: ""
doc_servers:
  - url: "http://127.0.0.1:$PORT"
    description: "Tela CI"
auth:
  authentication:
    scopes: {}
    tokenUrl: "http://127.0.0.1:$IDP_PORT/token"
    tokenEndpointAuthMethod: "client_secret_post"
    publicCerts:
      - "file://$RUN/jwks.json"
    usernameClaim: "preferred_username"
ssh_credentials:
  type: "SSHStaticKeys"
  keys:
    root:
      private_key: "secret_file:$RUN/ssh_user_key"
clusters:
- name: "$SYSTEM"
  ssh:
    host: "127.0.0.1"
    port: $SSH_PORT
    max_clients: 50
    timeout:
      connection: 5
      login: 5
      command_execution: 20
      idle_timeout: 60
      keep_alive: 5
  scheduler:
    type: "slurm"
    version: "$(sinfo -V | awk '{print $2}')"
    timeout: 20
    connection_mode: "ssh"
  service_account:
    client_id: "firecrest-health-check"
    secret: "secret_file:$RUN/health-secret"
  probing:
    interval_check: 600
    services:
      ssh:
        timeout: 5
      scheduler:
        timeout: 10
      filesystem:
        timeout: 5
  file_systems:
    - path: '/tmp'
      data_type: 'scratch'
      default_work_dir: true
  data_operation:
    max_ops_file_size: 5242880
    datatransfer_jobs_directives:
    - "#SBATCH --nodes=1"
YAML
if ! cmp -s "$RUN/firecrest.yaml.new" "$RUN/firecrest.yaml"; then stop firecrest; fi
mv "$RUN/firecrest.yaml.new" "$RUN/firecrest.yaml"
if ! alive firecrest; then
  log "starting FirecREST on 127.0.0.1:$PORT"
  ( cd "$VENDOR/src" && YAML_CONFIG_FILE=$RUN/firecrest.yaml exec setsid "$VENV/bin/uvicorn" firecrest.main:app \
      --host 127.0.0.1 --port "$PORT" --no-access-log </dev/null >"$RUN/firecrest.log" 2>&1 ) &
  echo $! > "$RUN/firecrest.pid"
fi
token=$(curl -sf -d grant_type=client_credentials -d client_id=tela-ci --data-urlencode "client_secret=$(cat "$RUN/client-secret")" \
  "http://127.0.0.1:$IDP_PORT/token" | "$VENV/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["access_token"])') \
  || die "the token issuer gives no token"
code=000
for _ in $(seq 300); do
  code=$(curl -s -o "$RUN/probe.json" -w '%{http_code}' -H "Authorization: Bearer $token" \
    "http://127.0.0.1:$PORT/compute/$SYSTEM/jobs" || true)
  [ "$code" = 200 ] && break
  alive firecrest || break
  sleep 0.2
done
[ "$code" = 200 ] || die "FirecREST does not list jobs (HTTP $code: $(head -c 300 "$RUN/probe.json" 2>/dev/null))"
log "ready: FirecREST v2 on http://127.0.0.1:$PORT (system $SYSTEM), tokens from http://127.0.0.1:$IDP_PORT/token"
echo "export TELA_FIRECREST_URL=http://127.0.0.1:$PORT"
echo "export TELA_FIRECREST_SYSTEM=$SYSTEM"
echo "export TELA_FIRECREST_TOKEN_URL=http://127.0.0.1:$IDP_PORT/token"
echo "export TELA_FIRECREST_CLIENT_ID=tela-ci"
echo "export TELA_FIRECREST_SECRET_FILE=$RUN/client-secret"
