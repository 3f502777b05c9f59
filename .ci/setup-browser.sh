#!/usr/bin/env bash
# Installs headless Chromium (Debian's `chromium` package) for the gateway's dashboard test
# (gateway/tests/processes/dashboard_renders_in_chromium.rs) when it is not already installed.
# Needs root (apt-get), as CI runs. Prints, as its last line:
#   export TELA_CHROMIUM=<path to chromium>
set -euo pipefail

log() { echo "setup-browser: $*" >&2; }

find_chromium() { command -v chromium || command -v chromium-browser || true; }

bin=$(find_chromium)
if [ -z "$bin" ]; then
  command -v apt-get >/dev/null || { log "no chromium and no apt-get: install Chromium by hand"; exit 1; }
  log "installing chromium with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
  bin=$(find_chromium)
  [ -n "$bin" ] || { log "chromium is still not on PATH after installing"; exit 1; }
fi
log "chromium: $("$bin" --version 2>/dev/null || echo "$bin")"
echo "export TELA_CHROMIUM=$bin"
