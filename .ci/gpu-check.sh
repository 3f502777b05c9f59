#!/usr/bin/env bash
# GPU discovery on a real NVIDIA machine: builds `tela` (unless TELA_BIN points at one) and
# prints what `tela node` would announce, next to what the driver itself reports.
#
#   .ci/gpu-check.sh                  # build, then discover
#   TELA_BIN=/path/to/tela .ci/gpu-check.sh
#   CUDA_VISIBLE_DEVICES=1 .ci/gpu-check.sh   # discovery respects it, as the engine does
#
# Exits non-zero when a driver is present (nvidia-smi works) but discovery fell back to the
# hardware profile, or found a different number of GPUs than nvidia-smi lists, or (with
# CUDA_VISIBLE_DEVICES unset) when CUDA_VISIBLE_DEVICES by index, by UUID or UUID prefix,
# empty, or naming a MIG instance or a missing index is not followed as CUDA follows it, or
# when `tela node --print-hardware` disagrees with `tela hardware`.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${TELA_BIN:-}" ]; then
  echo "=== building tela"
  cargo build --release -p tela-gateway --bin tela
  TELA_BIN=${CARGO_TARGET_DIR:-target}/release/tela
fi

echo "=== tela hardware"
"$TELA_BIN" hardware --hardware-profile cpu
echo "=== tela hardware --json"
json=$("$TELA_BIN" hardware --json --hardware-profile cpu)
echo "$json"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "=== no working nvidia-smi: nothing to compare (the fallback above is the expected result)"
  exit 0
fi
echo "=== nvidia-smi -L"
nvidia-smi -L
echo "=== nvidia-smi --query-gpu=index,name,memory.total --format=csv"
nvidia-smi --query-gpu=index,name,memory.total --format=csv
echo "=== nvidia-smi nvlink --status (first lines)"
nvidia-smi nvlink --status 2>/dev/null | head -20 || true
echo "=== nvidia-smi topo -m"
nvidia-smi topo -m 2>/dev/null || true

# `tela hardware --json` on stdin -> "<kind> <gpu_count>" (kind: nvml or profile).
kind_count() {
  sed -n 's/.*"gpu_count":\([0-9]*\).*"kind":"\([a-z]*\)".*/\2 \1/p'
}
read -r kind count <<<"$(printf '%s' "$json" | kind_count)"
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
  expected=$(nvidia-smi -L | wc -l)
  echo "=== CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES: not comparing the count with nvidia-smi ($expected GPUs present)"
  expected=$count
else
  expected=$(nvidia-smi -L | wc -l)
fi
if [ "$kind" != "nvml" ]; then
  echo "FAIL: a driver is present but discovery fell back to the hardware profile" >&2
  exit 1
fi
if [ "$count" != "$expected" ]; then
  echo "FAIL: discovery found $count GPUs, nvidia-smi lists $expected" >&2
  exit 1
fi
echo "OK: NVML discovery found $count GPU(s)"
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
  exit 0
fi

# What discovery announces under CUDA_VISIBLE_DEVICES=$1: "<kind> <gpu_count>".
announced() {
  CUDA_VISIBLE_DEVICES="$1" "$TELA_BIN" hardware --json --hardware-profile cpu 2>/dev/null | kind_count
}
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1 | tr -d ' ')
failed=0
expect() {
  local got
  got=$(announced "$1")
  if [ "$got" = "$2" ]; then
    echo "ok: CUDA_VISIBLE_DEVICES='$1' announces $got"
  else
    echo "FAIL: CUDA_VISIBLE_DEVICES='$1' announces '$got', expected '$2'" >&2
    failed=1
  fi
}
echo "=== CUDA_VISIBLE_DEVICES, as CUDA reads it"
expect 0 "nvml 1"
expect "$uuid" "nvml 1"
expect "${uuid:0:12}" "nvml 1"
expect "0,0" "nvml 1"
expect "" "profile 0"
expect "MIG-0" "profile 0"
expect "$count" "profile 0"
expect "$count,0" "profile 0"

echo "=== tela node --print-hardware (no gateway, no secret: a job script asks first)"
node=$(env -u TELA_JOIN "$TELA_BIN" node --print-hardware) || { echo "FAIL: tela node --print-hardware failed" >&2; exit 1; }
echo "$node"
if [ "$node" != "$("$TELA_BIN" hardware --hardware-profile cpu 2>/dev/null)" ]; then
  echo "FAIL: tela node --print-hardware differs from tela hardware" >&2
  failed=1
fi
exit $failed
