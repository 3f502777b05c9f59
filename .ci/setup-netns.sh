#!/usr/bin/env bash
# Checks that network namespaces can be made here (root, `ip netns`, veth pairs), for the test
# that cuts a node off from its gateway
# (gateway/tests/processes/nodes_behind_a_login_host_in_network_namespaces.rs). Installs
# Debian's `iproute2` when `ip` is missing (root, apt-get). Makes one namespace and one veth
# pair and removes them again; changes nothing else. Prints, as its last line:
#   export TELA_NETNS=1
set -euo pipefail

log() { echo "setup-netns: $*" >&2; }

[ "$(id -u)" = 0 ] || { log "network namespaces need root"; exit 1; }
if ! command -v ip >/dev/null; then
  command -v apt-get >/dev/null || { log "no ip and no apt-get: install iproute2 by hand"; exit 1; }
  log "installing iproute2 with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends iproute2 >/dev/null
fi
ns=tela-check-$$
trap 'ip netns del "$ns" 2>/dev/null || true' EXIT
ip netns add "$ns" || { log "cannot make a network namespace (ip netns add failed)"; exit 1; }
ip -n "$ns" link add tela-ck0 type veth peer name tela-ck1 || { log "cannot make a veth pair"; exit 1; }
ip -n "$ns" link set lo up
log "network namespaces and veth pairs work"
echo "export TELA_NETNS=1"
