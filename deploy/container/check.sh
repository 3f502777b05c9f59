#!/usr/bin/env bash
# Builds the `tela` container images from the release binary and checks them, failing on any
# problem with the images themselves:
#
#   1. prepares the build context (deploy/container/context.sh);
#   2. checks deploy/container/tela.def as Apptainer parses it (check_def.py), and with
#      Apptainer, where it is installed: builds tela.sif, runs `tela --version` in it;
#   3. builds deploy/container/Containerfile (FROM scratch: nothing is pulled) with podman,
#      checks the image runs as uid 65532 with `tela` on PATH, runs `tela --version` in it
#      (it must match the binary's), and `tela demo` in it on the host's loopback, answering a
#      chat completion.
#
# Usage: deploy/container/check.sh [BINARY]     (default target/release-glibc2.17/tela)
#
# As root, installs Debian's podman and runc when missing. Where this machine cannot run
# containers at all (the runtime refuses to set up the container's namespaces, cgroups or
# limits), it says exactly what the runtime reported and skips only the runs; the image is
# still built and inspected. TELA_CONTAINER_REQUIRE_RUN=1 turns that skip into a failure.
set -euo pipefail

[[ -n ${1:-} && -e $1 ]] && BIN=$(realpath -- "$1")
cd "$(dirname "$0")/../.."
ROOT=$PWD
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN:-${1:-$TARGET_DIR/release-glibc2.17/tela}}
CTX=${TELA_CONTAINER_CONTEXT:-$TARGET_DIR/container}
IMAGE=localhost/tela:check

FAILED=() SKIPPED=()
step() { printf '\n== %s\n' "$*"; }
ok() { printf 'ok: %s\n' "$*"; }
fail() { FAILED+=("$1"); printf 'FAIL: %s\n' "$1"; }
skip() { SKIPPED+=("$1"); printf 'SKIPPED: %s\n' "$1"; }

step "build context"
[[ -x $BIN ]] || { echo "FAIL: no tela binary at $BIN; build it with deploy/release/build.sh"; exit 1; }
BIN=$(realpath "$BIN")
TELA_CONTAINER_CONTEXT=$CTX deploy/container/context.sh "$BIN" >/dev/null
version=$("$BIN" --version)
echo "$version"

step "Apptainer definition (deploy/container/tela.def)"
python3 deploy/container/check_def.py "$CTX/tela.def" "$CTX" || fail "tela.def does not parse as Apptainer reads it"
APPTAINER=$(command -v apptainer || command -v singularity || true)
if [[ -n $APPTAINER ]]; then
    if out=$(cd "$CTX" && timeout 300 "$APPTAINER" build --force tela.sif tela.def 2>&1); then
        ok "$APPTAINER build: $CTX/tela.sif ($(du -h "$CTX/tela.sif" | cut -f1))"
        for run in "exec tela.sif tela --version" "run tela.sif --version"; do
            # shellcheck disable=SC2086 # the words of $run are the arguments
            got=$(cd "$CTX" && timeout 60 "$APPTAINER" $run 2>&1) || true
            if [[ $got == "$version" ]]; then ok "apptainer $run: $got"; else fail "apptainer $run printed: $got"; fi
        done
    else
        fail "apptainer build failed: $(tail -5 <<<"$out")"
    fi
else
    why="neither apptainer nor singularity is installed"
    if command -v apt-cache >/dev/null; then
        apt-cache policy apptainer singularity-container 2>/dev/null | grep 'Candidate:' | grep -vq '(none)' ||
            why+=", and this distribution's package repositories have no apptainer or singularity-container package"
    fi
    skip "apptainer build: $why; tela.def was checked by parsing it only"
fi

step "podman"
if ! command -v podman >/dev/null || ! command -v runc >/dev/null; then
    if [[ $(id -u) -ne 0 ]]; then
        echo "FAIL: podman and runc are missing: as root, apt-get install podman runc"
        exit 1
    fi
    echo "installing Debian's podman and runc"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc >/dev/null
fi
# - runc, not Debian's default crun: crun 1.8 refuses to start any container on a machine whose
#   cgroups are "hybrid" (v1 controllers plus a cgroup2 mount with controllers), as some CI
#   machines are: "crun: cgroups in hybrid mode not supported, drop all controllers from
#   cgroupv2". runc handles both kinds.
# - Resource limits within the ones podman itself runs under: by default it asks for 1048576
#   open files and lowers its own process limit to pid_max, and without CAP_SYS_RESOURCE the
#   runtime cannot raise a limit ("setrlimit RLIMIT_NOFILE: Operation not permitted").
# - cgroupfs and a file for events: no systemd needed.
PODMAN=(podman --cgroup-manager=cgroupfs --events-backend=file)
cap() { local v=$1; [[ $v == unlimited || $v -gt $2 ]] && v=$2; echo "$v"; }
NOFILE=$(cap "$(ulimit -Hn)" 65536)
NPROC=$(cap "$(ulimit -Hu)" 4096)
RUN=("${PODMAN[@]}" run --rm --runtime runc --ulimit "nofile=$NOFILE:$NOFILE" --ulimit "nproc=$NPROC:$NPROC")
echo "$(podman --version), $(runc --version | head -1), storage driver $("${PODMAN[@]}" info --format '{{.Store.GraphDriverName}}' 2>&1)"

