#!/usr/bin/env bash
# Installs OpenSSH's server and client (Debian's `openssh-server`, `openssh-client`) for the
# tests of nodes that reach their gateway only through a login host
# (gateway/tests/processes/nodes_behind_a_login_host_*.rs) when they are not already installed.
# Needs root (apt-get), as CI runs. Installing starts no daemon and changes no configuration
# the tests use: each test runs its own `sshd` with its own config, host key and authorized key
# in a temporary directory, on a loopback or namespace-private address. Prints, as its last line:
#   export TELA_SSHD=<path to sshd>
set -euo pipefail

log() { echo "setup-sshd: $*" >&2; }

find_sshd() { command -v sshd || { [ -x /usr/sbin/sshd ] && echo /usr/sbin/sshd; } || true; }

bin=$(find_sshd)
if [ -z "$bin" ] || ! command -v ssh >/dev/null || ! command -v ssh-keygen >/dev/null; then
  command -v apt-get >/dev/null || { log "no sshd and no apt-get: install OpenSSH's server by hand"; exit 1; }
  log "installing openssh-server with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  # Keep the package's own sshd service from starting (there may be no init system at all).
  blocker=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 0755 /usr/sbin/policy-rc.d
    blocker=/usr/sbin/policy-rc.d
  fi
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends openssh-server openssh-client >/dev/null
  [ -n "$blocker" ] && rm -f "$blocker"
  bin=$(find_sshd)
  [ -n "$bin" ] || { log "sshd is still not found after installing"; exit 1; }
fi
log "sshd: $bin ($("$bin" -V 2>&1 | head -n1 || true))"
echo "export TELA_SSHD=$bin"
