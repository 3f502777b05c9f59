#!/usr/bin/env bash
# Regenerates the committed reports and plots of runtime-sim/results/ at the checked-out
# commit, seed 1 each: every scenario but the two 10,000-node ones, which take an hour and
# 13 GB alone on a machine (their commands are in README.md). About six minutes on two cores.
#
#     runtime-sim/results/regenerate.sh            # all of them
#     runtime-sim/results/regenerate.sh loss-100   # only those named
#
# Each run prints its summary; the hashes to expect are in README.md, and a report whose
# `hash` changed is a change in behaviour to explain in the commit that brings it.
set -euo pipefail
cd "$(dirname "$0")/../.."
results=runtime-sim/results
plots=$(mktemp -d)
trap 'rm -rf "$plots"' EXIT

scenarios=("$@")
if [ ${#scenarios[@]} -eq 0 ]; then
    scenarios=(loss-100 smoke-100 partition-heal lying-node federation-1k federation-1k-formed
        preemption-storm spinning-day)
fi

cargo build --release -p tela-sim
for s in "${scenarios[@]}"; do
    target/release/tela-sim run "$s" --seed 1 --report "$results/$s-seed1.json" --plot "$plots/"
done

# The plots kept: the 1k federations' spreading curves and bandwidth, and the spinning day.
for p in federation-1k-convergence federation-1k-bandwidth federation-1k-formed-convergence \
    federation-1k-formed-bandwidth spinning-day-spinning; do
    if [ -f "$plots/$p.svg" ]; then
        cp "$plots/$p.svg" "$results/"
    fi
done