step "podman build (FROM scratch)"
"${PODMAN[@]}" rmi -f "$IMAGE" >/dev/null 2>&1 || true
start=$(date +%s)
if out=$(timeout 300 "${PODMAN[@]}" build --pull=never --layers=false --network none --build-arg TELA_VERSION="$version" \
    -f deploy/container/Containerfile -t "$IMAGE" "$CTX" 2>&1); then
    size=$("${PODMAN[@]}" image inspect "$IMAGE" --format '{{.Size}}')
    ok "built $IMAGE in $(($(date +%s) - start)) s: $((size / 1000000)) MB ($size bytes), $("${PODMAN[@]}" image inspect "$IMAGE" --format '{{len .RootFS.Layers}}') layers"
    config=$("${PODMAN[@]}" image inspect "$IMAGE" --format '{{.Config.User}} {{json .Config.Entrypoint}} {{range .Config.Env}}{{.}} {{end}}')
    echo "user, entrypoint, environment: $config"
    [[ $config == "65532:65532 "* ]] || fail "the image does not run as 65532:65532: $config"
    [[ $config == *"PATH=/usr/local/bin "* ]] || fail "tela is not on the image's PATH (the Kubernetes manifests run \`tela\`): $config"
    BUILT=1
else
    fail "podman build failed: $(tail -5 <<<"$out")"
    BUILT=""
fi

# A run that fails before tela starts, because the runtime could not set up the container here,
# is this machine's limitation; anything else (tela not found, a library missing) is the image's.
runtime_refused() {
    grep -qiE 'OCI runtime|crun:|runc:|cgroup|namespace|setrlimit|pivot_root|mount' <<<"$1" &&
        ! grep -qiE 'executable file|no such file|not found|exec format|permission denied: .*tela' <<<"$1"
}

if [[ -n $BUILT ]]; then
    step "tela --version in the image"
    if got=$(timeout 60 "${RUN[@]}" --network none "$IMAGE" --version 2>&1); then
        if [[ $got == "$version" ]]; then
            ok "podman run $IMAGE --version: $got"
        else
            fail "the image's tela --version printed '$got', not '$version'"
        fi
        CAN_RUN=1
    elif runtime_refused "$got" && [[ -z ${TELA_CONTAINER_REQUIRE_RUN:-} ]]; then
        skip "podman run: this machine cannot start containers; the runtime said: $got"
        CAN_RUN=""
    else
        fail "podman run $IMAGE --version failed: $got"
        CAN_RUN=""
    fi

    if [[ -n $CAN_RUN ]]; then
        step "tela demo in the image (host loopback) answers a chat completion"
        TMP=$(mktemp -d)
        NAME=tela-check-$$
        trap '"${PODMAN[@]}" rm -f "$NAME" >/dev/null 2>&1 || true; rm -rf "$TMP"' EXIT
        timeout 120 "${RUN[@]}" --name "$NAME" --network host "$IMAGE" demo --port 0 --nodes 2 --ttft-ms 1 --tokens-per-s 1000 \
            </dev/null >"$TMP/out" 2>"$TMP/err" &
        RUN_PID=$!
        for _ in $(seq 600); do
            grep -q "Ctrl-C stops everything" "$TMP/out" 2>/dev/null && break
            kill -0 "$RUN_PID" 2>/dev/null || break
            sleep 0.1
        done
        base=$(sed -n 's/^ *base URL: *\(http[^ ]*\)/\1/p' "$TMP/out" | head -1)
        key=$(sed -n 's/^ *API key: *\([^ ]*\)/\1/p' "$TMP/out" | head -1)
        if [[ -z $base || -z $key || $base != http://127.0.0.1:* ]]; then
            fail "tela demo in the image printed no loopback URL and key within 60 s: $(cat "$TMP/out") $(tail -5 "$TMP/err")"
        else
            status="" deadline=$((SECONDS + 30))
            while ((SECONDS < deadline)); do
                status=$(curl -sS -o "$TMP/reply" -w '%{http_code}' --max-time 10 "$base/chat/completions" \
                    -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
                    -d '{"model": "tela-demo", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}' 2>&1) || true
                [[ $status == 200 ]] && break
                sleep 0.5
            done
            if [[ $status == 200 ]]; then
                ok "POST $base/chat/completions: 200 from the demo in the image"
            else
                fail "the demo in the image did not answer 200 within 30 s (last: $status)"
            fi
        fi
        # podman stop sends SIGTERM to the demo (the container's first process), which stops
        # its nodes and engines; the container is gone once they are.
        if timeout 30 "${PODMAN[@]}" stop -t 15 "$NAME" >/dev/null 2>&1 && wait "$RUN_PID"; then
            ok "the demo in the image stopped on SIGTERM (exit 0)"
        else
            fail "the demo in the image did not stop cleanly on SIGTERM: $(tail -3 "$TMP/err")"
        fi
    fi
fi

step "summary"
((${#SKIPPED[@]})) && printf 'SKIPPED: %s\n' "${SKIPPED[@]}"
if ((${#FAILED[@]})); then
    printf 'FAILED: %s\n' "${FAILED[@]}"
    exit 1
fi
echo "deploy/container: checks passed (image $IMAGE${size:+, $((size / 1000000)) MB})"
