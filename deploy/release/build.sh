#!/usr/bin/env bash
# Builds the release `tela` that starts on any x86-64 Linux with glibc 2.17 or newer (RHEL /
# CentOS 7, Rocky 8 and 9, Debian 9+, Ubuntu 16.04+: the manylinux2014 level), whatever glibc
# the build machine has:
#
#   deploy/release/build.sh          -> target/release-glibc2.17/tela
#
# How: `cargo zigbuild --target x86_64-unknown-linux-gnu.2.17` links against stubs of glibc
# 2.17's symbols (and compiles ring's C and assembly with `zig cc` for the same level), so the
# binary cannot pick up a newer symbol version by accident. The Rust standard library it needs
# is the ordinary x86_64-unknown-linux-gnu one. TLS is rustls (no OpenSSL); NVML is opened at
# run time with dlopen, so the binary starts on machines without an NVIDIA driver.
#
# Installs `ziglang` and `cargo-zigbuild` (pinned below) from PyPI into the ignored
# .ci/cache/zig/ once; zig's caches stay there too. Cargo builds into
# target/x86_64-unknown-linux-gnu/release/ (apart from the host's target/release/), without
# debug info; the copy to ship is target/release-glibc2.17/tela. deploy/release/check.sh
# checks it.
#
# Environment: TELA_COMMIT names the commit where the source is not a git checkout (see
# gateway/build.rs); CARGO_TARGET_DIR is honoured.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
CACHE=$ROOT/.ci/cache/zig
VENV=$CACHE/venv
GLIBC=2.17
TRIPLE=x86_64-unknown-linux-gnu
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT_DIR=$TARGET_DIR/release-glibc$GLIBC
PINS="ziglang==0.15.2
cargo-zigbuild==0.24.1"

log() { echo "release/build: $*" >&2; }

command -v cargo >/dev/null || { log "cargo not found: this needs a Rust toolchain (1.80 or newer)"; exit 1; }
if command -v rustup >/dev/null && ! rustup target list --installed 2>/dev/null | grep -qx "$TRIPLE"; then
    log "the Rust standard library for $TRIPLE is missing: rustup target add $TRIPLE"
    exit 1
fi

if [[ -x $VENV/bin/cargo-zigbuild && -x $VENV/bin/python-zig && "$(cat "$VENV/.pins" 2>/dev/null)" == "$PINS" ]]; then
    log "reusing ${VENV#"$ROOT"/}"
else
    command -v python3 >/dev/null || { log "python3 not found (apt-get install python3 python3-venv)"; exit 1; }
    log "installing $(echo "$PINS" | tr '\n' ' ')from PyPI into ${VENV#"$ROOT"/}"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir -r /dev/stdin <<<"$PINS"
    echo "$PINS" >"$VENV/.pins"
fi
# cargo-zigbuild finds zig as `python -m ziglang` of the venv's python (first on PATH), and
# writes its compiler wrappers under the cache directory.
export PATH=$VENV/bin:$PATH
export ZIG_GLOBAL_CACHE_DIR=$CACHE/zig-cache
export ZIG_LOCAL_CACHE_DIR=$CACHE/zig-cache
export XDG_CACHE_HOME=$CACHE/xdg
log "zig $(python -m ziglang version), $(cargo-zigbuild --version)"

# The workspace's release profile carries no debug info; the strip below also drops the symbol
# table, since an operator copies the binary to every node. A panic's message still names the
# file and line; backtraces have no function names.
start=$(date +%s)
cargo zigbuild --release --target "$TRIPLE.$GLIBC" -p tela-gateway --bin tela
built=$TARGET_DIR/$TRIPLE/release/tela
log "built ${built#"$ROOT"/} in $(($(date +%s) - start)) s ($(du -h "$built" | cut -f1))"

# zig's link already leaves out the symbol table when there is no debug info; strip anyway, in
# case another toolchain version does not.
mkdir -p "$OUT_DIR"
if command -v strip >/dev/null; then
    strip --strip-all -o "$OUT_DIR/tela.tmp" "$built"
else
    cp "$built" "$OUT_DIR/tela.tmp"
fi
mv -f "$OUT_DIR/tela.tmp" "$OUT_DIR/tela"
log "${OUT_DIR#"$ROOT"/}/tela ($(du -h "$OUT_DIR/tela" | cut -f1)): $("$OUT_DIR/tela" --version)"
echo "$OUT_DIR/tela"
