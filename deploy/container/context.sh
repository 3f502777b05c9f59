#!/usr/bin/env bash
# Prepares the build context of the `tela` container images, so that neither build pulls a
# base image:
#
#   deploy/container/context.sh [BINARY]    (default target/release-glibc2.17/tela)
#
# writes target/container/ (or $TELA_CONTAINER_CONTEXT) with
#   - rootfs/usr/local/bin/tela: the binary (build it with deploy/release/build.sh);
#   - rootfs/<path>: each shared library `ldd` names, at the same path (libc, libm, libdl,
#     libpthread, the dynamic loader), and glibc's name-service modules and librt where they
#     exist;
#   - rootfs/etc/ssl/certs/ca-certificates.crt: this machine's CA bundle (ca-certificates);
#   - rootfs/etc/passwd, group, nsswitch.conf: the user tela (65532), `hosts: files dns`;
#   - rootfs/tmp (mode 1777), rootfs/home, and home/: the empty home of user 65532;
#   - Containerfile and tela.def: copies of the two definitions in deploy/container/.
#
# The directory stands alone: copy it to a machine with podman, buildah or Apptainer and
# build there (see deploy/README.md, "Containers").
set -euo pipefail

[[ -n ${1:-} && -e $1 ]] && BIN=$(realpath -- "$1")
cd "$(dirname "$0")/../.."
ROOT=$PWD
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN:-${1:-$TARGET_DIR/release-glibc2.17/tela}}
CTX=${TELA_CONTAINER_CONTEXT:-$TARGET_DIR/container}
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

log() { echo "container/context: $*" >&2; }
die() { log "$*"; exit 1; }

[[ -x $BIN ]] || die "no tela binary at $BIN: build it with deploy/release/build.sh, or name one"
[[ -s $CA_BUNDLE ]] || die "no CA bundle at $CA_BUNDLE: install the ca-certificates package (apt-get install ca-certificates)"
command -v ldd >/dev/null || die "ldd not found (it comes with glibc: apt-get install libc-bin)"

rm -rf "$CTX"
mkdir -p "$CTX/rootfs/usr/local/bin" "$CTX/rootfs/etc/ssl/certs" "$CTX/rootfs/tmp" "$CTX/rootfs/home" "$CTX/home"
chmod 1777 "$CTX/rootfs/tmp"
chmod 0755 "$CTX/home"
install -m 0755 "$BIN" "$CTX/rootfs/usr/local/bin/tela"

# What the dynamic loader resolves on this machine: `libm.so.6 => /lib/x86_64-linux-gnu/libm.so.6
# (0x...)` and the loader itself, `/lib64/ld-linux-x86-64.so.2 (0x...)`. Copied with their
# symlinks resolved, at the paths the loader (copied too) searches.
ldd_out=$(ldd "$BIN") || die "ldd $BIN failed: $ldd_out"
if grep -q "not found" <<<"$ldd_out"; then
    die "libraries missing on this machine: $(grep 'not found' <<<"$ldd_out" | tr -s ' \t\n' ' ')"
fi
libs=$(awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' <<<"$ldd_out" | sort -u)
[[ -n $libs ]] || die "ldd named no libraries for $BIN: $ldd_out"
libc=$(grep '/libc\.so\.6$' <<<"$libs" || true)
[[ -n $libc ]] || die "ldd did not name libc.so.6 for $BIN"
# Name resolution (the node dials gateways by name): glibc before 2.34 loads `files` and `dns`
# from these modules; later ones have them built in and keep the files as small stubs. And
# librt, which NVIDIA's libnvidia-ml (bound in by `apptainer --nv` or the NVIDIA container
# toolkit, and opened at run time) may need.
for extra in libnss_files.so.2 libnss_dns.so.2 libresolv.so.2 librt.so.1; do
    [[ -e $(dirname "$libc")/$extra ]] && libs+=$'\n'"$(dirname "$libc")/$extra"
done
for lib in $libs; do
    mkdir -p "$CTX/rootfs$(dirname "$lib")"
    cp -L "$lib" "$CTX/rootfs$lib"
done

cp -L "$CA_BUNDLE" "$CTX/rootfs$CA_BUNDLE"
chmod 0644 "$CTX/rootfs$CA_BUNDLE"
cat >"$CTX/rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
tela:x:65532:65532:tela:/home/tela:/sbin/nologin
EOF
cat >"$CTX/rootfs/etc/group" <<'EOF'
root:x:0:
tela:x:65532:
EOF
cat >"$CTX/rootfs/etc/nsswitch.conf" <<'EOF'
passwd: files
group:  files
hosts:  files dns
EOF
cp deploy/container/Containerfile deploy/container/tela.def "$CTX/"

log "$CTX: tela ($(du -h "$BIN" | cut -f1)), $(echo "$libs" | wc -l) libraries ($(echo "$libs" | xargs -n1 basename | tr '\n' ' ')), CA bundle ($(grep -c 'BEGIN CERTIFICATE' "$CA_BUNDLE") certificates); $(du -sh "$CTX" | cut -f1) in all"
echo "$CTX"
