#!/usr/bin/env bash
# Checks a release `tela` (by default the one deploy/release/build.sh ships) for what an old
# HPC node needs, and fails on any problem:
#
#   1. no glibc symbol version newer than 2.17 (`objdump -T`), no GLIBC_PRIVATE;
#   2. only glibc's own libraries as NEEDED (`objdump -p`): no OpenSSL (TLS is rustls), no
#      libnvidia-ml (NVML is opened at run time), no libstdc++, and the standard x86-64
#      program interpreter;
#   3. `tela --version` names the commit it was built from (TELA_EXPECT_COMMIT, else the
#      checkout's HEAD where there is one);
#   4. `tela hardware` on a machine without an NVIDIA driver falls back cleanly (exit 0);
#   5. `tela demo` from this binary answers a chat completion on loopback with 200, and stops
#      on SIGTERM (all of it bounded by timeouts).
#
# Usage: deploy/release/check.sh [BINARY]     (default target/release-glibc2.17/tela)
# Needs objdump and readelf (binutils; installed with apt-get when missing and run as root),
# and curl.
set -euo pipefail

[[ -n ${1:-} && -e $1 ]] && BIN=$(realpath -- "$1")
cd "$(dirname "$0")/../.."
ROOT=$PWD
BIN=${BIN:-${1:-${CARGO_TARGET_DIR:-$ROOT/target}/release-glibc2.17/tela}}
MAX_GLIBC=2.17
# glibc's own libraries (glibc before 2.34 keeps dlopen and threads in libdl and libpthread),
# and libgcc_s, which Rust's unwinder may need.
ALLOWED_NEEDED="libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libutil.so.1 libgcc_s.so.1 ld-linux-x86-64.so.2"
INTERPRETER=/lib64/ld-linux-x86-64.so.2

FAILED=()
step() { printf '\n== %s\n' "$*"; }
ok() { printf 'ok: %s\n' "$*"; }
fail() { FAILED+=("$1"); printf 'FAIL: %s\n' "$1"; }

if [[ ! -x $BIN ]]; then
    echo "FAIL: no tela binary at $BIN; build it with deploy/release/build.sh or name one: deploy/release/check.sh PATH"
    exit 1
fi
if ! command -v objdump >/dev/null || ! command -v readelf >/dev/null; then
    if [[ $(id -u) -ne 0 ]]; then
        echo "FAIL: objdump/readelf missing: install binutils (apt-get install binutils)"
        exit 1
    fi
    echo "installing Debian's binutils (objdump, readelf)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends binutils >/dev/null
fi
command -v curl >/dev/null || { echo "FAIL: curl missing (apt-get install curl)"; exit 1; }
echo "$BIN ($(du -h "$BIN" | cut -f1))"

step "glibc symbol versions (at most GLIBC_$MAX_GLIBC)"
versions=$(objdump -T "$BIN" | grep -o 'GLIBC_[0-9][0-9.]*' | sort -Vu || true)
if [[ -z $versions ]]; then
    fail "objdump -T found no GLIBC_ symbol versions in $BIN: is it a dynamically linked glibc binary?"
else
    highest=$(tail -1 <<<"$versions")
    if [[ $(printf '%s\n' "GLIBC_$MAX_GLIBC" "$highest" | sort -V | tail -1) == "GLIBC_$MAX_GLIBC" ]]; then
        ok "highest symbol version needed: $highest"
    else
        fail "needs $highest, newer than GLIBC_$MAX_GLIBC; the symbols: $(objdump -T "$BIN" | awk -v v="$highest" '$0 ~ v" " || $0 ~ "\\("v"\\)" {print $NF}' | sort -u | tr '\n' ' ')"
    fi
fi
if objdump -T "$BIN" | grep -q GLIBC_PRIVATE; then
    fail "uses GLIBC_PRIVATE symbols, which change between glibc builds"
fi

