#!/usr/bin/env bash
# Installs vllm-router 0.1.17 (PyPI) into .ci/cache/bench-venv (ignored by git) for the
# gateway load benchmark (`tela-load`), which finds it there. Reuses the environment when
# it is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$PWD/.ci/cache/bench-venv
VERSION=0.1.17
PYTHON=${PYTHON:-python3}
if [ -x "$VENV/bin/vllm-router" ] && "$VENV/bin/pip" show vllm-router 2>/dev/null | grep -q "^Version: $VERSION$"; then
  echo "setup-vllm-router: vllm-router $VERSION already in $VENV" >&2
else
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  "$VENV/bin/pip" install --quiet "vllm-router==$VERSION"
  echo "setup-vllm-router: installed vllm-router $VERSION in $VENV" >&2
fi
echo "$VENV/bin/vllm-router"
