#!/usr/bin/env bash
# Installs the official OpenAI Python SDK and pytest into a virtual environment at
# .ci/cache/sdk-venv (ignored by git), for the gateway's end-to-end tests
# (gateway/tests/python/, run by `cargo test -p tela-gateway --test processes openai_sdk_end_to_end::`).
# Reuses the environment when it is already there.
#
# Prints, as its last line, the environment the tests read:
#   export TELA_SDK_PYTHON=<venv>/bin/python
# Use it as:  eval "$(.ci/setup-python.sh | grep '^export ')"
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$PWD/.ci/cache/sdk-venv
PYTHON=${PYTHON:-python3}

log() { echo "setup-python: $*" >&2; }

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import openai, pytest" 2>/dev/null; then
  log "openai $("$VENV/bin/python" -c 'import openai; print(openai.__version__)') and pytest already in $VENV"
else
  command -v "$PYTHON" >/dev/null || { log "python3 not found: apt-get install python3 python3-venv"; exit 1; }
  "$PYTHON" -c "import venv, ensurepip" 2>/dev/null || { log "python3 has no venv/ensurepip: apt-get install python3-venv"; exit 1; }
  log "creating $VENV"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  "$VENV/bin/pip" install --quiet openai pytest
  "$VENV/bin/python" -c "import openai, pytest" || { log "openai or pytest does not import after installing"; exit 1; }
  log "installed openai $("$VENV/bin/python" -c 'import openai; print(openai.__version__)')"
fi
echo "export TELA_SDK_PYTHON=$VENV/bin/python"
