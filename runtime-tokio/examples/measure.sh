#!/usr/bin/env bash
# Measures, on loopback: a `tela node`'s idle memory, the time from its engine answering to
# the anchor seeing it SERVE (routable), and the time from SIGKILL of the node to the anchor
# seeing it unroutable. Every process is started here and killed on exit; every wait is
# bounded.
#
#   TELA_BIN=target/release/tela runtime-tokio/examples/measure.sh
#
# Times come from the log timestamps of the two processes (one machine, one clock).
set -euo pipefail
TELA=${TELA_BIN:-target/debug/tela}
[ -x "$TELA" ] || { echo "no tela binary at $TELA: cargo build -p tela-gateway, or set TELA_BIN" >&2; exit 1; }
DIR=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$DIR"; }
trap cleanup EXIT
export RUST_LOG=info TELA_JOIN_SECRET=measure-secret
unset TELA_JOIN TELA_CONTROL TELA_IDENTITY SLURM_JOB_ID

wait_for() { # file pattern seconds
  for _ in $(seq 1 $(( $3 * 20 ))); do grep -q -- "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  echo "timed out waiting for '$2' in $1" >&2; cat "$1" >&2; exit 1
}
ms() { awk -v a="$1" -v b="$2" -v d="$3" 'BEGIN { printf "%.*f", d, (b - a) * 1000 }'; }
ts() { # the timestamp of the first line of $1 matching $2, in seconds since 1970
  date -d "$(grep -m1 -- "$2" "$1" | cut -d' ' -f1)" +%s.%N
}

"$TELA" anchor --listen 127.0.0.1:0 --identity "$DIR/a.key" --control "$DIR/a.sock" 2> "$DIR/anchor.log" & PIDS+=($!)
wait_for "$DIR/anchor.log" "listening" 10
ADDR=$(grep -m1 listening "$DIR/anchor.log" | grep -o 'addr=[0-9.:]*' | cut -d= -f2)

# The engine answers 503 for its first 2 s (loading), so the moment it becomes ready is known:
# 2 s after it logs that it listens.
"$TELA" engine-sim --port 0 --model measured --startup-delay-ms 2000 > "$DIR/engine.out" 2> "$DIR/engine.log" & PIDS+=($!)
wait_for "$DIR/engine.out" "listening on" 10
URL=$(sed -n 's/^listening on //p' "$DIR/engine.out")

"$TELA" node --join "$ADDR" --backend-url "$URL" --identity "$DIR/n.key" --control "$DIR/n.sock" \
  --probe-interval 100ms 2> "$DIR/node.log" & NODE=$!; PIDS+=($NODE)
wait_for "$DIR/node.log" "identity" 10
NODE_ID=$(sed -n 's/.*identity \([0-9a-f]*\) from.*/\1/p' "$DIR/node.log" | head -1)
wait_for "$DIR/anchor.log" "node $NODE_ID is routable" 20
ready=$(ts "$DIR/node.log" "is ready, serving")
serve=$(ts "$DIR/anchor.log" "node $NODE_ID is routable")
answering=$(awk -v t="$(ts "$DIR/engine.log" "listening on")" 'BEGIN { printf "%.6f", t + 2.0 }')
echo "engine ready (its first 200) -> SERVE seen by the anchor: $(ms "$answering" "$serve" 1) ms (probe every 100 ms; at most one probe interval plus this)"
echo "node sees the engine ready -> SERVE seen by the anchor: $(ms "$ready" "$serve" 1) ms"

sleep 10
echo "node RSS after 10 s idle: $(grep VmRSS /proc/$NODE/status | awk '{print $2, $3}') (VmHWM $(grep VmHWM /proc/$NODE/status | awk '{print $2, $3}'))"

killed=$(date +%s.%N)
kill -9 "$NODE"
wait_for "$DIR/anchor.log" "node $NODE_ID is unroutable" 30
gone=$(ts "$DIR/anchor.log" "node $NODE_ID is unroutable")
echo "SIGKILL of the node -> unroutable at the anchor: $(ms "$killed" "$gone" 0) ms ($(grep -m1 "node $NODE_ID is unroutable" "$DIR/anchor.log" | sed 's/.*unroutable (\(.*\)).*/\1/'))"
