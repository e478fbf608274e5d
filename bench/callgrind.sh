#!/usr/bin/env bash
# Instructions per call under callgrind: the bare service (answering, and
# failing), and the closed and open (rejecting) paths of tower-circuit-breaker,
# each polled directly with no executor. Each mode runs at two call counts; the difference divided by
# the difference in calls is the per-call figure, free of start-up costs.
#
#   bench/callgrind.sh            # N1=100000 N2=200000
#   N1=50000 N2=100000 bench/callgrind.sh
#
# Needs valgrind (`apt-get install valgrind`). Callgrind counts instructions,
# not time: a clock read goes through the vDSO, which it does not follow, and
# an atomic read-modify-write counts as one instruction however long it
# stalls, so read these next to the timed report, not instead of it.
set -euo pipefail
cd "$(dirname "$0")/.."

n1=${N1:-100000}
n2=${N2:-200000}
target=${CARGO_TARGET_DIR:-target}
out="$target/callgrind"
bin="$target/release/callgrind-closed"
mkdir -p "$out"

cargo build --quiet --release -p tower-circuit-breaker-bench --bin callgrind-closed

ir() { # mode calls -> total Ir
  valgrind --tool=callgrind --callgrind-out-file="$out/$1.$2.out" "$bin" "$1" "$2" >/dev/null 2>&1
  awk '/^(summary|totals):/ { print $2; exit }' "$out/$1.$2.out"
}

per_call() { # mode -> Ir per call
  local a b
  a=$(ir "$1" "$n1")
  b=$(ir "$1" "$n2")
  awk -v a="$a" -v b="$b" -v n1="$n1" -v n2="$n2" 'BEGIN { printf "%.1f", (b - a) / (n2 - n1) }'
}

bare=$(per_call bare)
failing=$(per_call failing)
closed=$(per_call closed)
open=$(per_call open)
rc_closed=$(per_call recloser-closed)
rc_open=$(per_call recloser-open)
minus() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", a - b }'; }
echo "instructions per call (Ir), $n1 vs $n2 calls:"
echo "  bare service_fn, ready at once    $bare"
echo "  bare service_fn, failing at once  $failing"
echo "  closed                            $closed  (added over bare: $(minus "$closed" "$bare"))"
echo "  open, rejecting                   $open  (added over failing: $(minus "$open" "$failing"))"
echo "  recloser 1.4, closed              $rc_closed  (added over bare: $(minus "$rc_closed" "$bare"))"
echo "  recloser 1.4, open, rejecting     $rc_open  (added over failing: $(minus "$rc_open" "$failing"))"
echo
echo "closed path, Ir per call by function ($n2 calls; $out/closed.$n2.out):"
callgrind_annotate --show-percs=no "$out/closed.$n2.out" 2>/dev/null |
  awk -v n="$n2" '/file:function/ { on = 1; next }
    on && NF == 0 && shown { exit }
    on && $1 ~ /^[0-9][0-9,]*$/ { v = $1; gsub(",", "", v); $1 = ""; sub(/^ +/, "");
      sub(/ \[.*\]$/, ""); printf "  %7.1f  %s\n", v / n, $0; shown = 1 }' | head -25