step "shared libraries (NEEDED) and interpreter"
before=${#FAILED[@]}
needed=$(objdump -p "$BIN" | awk '$1 == "NEEDED" {print $2}')
echo "NEEDED: $(tr '\n' ' ' <<<"$needed")"
for lib in $needed; do
    [[ " $ALLOWED_NEEDED " == *" $lib "* ]] || fail "needs $lib, which an old HPC node may not have (allowed: $ALLOWED_NEEDED)"
done
for banned in libssl libcrypto libnvidia-ml libstdc++; do
    grep -q "^$banned" <<<"$needed" && fail "links $banned at start-up"
done
grep -q "libnvidia-ml.so" "$BIN" || fail "the binary does not name libnvidia-ml.so: NVML support is missing (it is opened at run time)"
interp=$(readelf -l "$BIN" | sed -n 's/.*Requesting program interpreter: \(.*\)\]/\1/p')
if [[ $interp == "$INTERPRETER" ]]; then
    ok "interpreter $interp"
else
    fail "program interpreter is '$interp', not $INTERPRETER"
fi
if objdump -p "$BIN" | grep -qE 'RPATH|RUNPATH'; then
    fail "has an RPATH/RUNPATH: $(objdump -p "$BIN" | grep -E 'RPATH|RUNPATH')"
fi
((${#FAILED[@]} > before)) || ok "only glibc's libraries; no OpenSSL, no libnvidia-ml at start-up"

step "tela --version names the commit"
version=$(timeout 10 "$BIN" --version 2>&1) || fail "tela --version failed: $version"
echo "$version"
expect=${TELA_EXPECT_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || true)}
if [[ -n $expect ]]; then
    if [[ $version == *"commit $expect"* ]]; then
        ok "names commit $expect"
    else
        fail "tela --version does not name commit $expect (HEAD; rebuild, or set TELA_EXPECT_COMMIT)"
    fi
else
    if [[ $version =~ commit\ [0-9a-f]{7,} ]]; then
        ok "names a commit (no checkout here to compare with)"
    else
        fail "tela --version names no commit"
    fi
fi

step "tela hardware without an NVIDIA driver"
if hw=$(timeout 20 "$BIN" hardware --log warn 2>&1); then
    ok "$(echo "$hw" | head -2 | tr '\n' ' ')"
else
    fail "tela hardware exited non-zero: $hw"
fi

step "tela demo answers a chat completion"
TMP=$(mktemp -d)
DEMO_PID=""
KIDS=()
# The demo's nodes and engines (each in its own process group), remembered in KIDS.
remember_kids() {
    local pid
    for pid in $(ps -o pid= --ppid "$1" 2>/dev/null || true); do
        [[ " ${KIDS[*]} " == *" $pid "* ]] || KIDS+=("$pid")
    done
}
alive_kids() {
    local pid
    for pid in "${KIDS[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then echo "$pid"; fi
    done
}
stop_demo() {
    [[ -n $DEMO_PID ]] || return 0
    local pid=$DEMO_PID status=0 left
    DEMO_PID=""
    remember_kids "$pid"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
        fail "tela demo did not stop within 10 s of SIGTERM"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || status=$?
    for _ in $(seq 50); do [[ -z $(alive_kids) ]] && break; sleep 0.1; done
    left=$(alive_kids | tr '\n' ' ')
    if [[ -n $left ]]; then
        fail "processes the demo started outlived it: $left"
        # shellcheck disable=SC2086 # one pid per word
        kill -KILL $left 2>/dev/null || true
    else
        ok "tela demo (exit status $status) and the ${#KIDS[@]} processes it started stopped on SIGTERM"
    fi
}
cleanup() {
    stop_demo
    rm -rf "$TMP"
}
trap cleanup EXIT
TMPDIR=$TMP "$BIN" demo --port 0 --nodes 2 --ttft-ms 1 --tokens-per-s 1000 </dev/null >"$TMP/out" 2>"$TMP/err" &
DEMO_PID=$!
base="" key=""
for _ in $(seq 600); do
    grep -q "Ctrl-C stops everything" "$TMP/out" 2>/dev/null && break
    kill -0 "$DEMO_PID" 2>/dev/null || break
    sleep 0.1
done
base=$(sed -n 's/^ *base URL: *\(http[^ ]*\)/\1/p' "$TMP/out" | head -1)
key=$(sed -n 's/^ *API key: *\([^ ]*\)/\1/p' "$TMP/out" | head -1)
if [[ -z $base || -z $key ]]; then
    fail "tela demo printed no base URL and API key within 60 s; stdout: $(cat "$TMP/out"); stderr: $(tail -20 "$TMP/err")"
else
    [[ $base == http://127.0.0.1:* ]] || fail "the demo's API is not on loopback: $base"
    echo "demo at $base"
    remember_kids "$DEMO_PID"
    body='{"model": "tela-demo", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}'
    status="" deadline=$((SECONDS + 30))
    # Nodes join a moment after the banner: 503 until one serves.
    while ((SECONDS < deadline)); do
        status=$(curl -sS -o "$TMP/reply" -w '%{http_code}' --max-time 10 "$base/chat/completions" \
            -H "Authorization: Bearer $key" -H 'Content-Type: application/json' -d "$body" 2>"$TMP/curl.err") || status="curl failed: $(cat "$TMP/curl.err")"
        [[ $status == 200 ]] && break
        sleep 0.5
    done
    if [[ $status == 200 ]] && grep -q '"chat.completion"' "$TMP/reply"; then
        ok "POST /v1/chat/completions: 200, $(grep -o '"content":"[^"]*"' "$TMP/reply" | head -1)"
    else
        fail "POST /v1/chat/completions did not answer 200 within 30 s (last: $status $(head -c 300 "$TMP/reply" 2>/dev/null))"
    fi
fi
stop_demo

step "summary"
if ((${#FAILED[@]})); then
    printf 'FAILED: %s\n' "${FAILED[@]}"
    exit 1
fi
echo "$BIN: all release checks passed (glibc <= $MAX_GLIBC, $(wc -w <<<"$needed") glibc libraries, demo answered)"
