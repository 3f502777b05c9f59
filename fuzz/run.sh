#!/usr/bin/env bash
# Runs every fuzz target (or the ones named) for a time budget each, with cargo-fuzz.
#
# Usage: fuzz/run.sh [SECONDS] [TARGET...]
#
#   SECONDS  time per target (default 30)
#   TARGET   wire_decode, merge_laws, node_facade (default: all of them)
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`; set CARGO_FUZZ to use a binary that is not on
# PATH) and a C++ compiler for libFuzzer. On a stable toolchain it sets RUSTC_BOOTSTRAP=1,
# because the sanitizer flags cargo-fuzz passes are nightly-only. Without cargo-fuzz it prints
# a notice and exits 0; the seed corpus still runs under `cargo test -p tela-fuzz`.
#
# New inputs go to fuzz/target/corpus/<target>/ (ignored by git); the committed seeds in
# fuzz/corpus/<target>/ are only read. A crash stops the script with a non-zero status; the input
# is saved under fuzz/artifacts/<target>/ and cargo-fuzz prints how to reproduce it:
#
#   cargo fuzz run --features libfuzzer <target> fuzz/artifacts/<target>/crash-...
set -euo pipefail

budget="${1:-30}"
shift || true
if ! [[ "$budget" =~ ^[0-9]+$ ]] || [ "$budget" -eq 0 ]; then
    echo "usage: $0 [SECONDS] [TARGET...]  (SECONDS must be a positive integer)" >&2
    exit 2
fi
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(wire_decode merge_laws node_facade)
fi

cd "$(dirname "$0")/.."

cargo_fuzz=(cargo fuzz)
if [ -n "${CARGO_FUZZ:-}" ]; then
    cargo_fuzz=("$CARGO_FUZZ" fuzz)
elif ! cargo fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz not found: fuzzing skipped (install it with 'cargo install cargo-fuzz')" >&2
    exit 0
fi

if ! rustc --version | grep -q nightly; then
    export RUSTC_BOOTSTRAP=1
fi

"${cargo_fuzz[@]}" build --features libfuzzer

for target in "${targets[@]}"; do
    scratch="fuzz/target/corpus/$target"
    mkdir -p "$scratch"
    echo "== $target: ${budget}s" >&2
    if ! "${cargo_fuzz[@]}" run --features libfuzzer "$target" "$scratch" "fuzz/corpus/$target" \
        -- -max_total_time="$budget" -timeout=10 -print_final_stats=1; then
        echo "== $target failed: see the input under fuzz/artifacts/$target/" >&2
        exit 1
    fi
done
echo "== no crash in ${#targets[@]} target(s), ${budget}s each" >&2
